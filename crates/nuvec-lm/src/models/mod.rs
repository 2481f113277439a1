//! Model families, one file each, and the [`Model`] they are loaded as.

mod gemma4;
mod gpt_oss;
mod llama;
mod qwen2;
mod qwen3;
pub(crate) mod qwen3_5;
mod qwen3_5_mtp;
mod qwen3_moe;
mod unused;

use nuvec::{Array, DType, Device};

use crate::adapter::{rows, AdapterId};
use crate::cache::{CacheOptions, KvDtype, LayerCache};
use crate::config::Config;
use crate::layers::RmsNorm;
use crate::parallel::{Pipeline, Shard, Split, Stage};
use crate::step::StepBatch;
use crate::weights::Weights;
use crate::{Error, Result};

/// What a model family implements.
pub trait Architecture: Send + Sync {
    /// Runs the step's rows (every sequence's new tokens) through the decoder, extending each
    /// sequence's caches; returns the final normalized hidden states `[rows, hidden]`.
    fn hidden(&self, step: &mut StepBatch) -> Result<Array>;
    /// The output head: `[L, hidden] -> [L, vocab]` logits.
    fn logits(&self, hidden: &Array) -> Result<Array>;
    /// Decoder layers (one cache each).
    fn num_layers(&self) -> usize;

    // ---- Gated DeltaNet ----
    /// Whether layer `i` keeps a recurrent state ([`crate::cache::RecurrentCache`]) instead of
    /// keys and values. Hybrid models (Qwen3.5) say so for their linear-attention layers.
    fn is_recurrent(&self, _layer: usize) -> bool {
        false
    }

    // Gemma 4

    /// The caches the model makes itself (storing `kv_dtype`), as mlx-lm's `make_cache` (Gemma 4: rotating caches
    /// for sliding-window layers, none for KV-shared layers); `None` means one plain cache per
    /// layer, or the kind the generation's options ask for.
    fn own_cache(&self, _kv_dtype: nuvec::DType) -> Option<Vec<LayerCache>> {
        None
    }

    /// Rows of the output head, when config.json's top-level `vocab_size` is not it (a
    /// multimodal checkpoint's language model); `None` means it is.
    fn vocab_size(&self) -> Option<usize> {
        None
    }

    // ---- Multi-token prediction ----
    /// Whether the checkpoint's multi-token-prediction head was loaded
    /// ([`crate::LoadOptions::mtp`]).
    fn has_mtp(&self) -> bool {
        false
    }

    /// The multi-token-prediction head's hidden states `[rows, hidden]` for the step's rows
    /// (one sequence, its cache the head's one layer): row `r` from `target[r]`, a final hidden
    /// state of the target (or the head's own previous output), and the token after it.
    fn mtp_hidden(&self, _target: &Array, _step: &mut StepBatch) -> Result<Array> {
        Err(no_mtp())
    }

    // ---- Pipeline parallelism ----
    /// This rank's stage, when the model was loaded as one ([`crate::parallel`]).
    fn stage(&self) -> Option<&Stage> {
        None
    }

    // ---- Tensor parallelism ----
    /// This rank's share of every layer ([`Model::shard`]); `None` for a family not split yet.
    fn shard(&self, _shard: &Shard) -> Option<Result<Box<dyn Architecture>>> {
        None
    }

    /// This rank's place, when the model was split across ranks.
    fn sharded(&self) -> Option<&Shard> {
        None
    }

    /// This rank's stage of a pipeline, from the whole model ([`Model::pipeline`]); `None` for
    /// a family not pipelined yet.
    fn pipeline(&self, _group: &nuvec::distributed::Group, _split: &Split) -> Option<Result<Box<dyn Architecture>>> {
        None
    }
}

/// The error of a model asked for a multi-token-prediction head it has not loaded.
pub(crate) fn no_mtp() -> Error {
    Error::Unsupported(
        "this model has no multi-token-prediction head loaded: load a checkpoint that ships one (Qwen3.5's \
         mtp.* tensors) with LoadOptions::mtp (the CLI's --mtp)"
            .into(),
    )
}

/// Runs `h` through `layers` in order (`forward(layer, h, step, i)` for layer `i`): the decoder
/// loop every family shares, after checking every sequence has one cache per layer.
pub(crate) fn through_layers<L>(
    layers: &[L],
    step: &mut StepBatch,
    mut h: Array,
    forward: impl Fn(&L, &Array, &mut StepBatch, usize) -> Result<Array>,
) -> Result<Array> {
    step.check_layers(layers.len(), "layers")?;
    for (i, layer) in layers.iter().enumerate() {
        h = forward(layer, &h, step, i)?;
    }
    Ok(h)
}

