//! `load`: a checkpoint directory (or cached Hugging Face repo id) to a model and its tokenizer.

use std::path::{Path, PathBuf};

use nuvec::Device;

use crate::adapter::Adapter;
use crate::config::Config;
use crate::models::Model;
use crate::parallel::Pipeline;
use crate::quantization::Quantization;
use crate::tokenizer::Tokenizer;
use crate::weights::Weights;
use crate::{hub, Error, Result};

/// Loads the model and tokenizer at `model`: a checkpoint directory, a `.gguf` file, or a repo id
/// in the Hugging Face cache or downloaded into it (`hub::resolve`).
pub fn load(model: &str) -> Result<(Model, Tokenizer)> {
    load_on(model, Device::Cpu)
}

/// How [`load_with`] loads: where the weights go, and an adapter to apply.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Where every weight goes (and the caches the model makes).
    pub device: Device,
    /// An mlx-lm adapter folder (`adapters.safetensors`, `adapter_config.json`): its LoRA or
    /// DoRA terms are applied to the projections it names, the base weights untouched
    /// (mlx-lm's `load(path, adapter_path=…)`).
    pub adapter_path: Option<PathBuf>,
    /// Adapters a request can choose by name (vLLM's `--lora-modules`): each `(name, folder)`
    /// is an mlx-lm adapter folder whose terms the projections hold beside the base weights,
    /// applied only to the rows of sequences that choose it ([`crate::GenerateOptions::adapter`]
    /// in a [`crate::Batcher`], [`crate::StepBatch::push_adapted`]); the others run the base
    /// model. Names must be distinct and non-empty; not together with `adapter_path`.
    pub served_adapters: Vec<(String, PathBuf)>,
    /// Told as the checkpoint's tensors are read (safetensors checkpoints; a GGUF file reports
    /// nothing).
    pub progress: Option<LoadProgress>,
    /// Also load the checkpoint's multi-token-prediction head (Qwen3.5's `mtp.*` tensors, which
    /// are otherwise skipped as mlx-lm skips them), for speculative decoding with
    /// [`crate::speculative::MtpHead`]. A checkpoint without one is an error naming the fix.
    pub mtp: bool,
    /// Load only this rank's stage of a pipeline ([`crate::parallel`]): its layers' tensors, and
    /// the embeddings or the head where the stage runs them. A checkpoint folder on the CPU,
    /// without adapters or a multi-token-prediction head.
    pub pipeline: Option<Pipeline>,
}

/// A load-progress callback ([`LoadOptions::progress`]): `(tensors read, tensors in the
/// checkpoint)`, the last report with both equal.
#[derive(Clone)]
pub struct LoadProgress(pub std::sync::Arc<LoadProgressFn>);

/// What a [`LoadProgress`] calls: `(tensors read, tensors in the checkpoint)`.
pub type LoadProgressFn = dyn Fn(usize, usize) + Send + Sync;

impl std::fmt::Debug for LoadProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LoadProgress(..)")
    }
}

/// [`load`] with every weight on `device` (and the caches the model makes there too).
pub fn load_on(model: &str, device: Device) -> Result<(Model, Tokenizer)> {
    load_with(model, &LoadOptions { device, ..Default::default() })
}

/// [`load`] as `options` say.
pub fn load_with(model: &str, options: &LoadOptions) -> Result<(Model, Tokenizer)> {
    let path = hub::resolve(model)?;
    let device = options.device;
    if path.is_file() && path.extension().is_some_and(|e| e == "gguf") {
        if options.pipeline.is_some() {
            return Err(Error::Unsupported(format!(
                "a pipeline over {}: a GGUF file is converted whole at load, so every rank would read every \
                 tensor; convert it once (`nuvec convert --model {} --out DIR`) and pipeline DIR",
                path.display(),
                path.display()
            )));
        }
        if let Some(adapter) = options.adapter_path.as_ref().or(options.served_adapters.first().map(|a| &a.1)) {
            return Err(Error::Unsupported(format!(
                "adapter {} with a GGUF file: adapters apply to safetensors checkpoints (mlx-lm's); \
                 convert the GGUF with `nuvec convert` first",
                adapter.display()
            )));
        }
        let (mut model, tokenizer) = crate::gguf::load_gguf_as(&path, device, options.mtp)?;
        model.set_fingerprint(fingerprint(&[path])?);
        return Ok((model, tokenizer));
    }
    let model = load_model_with(&path, options)?;
    finish_load(&path, model)
}

