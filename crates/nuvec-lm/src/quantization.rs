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
    /// A Hugging Face quantization converted to MLX's affine layout as it loads.
    pub legacy: Option<Legacy>,
}

/// Hugging Face quantization formats converted at load (as mlx-lm converts them, but reading
/// GPTQ's own layout: mlx-lm 0.32.2 reads GPTQ with AWQ's and garbles it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Legacy {
    /// AutoAWQ, GEMM layout, 4 bits.
    Awq {
        /// Values per group along the input.
        group_size: usize,
    },
    /// GPTQ, 4 or 8 bits, groups in input order (no act-order permutation).
    Gptq {
        /// Bits per value.
        bits: usize,
        /// Values per group along the input.
        group_size: usize,
        /// 1 for v1 checkpoints (zero points stored minus one), 0 for `gptq_v2`.
        zero_offset: u8,
    },
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
    // mlx-lm's defaults when a key is absent, per mode (as nn.quantize): affine 4 bits in
    // groups of 64; a floating-point mode its one shape.
    let (bits, group_size) = mode.defaults();
    let spec = QuantSpec { mode, bits: int("bits", bits)?, group_size: int("group_size", group_size)? };
    spec.validate_mlx().map_err(|m| config.error(key, format_args!(": {m}")))?;
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
            return Self::legacy(config, key, method, map);
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
        Ok(Quantization { default: Some(default), overrides, legacy: None })
    }
}

impl Quantization {
    fn legacy(config: &Config, key: &str, method: &str, map: &serde_json::Map<String, Value>) -> Result<Self> {
        let int = |name: &str, default: i64| map.get(name).and_then(Value::as_i64).unwrap_or(default);
        let group = int("group_size", 128);
        let group_size =
            usize::try_from(group).ok().filter(|g| QuantSpec::MLX_AFFINE_GROUPS.contains(g)).ok_or_else(|| {
                config.error(
                    &format!("{key}.group_size"),
                    format_args!("= {group}: only 32, 64 and 128 convert to MLX groups"),
                )
            })?;
        let bits = int("bits", 4);
        let legacy = match method {
            "awq" => {
                let version = map.get("version").and_then(Value::as_str).unwrap_or("gemm").to_ascii_lowercase();
                if bits != 4 || version != "gemm" {
                    return Err(Error::Unsupported(format!(
                        "{}: AutoAWQ {version} at {bits} bits is not converted (4-bit GEMM is); convert with \
                         `mlx_lm.convert` first",
                        config.file()
                    )));
                }
                Legacy::Awq { group_size }
            }
            "gptq" => {
                if bits != 4 && bits != 8 {
                    return Err(
                        config.error(&format!("{key}.bits"), format_args!("= {bits}: GPTQ converts at 4 or 8 bits"))
                    );
                }
                let format = map.get("checkpoint_format").and_then(Value::as_str).unwrap_or("gptq");
                let zero_offset = match format {
                    "gptq" => 1,
                    "gptq_v2" => 0,
                    other => {
                        return Err(Error::Unsupported(format!(
                            "{}: GPTQ checkpoint_format {other:?} is not converted (gptq and gptq_v2 are)",
                            config.file()
                        )))
                    }
                };
                Legacy::Gptq { bits: bits as usize, group_size, zero_offset }
            }
            // gpt-oss as Hugging Face publishes it: MXFP4 experts as `_blocks`/`_scales`, which its
            // loader reads as MLX's mxfp4 mode (what mlx-lm's sanitize does); every other tensor
            // is dense.
            "mxfp4" if config.str("model_type").is_ok_and(|t| t == "gpt_oss") => return Ok(Self::default()),
            // Other microscaling releases: nuvec has MLX's mxfp4/mxfp8 modes but does not rearrange
            // these layouts into them yet.
            "mxfp4" | "mxfp8" => {
                return Err(Error::Unsupported(format!(
                    "{}: quant_method {method:?} (Hugging Face's `_blocks`/`_scales` layout) is not converted yet; \
                     convert with `mlx_lm.convert`, whose {method} output nuvec loads",
                    config.file()
                )))
            }
            other => {
                return Err(Error::Unsupported(format!(
                    "{}: quant_method {other:?} checkpoints (FP8, compressed-tensors, ModelOpt, bitnet, ...) are not \
                     loaded; convert with `mlx_lm.convert` to an MLX quantization first",
                    config.file()
                )))
            }
        };
        Ok(Quantization { default: None, overrides: HashMap::new(), legacy: Some(legacy) })
    }
}