/// The residual stream through blocks that each return it with the next block's input norm
/// applied (the last block: `final_norm`), so that every residual add runs with the norm after
/// it; returns the stream after the last block and its normed form (what a pipeline stage passes
/// on, and what the head reads).
pub(crate) fn through_normed_layers<L>(
    layers: &[L],
    step: &mut StepBatch,
    mut h: Array,
    input_norm: impl Fn(&L) -> &RmsNorm,
    final_norm: &RmsNorm,
    forward: impl Fn(&L, &Array, &Array, &RmsNorm, &mut StepBatch, usize) -> Result<(Array, Array)>,
) -> Result<(Array, Array)> {
    step.check_layers(layers.len(), "layers")?;
    let Some(first) = layers.first() else {
        let normed = final_norm.forward(&h)?;
        return Ok((h, normed));
    };
    let mut normed = input_norm(first).forward(&h)?;
    for (i, layer) in layers.iter().enumerate() {
        let next_norm = layers.get(i + 1).map_or(final_norm, &input_norm);
        (h, normed) = forward(layer, &h, &normed, next_norm, step, i)?;
    }
    Ok((h, normed))
}

/// Why Gemma 4 is refused as a pipeline.
const GEMMA4_NOT_PIPELINED: &str = "Gemma 4 is not pipelined: its per-layer inputs and shared key/value layers \
                                    would cross stages (mlx-lm does not pipeline it either)";

/// The families split across ranks (pipelined or by tensors), for the errors of the others.
const SPLIT_FAMILIES: &str = "llama, mistral, qwen2, qwen3, qwen3_moe, qwen3_5, qwen3_5_moe and gpt_oss";

/// The model types this build loads.
pub const SUPPORTED_MODEL_TYPES: &[&str] =
    &["llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_moe", "gemma4", "gemma4_text", "gpt_oss"];

/// A loaded language model.
pub struct Model {
    arch: Box<dyn Architecture>,
    model_type: String,
    vocab_size: usize,
    eos_token_ids: Vec<u32>,
    newline_token_ids: Vec<u32>,
    fingerprint: String,
    device: Device,
    /// What caches store unless asked otherwise.
    kv_dtype: KvDtype,
    /// The float type mlx-lm computes the checkpoint in ([`Weights::compute_dtype`]; f32 for a
    /// custom architecture), given to the backends while the model runs.
    compute_dtype: DType,
    /// Positions the model was trained for (`max_position_embeddings`, a GGUF's
    /// `context_length`), when the checkpoint says.
    context_length: Option<usize>,
    /// The served adapters' names, by [`AdapterId`] ([`crate::LoadOptions::served_adapters`]).
    adapter_names: Vec<String>,
}

/// Which rows' logits a step gives.
#[derive(Clone, Copy)]
enum Picked<'a> {
    /// Each sequence's last row.
    Last,
    /// Every row.
    All,
    /// The last `counts[i]` rows of sequence `i`.
    LastOf(&'a [usize]),
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("model_type", &self.model_type).field("layers", &self.num_layers()).finish()
    }
}

impl Model {
    /// Builds the family `config.json` names from `weights`.
    pub fn from_config(config: &Config, weights: &Weights) -> Result<Self> {
        Self::from_config_with(config, weights, false)
    }

    /// [`Model::from_config`], with the checkpoint's multi-token-prediction head when `mtp`.
    pub(crate) fn from_config_with(config: &Config, weights: &Weights, mtp: bool) -> Result<Self> {
        let model_type = config.str("model_type")?.to_string();
        config.check_ranges()?;
        if mtp && !matches!(model_type.as_str(), "qwen3_5" | "qwen3_5_moe") {
            return Err(Error::Unsupported(format!(
                "{}: model_type {model_type:?} has no multi-token-prediction head nuvec runs (Qwen3.5's mtp.* is \
                 the one); speculate with a draft model or prompt lookup instead",
                config.file()
            )));
        }
        let arch: Box<dyn Architecture> = match model_type.as_str() {
            "llama" | "mistral" => Box::new(llama::Llama::load(config, weights)?),
            "qwen2" => Box::new(qwen2::load(config, weights)?),
            "qwen3" => Box::new(qwen3::load(config, weights)?),
            "qwen3_moe" => Box::new(qwen3_moe::load(config, weights)?),
            "qwen3_5" | "qwen3_5_moe" => Box::new(qwen3_5::Qwen3_5::load(config, weights, mtp)?),
            "gemma4_text" => Box::new(gemma4::Gemma4::load_text(config, weights)?),
            "gemma4" => Box::new(gemma4::Gemma4::load_multimodal(config, weights)?),
            "gpt_oss" => Box::new(gpt_oss::GptOss::load(config, weights)?),
            other => {
                return Err(Error::Unsupported(format!(
                    "{}: model_type {other:?} is not one nuvec loads ({})",
                    config.file(),
                    SUPPORTED_MODEL_TYPES.join(", ")
                )))
            }
        };
        Self::assemble(config, weights, model_type, arch, |_| false)
    }

