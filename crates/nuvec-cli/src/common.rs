//! What several subcommands share: the model argument, KV cache flags, threads, the prompt's
//! source, peak memory.

use clap::Args;
use nuvec_lm::cache::{CacheOptions, KvDtype};
use nuvec_lm::FinishReason;

use crate::default_model;

/// The model to load: `--model`, else the embedded default.
pub fn model_or_default(model: &Option<String>) -> Result<String, String> {
    match model {
        Some(m) if m.trim().is_empty() => {
            Err("--model is empty: name a model directory, a .gguf file or a Hugging Face repo id, or leave \
                 --model out for the default model"
                .into())
        }
        Some(m) => Ok(m.clone()),
        None => default_model::resolve(),
    }
}

/// Where a Hugging Face repo id comes from (a directory or a file is used as it is).
#[derive(Args, Debug, Clone)]
pub struct HubArgs {
    /// The branch, tag or commit of a Hugging Face repo id.
    #[arg(long, default_value = "main")]
    pub revision: String,
    /// Never download: a repo id must already be in the Hugging Face cache (as HF_HUB_OFFLINE=1).
    #[arg(long)]
    pub offline: bool,
}

impl HubArgs {
    /// `model` as a local path: a repo id not in the cache is downloaded into it (a bar per file
    /// on a terminal). `HF_ENDPOINT`, `HF_TOKEN` and `HF_HUB_OFFLINE` are read as huggingface_hub
    /// reads them.
    pub fn fetch(&self, model: &str) -> Result<String, String> {
        let mut options = nuvec_lm::hub::HubOptions::from_env();
        options.revision = self.revision.clone();
        options.offline |= self.offline;
        options.progress = crate::progress::Bar::on_terminal().map(|bar| bar.download_callback());
        let path = nuvec_lm::hub::resolve_with(model, &options).map_err(|e| e.to_string())?;
        Ok(path.display().to_string())
    }
}

/// Which model, how it is found and loaded: `--model` (else the embedded default), its source,
/// and an adapter.
#[derive(Args, Debug, Clone)]
pub struct LoadArgs {
    /// Model directory, Hugging Face repo id (downloaded when not in the cache), or .gguf file
    /// (default: SmolLM2-135M-Instruct, see scripts/get-default-model.sh).
    #[arg(long)]
    pub model: Option<String>,
    #[command(flatten)]
    pub hub: HubArgs,
    /// An mlx-lm adapter folder (adapters.safetensors, adapter_config.json: what `mlx_lm.lora`
    /// writes): its LoRA or DoRA terms are applied without touching the model's weights.
    #[arg(long)]
    pub adapter_path: Option<std::path::PathBuf>,
}

impl LoadArgs {
    /// The model named: `--model`, else the embedded default.
    pub fn name(&self) -> Result<String, String> {
        model_or_default(&self.model)
    }

    /// Loads `model` (a name as [`LoadArgs::name`] gives) on `device`: downloaded first when it
    /// is a repo id not in the cache ([`HubArgs::fetch`]), the adapter applied, a bar on a
    /// terminal while a load that lasts runs.
    pub fn load(&self, model: &str, device: nuvec::Device) -> Result<(nuvec_lm::Model, nuvec_lm::Tokenizer), String> {
        self.load_as(model, device, vec![], false, None)
    }

    /// [`LoadArgs::load`] with `served` adapters `(name, folder)` that requests choose by name
    /// ([`nuvec_lm::LoadOptions::served_adapters`]), and the checkpoint's multi-token-prediction
    /// head when `mtp` ([`nuvec_lm::LoadOptions::mtp`]), only this rank's stage of `pipeline` when
    /// given ([`nuvec_lm::LoadOptions::pipeline`]).
    pub fn load_as(
        &self,
        model: &str,
        device: nuvec::Device,
        served: Vec<(String, std::path::PathBuf)>,
        mtp: bool,
        pipeline: Option<nuvec_lm::Pipeline>,
    ) -> Result<(nuvec_lm::Model, nuvec_lm::Tokenizer), String> {
        let options = nuvec_lm::LoadOptions {
            device,
            adapter_path: self.adapter_path.clone(),
            served_adapters: served,
            progress: crate::progress::Bar::on_terminal().map(|bar| bar.load_callback()),
            mtp,
            pipeline,
        };
        nuvec_lm::load_with(&self.hub.fetch(model)?, &options).map_err(|e| e.to_string())
    }
}