/// FNV-1a over each file's size, its first and last 64 KiB: cheap, and different for any two
/// checkpoints that differ in their headers or the weights at either end of a file.
fn fingerprint(files: &[std::path::PathBuf]) -> Result<String> {
    use std::io::{Read, Seek, SeekFrom};
    const SAMPLE: u64 = 64 << 10;
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            hash = (hash ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for path in files {
        let io = |source| Error::Io { path: path.display().to_string(), source };
        let mut f = std::fs::File::open(path).map_err(io)?;
        let size = f.metadata().map_err(io)?.len();
        eat(&size.to_le_bytes());
        let mut buf = vec![0u8; SAMPLE.min(size) as usize];
        f.read_exact(&mut buf).map_err(io)?;
        eat(&buf);
        f.seek(SeekFrom::Start(size - SAMPLE.min(size))).map_err(io)?;
        f.read_exact(&mut buf).map_err(io)?;
        eat(&buf);
    }
    Ok(format!("{hash:016x}"))
}

/// Loads the model and tokenizer of checkpoint directory `dir`.
pub fn load_dir(dir: &Path) -> Result<(Model, Tokenizer)> {
    load_dir_on(dir, Device::Cpu)
}

/// [`load_dir`] with every weight on `device`.
pub fn load_dir_on(dir: &Path, device: Device) -> Result<(Model, Tokenizer)> {
    finish_load(dir, load_model_on(dir, device)?)
}

/// The tokenizer beside `model`, and the model told its end and newline ids.
fn finish_load(dir: &Path, model: Model) -> Result<(Model, Tokenizer)> {
    let tokenizer = Tokenizer::load(dir, model.eos_token_ids())?;
    let mut model = model;
    model.set_eos_token_ids(tokenizer.eos_token_ids().to_vec());
    model.set_newline_token_ids(tokenizer.encode("\n", false)?);
    // The tokenizer's JSON and the load's other transient buffers leave the resident set.
    nuvec::backends::cpu::release_free_memory();
    Ok((model, tokenizer))
}

/// Loads only the model of checkpoint directory `dir`.
pub fn load_model(dir: &Path) -> Result<Model> {
    load_model_on(dir, Device::Cpu)
}

/// [`load_model`] with every weight on `device`.
pub fn load_model_on(dir: &Path, device: Device) -> Result<Model> {
    load_model_with(dir, &LoadOptions { device, ..Default::default() })
}

/// [`load_model`] as `options` say.
pub fn load_model_with(dir: &Path, options: &LoadOptions) -> Result<Model> {
    let config = Config::load(dir)?;
    let quantization = Quantization::from_config(&config)?;
    let mut weights = Weights::open(dir, quantization)?.on_device(options.device);
    if let Some(progress) = &options.progress {
        weights = weights.with_progress(progress.clone());
    }
    let mut files = vec![dir.join("config.json")];
    if let Some(path) = &options.adapter_path {
        let adapter = Adapter::open(path)?;
        files.extend(adapter.files());
        weights = weights.with_adapter(adapter);
    }
    weights = weights.with_served_adapters(open_served(options)?);
    let built = match &options.pipeline {
        None => Model::from_config_with(&config, &weights, options.mtp),
        Some(pipeline) => {
            refuse_in_pipeline(options)?;
            Model::from_config_pipelined(&config, &weights, pipeline)
        }
    };
    weights.report_done();
    let mut model = built?;
    for adapter in weights.adapter().into_iter().chain(weights.served_adapters()) {
        adapter.check_all_taken()?;
    }
    model.set_adapter_names(options.served_adapters.iter().map(|(name, _)| name.clone()).collect());
    files.extend(weights.files());
    model.set_fingerprint(fingerprint(&files)?);
    Ok(model)
}

/// What a pipeline stage does not load with (mlx-lm refuses adapters in distributed mode too).
fn refuse_in_pipeline(options: &LoadOptions) -> Result<()> {
    let what = match () {
        _ if options.adapter_path.is_some() || !options.served_adapters.is_empty() => "adapters",
        _ if options.mtp => "a multi-token-prediction head",
        _ => return Ok(()),
    };
    Err(Error::Unsupported(format!(
        "{what} on a pipelined model are not supported: fuse an adapter into the base first (`nuvec fuse`), \
         and speculate without a pipeline"
    )))
}

/// The served adapters of `options`, opened, their names checked.
fn open_served(options: &LoadOptions) -> Result<Vec<Adapter>> {
    let served = &options.served_adapters;
    if let (Some(path), false) = (&options.adapter_path, served.is_empty()) {
        return Err(Error::Unsupported(format!(
            "adapter {} applied to every request beside served adapters: serve the base model with each adapter \
             served, or fuse it into the base first (`nuvec fuse`)",
            path.display()
        )));
    }
    for (i, (name, path)) in served.iter().enumerate() {
        if name.trim().is_empty() {
            return Err(Error::Invalid(format!("the served adapter at {} has an empty name", path.display())));
        }
        if served[..i].iter().any(|(other, _)| other == name) {
            return Err(Error::Invalid(format!("two served adapters are named {name:?}: give each its own name")));
        }
    }
    served.iter().map(|(_, path)| Adapter::open(path)).collect()
}