    /// This rank's stage of `pipeline` from `config` and `weights` (which it reads only the
    /// stage's tensors of): the families on the Llama decoder, and gpt-oss.
    pub(crate) fn from_config_pipelined(config: &Config, weights: &Weights, pipeline: &Pipeline) -> Result<Self> {
        let model_type = config.str("model_type")?.to_string();
        config.check_ranges()?;
        let family = match model_type.as_str() {
            "llama" | "mistral" => Some(llama::family(config)?),
            "qwen2" => Some(qwen2::family()),
            "qwen3" => Some(qwen3::family()),
            "qwen3_moe" => Some(qwen3_moe::family()),
            "gpt_oss" | "qwen3_5" | "qwen3_5_moe" => None,
            "gemma4" | "gemma4_text" => {
                return Err(Error::Unsupported(format!("{}: {GEMMA4_NOT_PIPELINED}", config.file())))
            }
            other => {
                return Err(Error::Unsupported(format!(
                    "{}: pipeline parallelism for model_type {other:?} is not built yet ({SPLIT_FAMILIES} are)",
                    config.file()
                )))
            }
        };
        // A multimodal checkpoint keeps the language model's sizes in text_config.
        let text = config.text_config()?;
        let (layers, hidden) = (text.usize("num_hidden_layers")?, text.usize("hidden_size")?);
        let vocab = text.usize("vocab_size")?;
        // Every rank checks that each rank's share fits its free memory before any loads.
        let bytes = weights.files().iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
        let split = Split::Layers(pipeline.split.plan(&pipeline.group, layers, Some(bytes))?);
        let stage = Stage::new(&pipeline.group, &split, layers, hidden, vocab, weights.device())?;
        let part = Some(stage.clone());
        let arch: Box<dyn Architecture> = match family {
            Some(family) => Box::new(llama::Llama::load_stage(config, weights, &family, part)?),
            None if model_type == "gpt_oss" => Box::new(gpt_oss::GptOss::load_stage(config, weights, part)?),
            None => Box::new(qwen3_5::Qwen3_5::load_stage(config, weights, false, part)?),
        };
        Self::assemble(config, weights, model_type, arch, |name| stage.elsewhere(name))
    }

    /// The model of `arch`, built from `config` and `weights`; tensors it left unread are refused
    /// unless `elsewhere` says another pipeline stage reads them.
    fn assemble(
        config: &Config,
        weights: &Weights,
        model_type: String,
        arch: Box<dyn Architecture>,
        elsewhere: impl Fn(&str) -> bool,
    ) -> Result<Self> {
        let vocab_size = match arch.vocab_size() {
            Some(v) => v,
            None => match config.opt_usize("vocab_size")? {
                Some(v) => v,
                // A multimodal wrapper keeps the language model's fields in text_config.
                None => config.text_config()?.usize("vocab_size")?,
            },
        };
        unused::refuse_unused(&model_type, weights, elsewhere)?;
        let compute_dtype = weights.compute_dtype();
        let context_length = match config.opt_usize("max_position_embeddings")? {
            Some(n) => Some(n),
            None if config.get("text_config").is_some() => {
                config.text_config()?.opt_usize("max_position_embeddings")?
            }
            None => None,
        };
        if context_length == Some(0) {
            return Err(config.error("max_position_embeddings", "= 0: a model needs at least one position"));
        }
        Ok(Model {
            arch,
            model_type,
            vocab_size,
            eos_token_ids: config.eos_token_ids_within(vocab_size)?,
            newline_token_ids: vec![],
            fingerprint: String::new(),
            device: weights.device(),
            kv_dtype: KvDtype::of(compute_dtype),
            compute_dtype,
            context_length,
            adapter_names: vec![],
        })
    }

    /// A model from any architecture (custom or scripted), with its vocabulary size and
    /// end-of-sequence ids.
    pub fn new(arch: Box<dyn Architecture>, model_type: &str, vocab_size: usize, eos_token_ids: Vec<u32>) -> Self {
        let fingerprint = String::new();
        let (model_type, newline_token_ids, device) = (model_type.to_string(), vec![], Device::Cpu);
        let (kv_dtype, compute_dtype) = (KvDtype::F32, DType::F32);
        Model {
            arch,
            model_type,
            vocab_size,
            eos_token_ids,
            newline_token_ids,
            fingerprint,
            device,
            kv_dtype,
            compute_dtype,
            context_length: None,
            adapter_names: vec![],
        }
    }

