//! `load`: a checkpoint directory (or cached Hugging Face repo id) to a model and its tokenizer.

use std::path::Path;

use crate::config::Config;
use crate::models::Model;
use crate::quantization::Quantization;
use crate::tokenizer::Tokenizer;
use crate::weights::Weights;
use crate::{hub, Result};

/// Loads the model and tokenizer at `model`: a checkpoint directory, a `.gguf` file, or a repo id
/// in the local hub cache.
pub fn load(model: &str) -> Result<(Model, Tokenizer)> {
    let path = hub::resolve(model)?;
    if path.is_file() && path.extension().is_some_and(|e| e == "gguf") {
        return crate::gguf::load_gguf(&path);
    }
    load_dir(&path)
}

/// Loads the model and tokenizer of checkpoint directory `dir`.
pub fn load_dir(dir: &Path) -> Result<(Model, Tokenizer)> {
    let model = load_model(dir)?;
    let tokenizer = Tokenizer::load(dir, model.eos_token_ids())?;
    let mut model = model;
    model.set_eos_token_ids(tokenizer.eos_token_ids().to_vec());
    model.set_newline_token_ids(tokenizer.encode("\n", false)?);
    Ok((model, tokenizer))
}

/// Loads only the model of checkpoint directory `dir`.
pub fn load_model(dir: &Path) -> Result<Model> {
    let config = Config::load(dir)?;
    let quantization = Quantization::from_config(&config)?;
    let weights = Weights::open(dir, quantization)?;
    Model::from_config(&config, &weights)
}