/// How a model runs over the ranks `mpirun -n N nuvec …` starts (a build with the `mpi`
/// feature): a pipeline of layer ranges, or every layer split.
#[derive(Args, Debug, Clone)]
pub struct SplitArgs {
    /// Run as one stage of a pipeline over the ranks of `mpirun -n N nuvec … --pipeline`: each
    /// rank loads and runs only its layers, rank 0 the last ones and the head, and prints. A
    /// checkpoint folder on the CPU; the prompt comes from flags or files (mpirun gives stdin to
    /// rank 0 only).
    // Speculation on a split model is refused where it is asked for (`generate`, the Batcher).
    #[arg(long)]
    pub pipeline: bool,
    /// The layers of each rank for --pipeline: `even` (the extra layers to the low ranks),
    /// `memory` (in proportion to each rank's free memory), or one count per rank, rank 0 first
    /// (rank 0 runs the last layers): `10,20`. Each rank's share is checked against its free
    /// memory before any rank loads.
    #[arg(long, value_name = "even|memory|N,N,..", requires = "pipeline")]
    pub pipeline_split: Option<String>,
    /// Split every layer across the ranks of `mpirun -n N nuvec … --tensor-parallel` instead
    /// (mlx-lm's sharding): each rank keeps its share of the attention heads, MLP units and
    /// experts' units, and the partial products are summed over the ranks.
    #[arg(long, conflicts_with = "pipeline")]
    pub tensor_parallel: bool,
}

impl SplitArgs {
    /// Whether the model runs over several ranks.
    pub fn any(&self) -> bool {
        self.pipeline || self.tensor_parallel
    }

    /// The pipeline to load as (joining the launcher's group), with --pipeline.
    pub fn pipeline(&self) -> Result<Option<nuvec_lm::Pipeline>, Box<dyn std::error::Error>> {
        if !self.pipeline {
            return Ok(None);
        }
        let group = nuvec::distributed::init(true)?;
        let split = nuvec_lm::Split::parse(self.pipeline_split.as_deref().unwrap_or("even"))?;
        Ok(Some(nuvec_lm::Pipeline { group, split }))
    }

    /// Keeps this rank's share of every layer of `model`, with --tensor-parallel.
    pub fn shard(&self, model: &mut nuvec_lm::Model) -> Result<(), Box<dyn std::error::Error>> {
        if self.tensor_parallel {
            model.shard(&nuvec::distributed::init(true)?)?;
        }
        Ok(())
    }
}

/// The context flags (as llama.cpp's `--ctx-size`), beside mlx-lm's.
#[derive(Args, Debug, Clone)]
pub struct ContextArgs {
    /// Most positions (prompt and answer) a generation may reach; default the model's context
    /// (max_position_embeddings). A longer prompt is an error; an answer that fills it ends.
    #[arg(short = 'c', long)]
    pub ctx_size: Option<usize>,
    /// Run past the model's trained context (its output degrades there).
    #[arg(long)]
    pub allow_past_context: bool,
}

/// Why generation ended, in words.
pub fn describe_finish(reason: &FinishReason) -> String {
    match reason {
        FinishReason::EndOfSequence => "end of sequence".to_string(),
        FinishReason::Length => "max tokens".to_string(),
        FinishReason::ConstraintUnfinished => {
            "max tokens, inside the constraint (the output does not meet it)".to_string()
        }
        FinishReason::ContextLength(n) => format!("length (the context of {n} positions is full)"),
        other => format!("{other:?}"),
    }
}

/// The device `--device` names: `cpu` (the default) or `cuda` / `cuda:N` (an NVIDIA GPU; needs a
/// build with `--features cuda` and a usable GPU, else an error saying which is missing).
pub fn parse_device(name: &str) -> Result<nuvec::Device, String> {
    let ordinal = match name {
        "cpu" => return Ok(nuvec::Device::Cpu),
        "cuda" | "gpu" => 0,
        other => match other.strip_prefix("cuda:").and_then(|n| n.parse::<usize>().ok()) {
            Some(n) => n,
            None => return Err(format!("--device {other:?}: expected cpu, cuda or cuda:N")),
        },
    };
    cuda_device(ordinal)
}