    /// Positions the model was trained for (`max_position_embeddings`), if the checkpoint says:
    /// generation refuses a prompt that does not fit and ends when it is full
    /// ([`crate::GenerateOptions::context_length`]).
    pub fn context_length(&self) -> Option<usize> {
        self.context_length
    }

    /// Sets (or clears) the context the model was trained for.
    pub fn set_context_length(&mut self, positions: Option<usize>) {
        self.context_length = positions;
    }

    /// Where the weights are (and where the caches' keys and values go).
    pub fn device(&self) -> Device {
        self.device
    }

    /// Sets the device [`Model::device`] reports, for a custom architecture that put its own
    /// weights there ([`Model::from_config`] takes it from the weights).
    pub fn set_device(&mut self, device: Device) {
        self.device = device;
    }

    /// `config.json`'s `model_type`.
    pub fn model_type(&self) -> &str {
        &self.model_type
    }

    /// Rows of the output head.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// End-of-sequence ids from config.json / generation_config.json.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    /// Decoder layers (a pipeline stage's own).
    pub fn num_layers(&self) -> usize {
        self.arch.num_layers()
    }

    /// This rank's stage, when the model was loaded as one of a pipeline
    /// ([`crate::parallel::load_model_pipelined`]).
    pub fn stage(&self) -> Option<&Stage> {
        self.arch.stage()
    }

    /// This rank's place, when the model was split across ranks ([`Model::shard`]).
    pub fn sharded(&self) -> Option<&Shard> {
        self.arch.sharded()
    }

    /// The group of ranks that run this model together (a pipeline's or a split's), whose
    /// ranks must sample alike.
    pub fn ranks(&self) -> Option<&nuvec::distributed::Group> {
        self.stage().map(Stage::group).or(self.sharded().map(Shard::group))
    }

    /// Keeps this rank's stage of a pipeline over `group` of a model loaded whole (mlx-lm's
    /// `model.pipeline(group)`), as [`crate::parallel::load_model_pipelined`] would have loaded
    /// it: its layers, and the embeddings, norm and head where it runs them. Every rank calls it
    /// with the same `split`. On an error the model is left as it was.
    pub fn pipeline(&mut self, group: &nuvec::distributed::Group, split: Split) -> Result<()> {
        if self.model_type.starts_with("gemma4") {
            return Err(Error::Unsupported(GEMMA4_NOT_PIPELINED.into()));
        }
        self.split_arch("pipeline parallelism", |arch| arch.pipeline(group, &split))
    }

    /// Keeps this rank's share of every layer of a model loaded whole (mlx-lm's
    /// `model.shard(group)`): its share of the query heads (with the key/value heads they read,
    /// shared between ranks when there are fewer than ranks), of a Gated DeltaNet's heads, and
    /// of the MLP's and each expert's hidden units; the output, down and experts' products are
    /// summed over `group`. An untied head whose rows divide is split by vocabulary (its logits
    /// gathered); otherwise rank 0's logits are every rank's. Every rank calls it. Sizes that do
    /// not divide are an error naming the layer, and the model is left as it was.
    pub fn shard(&mut self, group: &nuvec::distributed::Group) -> Result<()> {
        if self.device != Device::Cpu {
            return Err(Error::Unsupported(format!(
                "tensor parallelism on {:?}: process groups move host memory (MPI), and GPU ranks (NCCL) are not \
                 built; split a model on the CPU",
                self.device
            )));
        }
        if self.model_type.starts_with("gemma4") {
            return Err(Error::Unsupported("Gemma 4 is not split across ranks (nor by mlx-lm)".into()));
        }
        self.split_arch("tensor parallelism", |arch| arch.shard(&Shard::new(group)))
    }

    /// Replaces the architecture with `split`'s part of it (`what`: the kind of split, for the
    /// error of a family without it), once: a model already split is refused, and on an error
    /// the model is left as it was.
    fn split_arch(
        &mut self,
        what: &str,
        split: impl FnOnce(&dyn Architecture) -> Option<Result<Box<dyn Architecture>>>,
    ) -> Result<()> {
        if self.ranks().is_some() {
            return Err(Error::Unsupported(
                "a model is split across ranks once: pipelined or sharded, not both".into(),
            ));
        }
        match split(self.arch.as_ref()) {
            Some(arch) => self.arch = arch?,
            None => {
                return Err(Error::Unsupported(format!(
                    "{what} for model_type {:?} is not built yet ({SPLIT_FAMILIES} are)",
                    self.model_type
                )))
            }
        }
        Ok(())
    }

