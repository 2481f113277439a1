//! Model families, one file each, and the [`Model`] they are loaded as.

mod gpt_oss;
mod llama;
mod qwen2;
mod qwen3;
mod qwen3_moe;

use nuvec::{Array, Device};

use crate::cache::{CacheOptions, LayerCache};
use crate::config::Config;
use crate::weights::Weights;
use crate::{Error, Result};

/// What a model family implements.
pub trait Architecture: Send + Sync {
    /// Runs `tokens` through the decoder, extending `cache` (one per layer); returns the final
    /// normalized hidden states `[L, hidden]`.
    fn hidden(&self, tokens: &[u32], cache: &mut [LayerCache]) -> Result<Array>;
    /// The output head: `[L, hidden] -> [L, vocab]` logits.
    fn logits(&self, hidden: &Array) -> Result<Array>;
    /// Decoder layers (one cache each).
    fn num_layers(&self) -> usize;

    // gpt-oss (the same method as the Gemma 4 branch's)

    /// The caches the model makes itself, as mlx-lm's `make_cache` (gpt-oss: rotating caches
    /// for sliding-window layers); `None` means one plain cache per layer, or the kind the
    /// generation's options ask for.
    fn own_cache(&self) -> Option<Vec<LayerCache>> {
        None
    }
}

/// The model types this build loads.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &["llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gpt_oss"];

/// A loaded language model.
pub struct Model {
    arch: Box<dyn Architecture>,
    model_type: String,
    vocab_size: usize,
    eos_token_ids: Vec<u32>,
    newline_token_ids: Vec<u32>,
    fingerprint: String,
    device: Device,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("model_type", &self.model_type).field("layers", &self.num_layers()).finish()
    }
}

impl Model {
    /// Builds the family `config.json` names from `weights`.
    pub fn from_config(config: &Config, weights: &Weights) -> Result<Self> {
        let model_type = config.str("model_type")?.to_string();
        let arch: Box<dyn Architecture> = match model_type.as_str() {
            "llama" | "mistral" => Box::new(llama::Llama::load(config, weights)?),
            "qwen2" => Box::new(qwen2::load(config, weights)?),
            "qwen3" => Box::new(qwen3::load(config, weights)?),
            "qwen3_moe" => Box::new(qwen3_moe::load(config, weights)?),
            "gpt_oss" => Box::new(gpt_oss::GptOss::load(config, weights)?),
            other => {
                return Err(Error::Unsupported(format!(
                    "{}: model_type {other:?} is not one nuvec loads ({})",
                    config.file(),
                    SUPPORTED_MODEL_TYPES.join(", ")
                )))
            }
        };
        Ok(Model {
            arch,
            model_type,
            vocab_size: config.usize("vocab_size")?,
            eos_token_ids: config.eos_token_ids()?,
            newline_token_ids: vec![],
            fingerprint: String::new(),
            device: weights.device(),
        })
    }

    /// A model from any architecture (custom or scripted), with its vocabulary size and
    /// end-of-sequence ids.
    pub fn new(arch: Box<dyn Architecture>, model_type: &str, vocab_size: usize, eos_token_ids: Vec<u32>) -> Self {
        let fingerprint = String::new();
        let (model_type, newline_token_ids, device) = (model_type.to_string(), vec![], Device::Cpu);
        Model { arch, model_type, vocab_size, eos_token_ids, newline_token_ids, fingerprint, device }
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

    /// Decoder layers.
    pub fn num_layers(&self) -> usize {
        self.arch.num_layers()
    }

    /// A fresh plain cache, one per layer (or the caches the model makes itself, see
    /// [`Architecture::own_cache`]).
    pub fn new_cache(&self) -> Vec<LayerCache> {
        if let Some(caches) = self.arch.own_cache() {
            return caches;
        }
        (0..self.num_layers()).map(|_| LayerCache::Plain(crate::cache::KvCache::new())).collect()
    }

    /// A fresh cache of the kind `options` asks for, one per layer. A model that makes its own
    /// caches (gpt-oss) refuses `max_kv_size`, which mlx-lm silently ignores for it; `kv_bits`
    /// applies to its caches as to any.
    pub fn make_cache(&self, options: &CacheOptions) -> Result<Vec<LayerCache>> {
        options.validate()?;
        if let Some(caches) = self.arch.own_cache() {
            if let Some(max) = options.max_kv_size {
                return Err(Error::Unsupported(format!(
                    "max_kv_size = {max}: model_type {} makes its own caches (its sliding-window layers \
                     already rotate); drop --max-kv-size",
                    self.model_type
                )));
            }
            return Ok(caches);
        }
        (0..self.num_layers()).map(|_| LayerCache::new(options)).collect()
    }

    /// Logits `[L, vocab]` for every position of `tokens`, extending `cache`.
    pub fn forward(&self, tokens: &[u32], cache: &mut [LayerCache]) -> Result<Array> {
        let h = self.arch.hidden(tokens, cache)?;
        self.arch.logits(&h)
    }

    /// Logits `[1, vocab]` of the last position only (the head runs on one row).
    pub fn forward_last(&self, tokens: &[u32], cache: &mut [LayerCache]) -> Result<Array> {
        let h = self.arch.hidden(tokens, cache)?;
        let l = h.dim(0);
        self.arch.logits(&h.slice_rows(l - 1, l)?)
    }

    /// Extends `cache` with `tokens` without computing logits (a prefill chunk).
    pub fn prefill(&self, tokens: &[u32], cache: &mut [LayerCache]) -> Result<()> {
        self.arch.hidden(tokens, cache).map(|_| ())
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

    /// Sets the fingerprint (the loader does).
    pub fn set_fingerprint(&mut self, fingerprint: String) {
        self.fingerprint = fingerprint;
    }

    /// Sets the ids of "\n".
    pub fn set_newline_token_ids(&mut self, ids: Vec<u32>) {
        self.newline_token_ids = ids;
    }
}