#[cfg(feature = "cuda")]
fn cuda_device(ordinal: usize) -> Result<nuvec::Device, String> {
    nuvec::backends::cuda::init(ordinal).map_err(|e| format!("--device cuda:{ordinal}: {e}"))?;
    Ok(nuvec::Device::Cuda(ordinal))
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(ordinal: usize) -> Result<nuvec::Device, String> {
    Err(format!(
        "--device cuda:{ordinal}: this nuvec was built without GPU support; rebuild with \
         `cargo build --release -p nuvec-cli --features cuda`"
    ))
}

/// KV cache flags (as mlx_lm.generate and mlx_lm.cache_prompt have them).
#[derive(Args, Debug, Clone)]
pub struct KvArgs {
    /// Bound the KV cache to this many positions (a rotating cache, keeping the first 4).
    #[arg(long)]
    pub max_kv_size: Option<usize>,
    /// Quantize the KV cache to this many bits.
    #[arg(long)]
    pub kv_bits: Option<usize>,
    /// Group size of the KV cache quantization.
    #[arg(long, default_value_t = 64)]
    pub kv_group_size: usize,
    /// Start quantizing the KV cache once it holds this many positions.
    #[arg(long, default_value_t = 5000)]
    pub quantized_kv_start: usize,
    /// Store keys and values as f32, f16 or bf16 (default: the model's own type, f16 for GGUF).
    #[arg(long, value_parser = parse_kv_dtype)]
    pub kv_dtype: Option<KvDtype>,
}

pub(crate) fn parse_kv_dtype(name: &str) -> Result<KvDtype, String> {
    KvDtype::parse(name).map_err(|e| e.to_string())
}

impl KvArgs {
    /// The cache these flags ask for.
    pub fn options(&self) -> CacheOptions {
        CacheOptions {
            max_kv_size: self.max_kv_size,
            kv_bits: self.kv_bits,
            kv_group_size: self.kv_group_size,
            quantized_kv_start: self.quantized_kv_start,
            kv_dtype: self.kv_dtype,
            ..Default::default()
        }
    }
}

/// Peak resident memory of this process, in bytes (Linux; 0 elsewhere).
pub fn peak_memory() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// `sampler` checked, with a warning on stderr for each setting it ignores (`note` follows
/// each warning: what the setting applies to).
pub fn checked_sampler(sampler: nuvec_lm::Sampler, note: &str) -> Result<nuvec_lm::Sampler, nuvec_lm::Error> {
    sampler.validate()?;
    for ignored in sampler.ignored_settings() {
        eprintln!("warning: {ignored}{note}");
    }
    Ok(sampler)
}

/// Worker threads of the CPU kernels (`-t`, as llama.cpp's tools): every command that computes
/// takes it.
#[derive(Args, Debug, Clone, Copy)]
pub struct ThreadArgs {
    /// Worker threads for the CPU kernels (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
}

impl ThreadArgs {
    /// Sets the CPU kernels' threads where asked (before anything computes).
    pub fn apply(&self) -> Result<(), String> {
        match self.threads {
            Some(0) => Err("--threads must be at least 1".into()),
            Some(n) => nuvec::backends::cpu::set_num_threads(n).map_err(|e| format!("--threads {n}: {e}")),
            None => Ok(()),
        }
    }
}

/// The prompt's text: `-f FILE`'s contents when given (as is), else `-p`'s text with `\n` and
/// `\t` expanded when `expand`, stdin for `-`.
pub fn read_prompt(prompt: &str, file: Option<&std::path::Path>, expand: bool) -> Result<String, String> {
    if let Some(path) = file {
        return std::fs::read_to_string(path)
            .map_err(|e| format!("--file {}: cannot read the prompt: {e}", path.display()));
    }
    let text = if expand { prompt.replace("\\n", "\n").replace("\\t", "\t") } else { prompt.to_string() };
    if text == "-" {
        let mut all = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut all)
            .map_err(|e| format!("reading the prompt from stdin: {e}"))?;
        return Ok(all);
    }
    Ok(text)
}
