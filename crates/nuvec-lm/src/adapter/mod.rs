//! LoRA and DoRA adapters from mlx-lm's adapter folders (`adapters.safetensors` and
//! `adapter_config.json`, what `mlx_lm.lora` writes), applied at inference without touching the
//! base weights: each adapted projection adds its low-rank term to the base product
//! ([`LowRank`]), a quantized base stays quantized.
//!
//! The adapter file says which projections are adapted (`<module>.lora_a`, `.lora_b`, and `.m`
//! for DoRA, under the names the checkpoint gives its modules); the config gives the kind and
//! the scale. Every tensor of the file must be taken by a projection of the model: one left
//! over (an adapter on an embedding, on MoE experts or on the output head, which are not
//! supported yet) is an error naming it, never an adapter silently dropped.

mod low_rank;
pub(crate) mod rows;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nuvec::io::SafetensorsFile;
use nuvec::{Array, Device, Matrix};

pub use low_rank::LowRank;
pub use rows::AdapterId;

use crate::{Error, Result};

/// LoRA (`y + s·(x A) B`) or DoRA (the same, then each output rescaled to a learned magnitude).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdapterKind {
    /// `fine_tune_type: lora`.
    Lora,
    /// `fine_tune_type: dora`.
    Dora,
}

/// One projection's adapter tensors, as the file holds them.
#[derive(Debug, Clone)]
struct Tensors {
    a: Option<Array>,
    b: Option<Array>,
    m: Option<Array>,
}

/// An adapter folder, read.
#[derive(Debug)]
pub struct Adapter {
    dir: PathBuf,
    kind: AdapterKind,
    scale: f32,
    modules: BTreeMap<String, Tensors>,
    /// The modules a projection took so far.
    taken: Mutex<HashSet<String>>,
}

impl Adapter {
    /// Reads adapter folder `dir`.
    pub fn open(dir: &Path) -> Result<Adapter> {
        let config_path = dir.join("adapter_config.json");
        let file = config_path.display().to_string();
        let text = std::fs::read_to_string(&config_path).map_err(|source| Error::Io { path: file.clone(), source })?;
        let config: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::config(&file, format!("is not valid JSON ({e})")))?;
        let kind = match config.get("fine_tune_type").and_then(|t| t.as_str()).unwrap_or("lora") {
            "lora" => AdapterKind::Lora,
            "dora" => AdapterKind::Dora,
            "full" => {
                return Err(Error::Unsupported(format!(
                    "{file}: fine_tune_type \"full\" (whole weights, not an adapter): fuse it with `mlx_lm.fuse` \
                     and load the result"
                )))
            }
            other => {
                return Err(Error::config(&file, format!("fine_tune_type {other:?}: expected lora, dora or full")))
            }
        };
        let params = config.get("lora_parameters").cloned().unwrap_or_default();
        let scale = match params.get("scale").and_then(|s| s.as_f64()) {
            Some(s) if s.is_finite() => s as f32,
            Some(_) => return Err(Error::config(&file, "lora_parameters.scale is not a finite number")),
            None if params.get("alpha").is_some() => {
                return Err(Error::config(
                    &file,
                    "lora_parameters has no \"scale\" (it has \"alpha\": mlx-lm's adapters give scale, not alpha)",
                ))
            }
            None => return Err(Error::config(&file, "lora_parameters has no \"scale\"")),
        };
        let weights_path = dir.join("adapters.safetensors");
        let weights = SafetensorsFile::open(&weights_path)?;
        let mut modules: BTreeMap<String, Tensors> = BTreeMap::new();
        let weights_file = weights_path.display().to_string();
        for name in weights.tensors().keys() {
            let Some((module, leaf)) = name.rsplit_once('.') else {
                return Err(Error::Weights { file: weights_file, message: format!("{name}: not an adapter tensor") });
            };
            let slot = modules.entry(module.to_string()).or_insert(Tensors { a: None, b: None, m: None });
            let array = Some(weights.array(name)?);
            match leaf {
                "lora_a" => slot.a = array,
                "lora_b" => slot.b = array,
                "m" if kind == AdapterKind::Dora => slot.m = array,
                _ => {
                    return Err(Error::Weights {
                        file: weights_file,
                        message: format!(
                            "{name}: not a {kind:?} adapter tensor (lora_a, lora_b{})",
                            match kind {
                                AdapterKind::Dora => ", m",
                                AdapterKind::Lora => "",
                            }
                        ),
                    })
                }
            }
        }
        Ok(Adapter { dir: dir.to_path_buf(), kind, scale, modules, taken: Mutex::default() })
    }

    /// The folder's files (for the model's fingerprint: another adapter is another model).
    pub fn files(&self) -> Vec<PathBuf> {
        vec![self.dir.join("adapter_config.json"), self.dir.join("adapters.safetensors")]
    }

    /// The adapter of projection `module` (base weight `base`, `[out, in]`), on `device`, when
    /// the file has one.
    pub fn low_rank(&self, module: &str, base: &Matrix, device: Device) -> Result<Option<LowRank>> {
        if !self.modules.contains_key(module) {
            return Ok(None);
        }
        let parts = self.take(module)?;
        LowRank::new(base, parts, self.scale, device).map(Some).map_err(|message| self.error(module, message))
    }

    /// The modules the adapter names, sorted.
    pub fn modules(&self) -> Vec<String> {
        self.modules.keys().cloned().collect()
    }

    /// Module `module`'s terms for a base weight of `rows` x `cols`, as `nuvec fuse` adds them
    /// in: `s·Bᵀ Aᵀ` (`[rows, cols]`, f32) and, for DoRA, the magnitudes `m`.
    pub(crate) fn terms(&self, module: &str, rows: usize, cols: usize) -> Result<(Vec<f32>, Option<Vec<f32>>)> {
        let parts = self.take(module)?;
        low_rank::terms(parts, self.scale, rows, cols).map_err(|message| self.error(module, message))
    }

    /// Module `module`'s `(lora_a, lora_b, m)`, each there that the kind needs (`m` for DoRA
    /// only), the module marked as taken.
    fn take(&self, module: &str) -> Result<(&Array, &Array, Option<&Array>)> {
        let t = self.modules.get(module).ok_or_else(|| self.error(module, "not in the adapter".into()))?;
        self.taken.lock().unwrap_or_else(|e| e.into_inner()).insert(module.to_string());
        let missing = |leaf: &str| self.error(module, format!("{leaf} is missing"));
        let a = t.a.as_ref().ok_or_else(|| missing("lora_a"))?;
        let b = t.b.as_ref().ok_or_else(|| missing("lora_b"))?;
        let m = match self.kind {
            AdapterKind::Dora => Some(t.m.as_ref().ok_or_else(|| missing("m"))?),
            AdapterKind::Lora => None,
        };
        Ok((a, b, m))
    }

    fn error(&self, module: &str, message: String) -> Error {
        let file = self.dir.join("adapters.safetensors").display().to_string();
        Error::Weights { file, message: format!("{module}: {message}") }
    }

    /// Errs naming the adapter's modules no projection of the model took.
    pub fn check_all_taken(&self) -> Result<()> {
        let taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        let left: Vec<&str> = self.modules.keys().filter(|m| !taken.contains(*m)).map(String::as_str).collect();
        if left.is_empty() {
            return Ok(());
        }
        Err(Error::Unsupported(format!(
            "{}: adapters on {} are not applied: no projection of this model has that name, or it is an \
             embedding, MoE experts or the output head, whose adapters are not supported yet",
            self.dir.join("adapters.safetensors").display(),
            left.join(", ")
        )))
    }
}