    /// The type caches store keys and values in unless [`CacheOptions::kv_dtype`] says otherwise:
    /// the one mlx-lm computes the checkpoint in (f32, f16 or bf16; f16 for a GGUF file, as
    /// llama.cpp caches), on the CPU and on a GPU alike.
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    /// Sets [`Model::kv_dtype`] (for a custom architecture, whose caches are f32 by default).
    pub fn set_kv_dtype(&mut self, kv_dtype: KvDtype) {
        self.kv_dtype = kv_dtype;
    }

    /// `options` with the cache type filled in: what a cache made from them stores.
    pub fn cache_options(&self, options: &CacheOptions) -> CacheOptions {
        CacheOptions { kv_dtype: Some(options.kv_dtype.unwrap_or(self.kv_dtype())), ..options.clone() }
    }

    /// A fresh plain cache, one per layer, in [`Model::kv_dtype`] (a recurrent one for a hybrid's
    /// linear layers; the caches the model makes itself, see [`Architecture::own_cache`]).
    pub fn new_cache(&self) -> Vec<LayerCache> {
        let dtype = self.kv_dtype().dtype();
        if let Some(caches) = self.arch.own_cache(dtype) {
            return caches;
        }
        (0..self.num_layers())
            .map(|i| match self.arch.is_recurrent(i) {
                true => LayerCache::Recurrent(crate::cache::RecurrentCache::new()),
                false => LayerCache::Plain(crate::cache::KvCache::with_dtype(dtype)),
            })
            .collect()
    }

    /// A fresh cache of the kind `options` asks for, one per layer (a recurrent one for a
    /// hybrid's linear layers). A hybrid refuses `max_kv_size`: its recurrent layers remember
    /// every position whatever the attention layers forget, and mlx-lm silently ignores the
    /// setting for such models. So does a model that makes its own caches (Gemma 4, whose
    /// sliding-window layers already rotate); `kv_bits` applies to its caches as to any.
    pub fn make_cache(&self, options: &CacheOptions) -> Result<Vec<LayerCache>> {
        options.validate()?;
        let options = self.cache_options(options);
        let dtype = options.kv_dtype.expect("filled in above");
        if let Some(caches) = self.arch.own_cache(dtype.dtype()) {
            if let Some(max) = options.max_kv_size {
                return Err(Error::Unsupported(format!(
                    "max_kv_size = {max}: model_type {} makes its own caches (its sliding-window layers \
                     already rotate); drop --max-kv-size",
                    self.model_type
                )));
            }
            return Ok(caches);
        }
        let hybrid = (0..self.num_layers()).any(|i| self.arch.is_recurrent(i));
        if let (true, Some(max)) = (hybrid, options.max_kv_size) {
            return Err(Error::Unsupported(format!(
                "max_kv_size = {max}: {} has recurrent (Gated DeltaNet) layers, which cannot forget positions; \
                 run it without --max-kv-size (mlx-lm ignores the setting for this model)",
                self.model_type
            )));
        }
        (0..self.num_layers())
            .map(|i| match self.arch.is_recurrent(i) {
                true => Ok(LayerCache::Recurrent(crate::cache::RecurrentCache::new())),
                false => LayerCache::new(&options),
            })
            .collect()
    }

    /// Logits `[L, vocab]` for every position of `tokens`, extending `cache`.
    pub fn forward(&self, tokens: &[u32], cache: &mut [LayerCache]) -> Result<Array> {
        self.in_compute_dtype(|| {
            let h = self.arch.hidden(&mut StepBatch::one(tokens, cache))?;
            self.arch.logits(&h)
        })
    }

    /// Logits `[1, vocab]` of the last position only (the head runs on one row).
    pub fn forward_last(&self, tokens: &[u32], cache: &mut [LayerCache]) -> Result<Array> {
        self.in_compute_dtype(|| {
            let h = self.arch.hidden(&mut StepBatch::one(tokens, cache))?;
            let l = h.dim(0);
            self.arch.logits(&h.slice_rows(l - 1, l)?)
        })
    }

    /// [`Model::forward`] with the final hidden states `[L, hidden]` the logits `[L, vocab]`
    /// come from: what a multi-token-prediction head reads.
    pub fn forward_hidden(&self, tokens: &[u32], cache: &mut [LayerCache]) -> Result<(Array, Array)> {
        self.in_compute_dtype(|| {
            let h = self.arch.hidden(&mut StepBatch::one(tokens, cache))?;
            let logits = self.arch.logits(&h)?;
            Ok((h, logits))
        })
    }

