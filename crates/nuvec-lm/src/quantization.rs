//! The checkpoint's quantization settings: mlx's `quantization` key (or `quantization_config`
//! written the same way), with per-module overrides keyed by module path.

use std::collections::HashMap;

use nuvec::{QuantMode, QuantSpec};
use serde_json::Value;

use crate::config::Config;
use crate::{Error, Result};

/// How the checkpoint says its modules are quantized.
#[derive(Debug, Clone, Default)]
pub struct Quantization {
    /// The default for quantized modules not listed in `overrides`.
    pub default: Option<QuantSpec>,
    /// Per module path: `Some(spec)`, or `None` for a module left unquantized.
    pub overrides: HashMap<String, Option<QuantSpec>>,
}

fn spec_from(config: &Config, key: &str, v: &serde_json::Map<String, Value>) -> Result<QuantSpec> {
    let int = |name: &str, default: usize| -> Result<usize> {
        match v.get(name) {
            None => Ok(default),
            Some(x) => x
                .as_u64()
                .map(|n| n as usize)
                .ok_or_else(|| config.error(&format!("{key}.{name}"), format_args!("= {x} is not an integer"))),
        }
    };
    let mode = match v.get("mode") {
        None => QuantMode::Affine,
        Some(Value::String(m)) => {
            QuantMode::parse(m).map_err(|e| config.error(&format!("{key}.mode"), format_args!(": {e}")))?
        }
        Some(x) => return Err(config.error(&format!("{key}.mode"), format_args!("= {x} is not a string"))),
    };
    // mlx-lm's defaults when a key is absent: 4 bits, group 64 (as nn.quantize).
    let spec = QuantSpec { mode, bits: int("bits", 4)?, group_size: int("group_size", 64)? };
    spec.validate().map_err(|m| config.error(key, format_args!(": {m}")))?;
    Ok(spec)
}

impl Quantization {
    /// Reads `quantization` (or an MLX-style `quantization_config`) from config.json.
    /// Legacy formats mlx-lm converts at load (AWQ, GPTQ, ...) are refused for now.
    pub fn from_config(config: &Config) -> Result<Self> {
        let (key, value) = match (config.get("quantization"), config.get("quantization_config")) {
            (Some(q), _) => ("quantization", q),
            (None, Some(q)) => ("quantization_config", q),
            (None, None) => return Ok(Self::default()),
        };
        let Value::Object(map) = value else {
            return Err(config.error(key, "must be an object"));
        };
        if let Some(method) = map.get("quant_method").and_then(Value::as_str) {
            return Err(Error::Unsupported(format!(
                "{}: quant_method {method:?} checkpoints are not loaded yet; convert with \
                 `mlx_lm.convert` to an MLX quantization first",
                config.file()
            )));
        }
        let default = spec_from(config, key, map)?;
        let mut overrides = HashMap::new();
        for (path, v) in map {
            match v {
                Value::Bool(false) => {
                    overrides.insert(path.clone(), None);
                }
                Value::Object(o) => {
                    overrides.insert(path.clone(), Some(spec_from(config, &format!("{key}.{path}"), o)?));
                }
                _ => {}
            }
        }
        Ok(Quantization { default: Some(default), overrides })
    }
}