    /// Extends `cache` with `tokens`, giving their final hidden states `[L, hidden]` (a prefill
    /// chunk whose hidden states a multi-token-prediction head reads).
    pub fn prefill_hidden(&self, tokens: &[u32], cache: &mut [LayerCache]) -> Result<Array> {
        self.in_compute_dtype(|| self.arch.hidden(&mut StepBatch::one(tokens, cache)))
    }

    /// The output head: logits `[L, vocab]` of hidden states `[L, hidden]` (the model's final
    /// ones, or its multi-token-prediction head's).
    pub fn logits(&self, hidden: &Array) -> Result<Array> {
        self.in_compute_dtype(|| self.arch.logits(hidden))
    }

    /// Whether the checkpoint's multi-token-prediction head was loaded ([`crate::LoadOptions::mtp`]).
    pub fn has_mtp(&self) -> bool {
        self.arch.has_mtp()
    }

    /// A cache for the multi-token-prediction head (its one attention layer), empty.
    pub fn new_mtp_cache(&self) -> Result<Vec<LayerCache>> {
        if !self.has_mtp() {
            return Err(no_mtp());
        }
        Ok(vec![LayerCache::new(&self.cache_options(&CacheOptions::default()))?])
    }

    /// Runs the multi-token-prediction head over `tokens`, extending its `cache` (from
    /// [`Model::new_mtp_cache`]): row `r` reads `target[r]` (`[L, hidden]`, the model's final
    /// hidden state at the head's position `cache length + r`, or the head's own output there)
    /// and `tokens[r]`, the token at the next position. Returns the head's hidden states
    /// `[L, hidden]`: [`Model::logits`] of row `r` guesses the token after `tokens[r]`.
    pub fn mtp_hidden(&self, tokens: &[u32], target: &Array, cache: &mut [LayerCache]) -> Result<Array> {
        self.mtp_step(&mut StepBatch::one(tokens, cache), target)
    }

    /// [`Model::mtp_hidden`] over every sequence of `step` (each cache the head's one layer),
    /// `target` holding all their rows in step order.
    pub(crate) fn mtp_step(&self, step: &mut StepBatch, target: &Array) -> Result<Array> {
        if let Some(&t) = step.tokens().iter().find(|&&t| t as usize >= self.vocab_size) {
            return Err(Error::Invalid(format!("token {t} is outside the vocabulary of {}", self.vocab_size)));
        }
        self.in_compute_dtype(|| self.arch.mtp_hidden(target, step))
    }

    /// Extends `cache` with `tokens` without computing logits (a prefill chunk).
    pub fn prefill(&self, tokens: &[u32], cache: &mut [LayerCache]) -> Result<()> {
        self.in_compute_dtype(|| self.arch.hidden(&mut StepBatch::one(tokens, cache)).map(|_| ()))
    }

    /// One forward pass over every sequence of `step` (decode rows and prefill chunks alike):
    /// the logits `[B, vocab]` of each sequence's last new token, in the step's order. Each
    /// sequence's caches grow by its tokens; if the pass fails, they are trimmed back to where
    /// they were (a cache that cannot be trimmed, a recurrent state, is named in the error).
    pub fn step(&self, step: &mut StepBatch) -> Result<Array> {
        self.run_step(step, Picked::Last)
    }

    /// [`Model::step`] with the logits `[T, vocab]` of every row (each sequence's rows in step
    /// order), as [`Model::forward`] gives one sequence's: what perplexity scores.
    pub fn step_all(&self, step: &mut StepBatch) -> Result<Array> {
        self.run_step(step, Picked::All)
    }

    /// [`Model::step`] with the logits of the last `counts[i]` rows of sequence `i` (at least 1,
    /// at most its rows), stacked in step order: what verifying guessed tokens reads.
    pub fn step_last_rows(&self, step: &mut StepBatch, counts: &[usize]) -> Result<Array> {
        Ok(self.step_last_rows_as(step, counts, false)?.0)
    }

    /// [`Model::step_last_rows`], with the final hidden states `[T, hidden]` of every row of the
    /// step in order (what a multi-token-prediction head reads). Not in batch-invariant steps.
    pub fn step_last_rows_hidden(&self, step: &mut StepBatch, counts: &[usize]) -> Result<(Array, Array)> {
        let (logits, hidden) = self.step_last_rows_as(step, counts, true)?;
        Ok((logits, hidden.expect("asked for")))
    }

    fn step_last_rows_as(
        &self,
        step: &mut StepBatch,
        counts: &[usize],
        hidden: bool,
    ) -> Result<(Array, Option<Array>)> {
        let ends = step.last_rows();
        if counts.len() != ends.len() {
            return Err(Error::Invalid(format!("{} row counts for a step of {} sequences", counts.len(), ends.len())));
        }
        let mut start = 0;
        for (i, (&end, &c)) in ends.iter().zip(counts).enumerate() {
            if c == 0 || c > end + 1 - start {
                return Err(Error::Invalid(format!(
                    "sequence {i} of the step has {} rows; its last {c} asked for",
                    end + 1 - start
                )));
            }
            start = end + 1;
        }
        self.run_step_as(step, Picked::LastOf(counts), hidden)
    }

    /// One pass over `step`: the logits of the rows `picked` names.
    fn run_step(&self, step: &mut StepBatch, picked: Picked) -> Result<Array> {
        Ok(self.run_step_as(step, picked, false)?.0)
    }

    /// [`Model::run_step`], with every row's final hidden states when `keep_hidden`.
    fn run_step_as(&self, step: &mut StepBatch, picked: Picked, keep_hidden: bool) -> Result<(Array, Option<Array>)> {
        if keep_hidden && step.batch_invariant() {
            return Err(Error::Unsupported(
                "the hidden states of a batch-invariant step (each sequence runs alone) are not kept".into(),
            ));
        }
        if step.is_empty() {
            return Err(Error::Invalid("a step of no sequences".into()));
        }
        if let Some(&t) = step.tokens().iter().find(|&&t| t as usize >= self.vocab_size) {
            return Err(Error::Invalid(format!("token {t} is outside the vocabulary of {}", self.vocab_size)));
        }
        let adapters = step.row_adapters();
        if let Some(r) = &adapters {
            if let Some((id, _)) = r.runs.iter().find(|(id, _)| id.0 >= self.adapter_names.len()) {
                return Err(Error::Invalid(format!(
                    "a step's sequence takes served adapter {}, and this model serves {}",
                    id.0,
                    self.adapter_names.len()
                )));
            }
        }
        // Each sequence's rows wanted, counted from its end (`None`: all).
        let wanted = |i: usize| match picked {
            Picked::Last => Some(1),
            Picked::All => None,
            Picked::LastOf(counts) => Some(counts[i]),
        };
        let before = step.checkpoint();
        let run = move |step: &mut StepBatch| -> Result<(Array, Option<Array>)> {
            if step.batch_invariant() {
                // Each sequence runs alone from its tokens on the host.
                step.resolve_fed()?;
                let rows = step
                    .sequences_mut()
                    .enumerate()
                    .map(|(i, (tokens, cache, adapter))| {
                        let own = rows::RowAdapters::from_sequences(std::iter::once((tokens.len(), adapter)));
                        rows::with_rows(own, || match wanted(i) {
                            Some(1) => self.forward_last(tokens, cache),
                            None => self.forward(tokens, cache),
                            Some(c) => {
                                let all = self.forward(tokens, cache)?;
                                Ok(all.slice_rows(all.dim(0) - c, all.dim(0))?)
                            }
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                return Ok((crate::step::concat_rows(&rows)?, None));
            }
            let h = rows::with_rows(adapters, || self.arch.hidden(step))?;
            let kept = keep_hidden.then(|| h.clone());
            // Runs of consecutive rows wanted: (first, end).
            let mut runs: Vec<(usize, usize)> = vec![];
            let mut start = 0;
            for (i, &last) in step.last_rows().iter().enumerate() {
                let from = wanted(i).map_or(start, |c| last + 1 - c);
                match runs.last_mut() {
                    Some((_, end)) if *end == from => *end = last + 1,
                    _ => runs.push((from, last + 1)),
                }
                start = last + 1;
            }
            let rows = match runs[..] {
                [(0, end)] if end == h.dim(0) => h,
                _ => {
                    let parts = runs.iter().map(|&(a, b)| h.slice_rows(a, b)).collect::<nuvec::Result<Vec<_>>>()?;
                    crate::step::concat_rows(&parts)?
                }
            };
            Ok((self.arch.logits(&rows)?, kept))
        };
        self.in_compute_dtype(|| match run(step) {
            Ok(logits) => Ok(logits),
            Err(e) => {
                step.restore(&before)?;
                Err(e)
            }
        })
    }

    /// Bytes one position of one sequence takes in a plain (or paged) KV cache: the keys and
    /// values of every attention layer in [`Model::kv_dtype`]. Measured, not derived from the
    /// config: one token runs through a fresh cache and the stored bytes are counted (a
    /// recurrent layer's state does not grow with positions and counts 0).
    pub fn kv_bytes_per_position(&self) -> Result<usize> {
        let (full, window) = self.kv_bytes_per_position_by_kind()?;
        Ok(full + window)
    }

    /// [`Model::kv_bytes_per_position`] split into the full-attention layers' bytes and the
    /// sliding-window layers' (Gemma 4's and gpt-oss's rotating caches).
    pub fn kv_bytes_per_position_by_kind(&self) -> Result<(usize, usize)> {
        let mut cache = self.new_cache();
        self.prefill(&[0], &mut cache)?;
        let size = self.kv_dtype().dtype().size();
        // Keys and values `[heads, positions, dim]`: one position is heads x dim of each.
        let per_position = |k: &Array, v: &Array| (k.dim(0) * k.dim(2) + v.dim(0) * v.dim(2)) * size;
        let (mut full, mut window) = (0, 0);
        for (i, c) in cache.iter().enumerate() {
            match c {
                LayerCache::Plain(kv) => {
                    if let Some((k, v)) = kv.state()? {
                        full += per_position(&k, &v);
                    }
                }
                LayerCache::Rotating(r) => {
                    if let Some((k, v, _)) = r.state() {
                        window += per_position(&k, &v);
                    }
                }
                LayerCache::Recurrent(_) => {}
                _ => {
                    return Err(Error::Unsupported(format!(
                        "kv_bytes_per_position: layer {i} of {} uses neither a plain, a sliding-window nor a \
                         recurrent cache",
                        self.model_type
                    )))
                }
            }
        }
        Ok((full, window))
    }

    /// The float type mlx-lm computes this checkpoint in (f32, f16 or bf16; f32 for a model
    /// made with [`Model::new`] unless [`Model::set_compute_dtype`] says otherwise).
    pub fn compute_dtype(&self) -> DType {
        self.compute_dtype
    }

    /// Sets [`Model::compute_dtype`] (for a custom architecture whose weights are half precision).
    pub fn set_compute_dtype(&mut self, dtype: DType) {
        self.compute_dtype = dtype;
    }

    /// `f()` (a forward pass) with [`Model::compute_dtype`] as the backends' hint
    /// ([`nuvec::with_compute_dtype`]): the CUDA backend's default prefill precision computes
    /// attention in bf16 only for a half-precision model, and a half-precision weight in bf16
    /// only when the model is not f32, as mlx-lm does. Scoped to this call and thread: loading
    /// sets nothing global.
    fn in_compute_dtype<R>(&self, f: impl FnOnce() -> R) -> R {
        nuvec::with_compute_dtype(self.compute_dtype, f)
    }
}

impl Model {
    /// Replaces the end-of-sequence ids (the loader merges the tokenizer's in).
    pub fn set_eos_token_ids(&mut self, ids: Vec<u32>) {
        self.eos_token_ids = ids;
    }

    /// The ids of "\n" (XTC never removes them); the loader sets them from the tokenizer.
    pub fn newline_token_ids(&self) -> &[u32] {
        &self.newline_token_ids
    }

    /// What identifies the weights this model was loaded from (a hash of its files' headers and
    /// samples of their contents); prompt-cache files record it.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The served adapters a request can choose ([`crate::LoadOptions::served_adapters`]), by
    /// [`AdapterId`].
    pub fn adapter_names(&self) -> &[String] {
        &self.adapter_names
    }

    /// The served adapter called `name`, or an error listing those there are.
    pub fn adapter_id(&self, name: &str) -> Result<AdapterId> {
        match self.adapter_names.iter().position(|n| n == name) {
            Some(i) => Ok(AdapterId(i)),
            None if self.adapter_names.is_empty() => Err(Error::Invalid(format!(
                "adapter {name:?}: this model serves no adapters (load it with served adapters: `nuvec serve \
                 --lora-modules NAME=PATH`, LoadOptions::served_adapters)"
            ))),
            None => Err(Error::Invalid(format!(
                "adapter {name:?}: not one this model serves ({})",
                self.adapter_names.join(", ")
            ))),
        }
    }

    /// Names the served adapters (the loader does, in the order the projections hold them).
    pub(crate) fn set_adapter_names(&mut self, names: Vec<String>) {
        self.adapter_names = names;
    }

    /// Sets the fingerprint (the loader does).
    pub fn set_fingerprint(&mut self, fingerprint: String) {
        self.fingerprint = fingerprint;
    }

    /// Sets the ids of "\n".
    pub fn set_newline_token_ids(&mut self, ids: Vec<u32>) {
        self.newline_token_ids = ids;
    }
}
