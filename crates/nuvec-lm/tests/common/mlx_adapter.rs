//! mlx-lm's adapters as the oracle (`tests/support/mlx_adapter.py`): adapters made by its own
//! LoRA layers, and its greedy runs with them.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Greedy steps an oracle run takes.
pub const STEPS: usize = 8;

/// Runs `mlx_adapter.py` with `args`: its JSON answer, or its stderr.
pub fn oracle(args: &[&str]) -> Result<Value, String> {
    let python = std::env::var_os("NUVEC_ORACLE_PYTHON")
        .unwrap_or_else(|| panic!("NUVEC_ORACLE_PYTHON is not set: run `scripts/test.sh`"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/mlx_adapter.py");
    let out = Command::new(python).arg(script).args(args).output().unwrap();
    match out.status.success() {
        true => Ok(serde_json::from_slice(&out.stdout).unwrap()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

/// A fresh scratch directory for `name` (not created).
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nuvec-adapters-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A fixture case's prompt ids.
pub fn prompt(case: &Path) -> Vec<u32> {
    super::oracle_json(case)["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect()
}

/// An adapter of `kind` (lora, dora) for `model`, made by mlx-lm's layers with values drawn
/// from `seed`, in `out`.
pub fn make(model: &Path, out: &Path, kind: &str, seed: u64) {
    let seed = seed.to_string();
    let args = ["make", "--model", model.to_str().unwrap(), "--out", out.to_str().unwrap(), "--kind", kind];
    oracle(&[&args[..], &["--seed", &seed]].concat()).unwrap();
}

/// (tokens, first-step logits, per-step top-2 margins) of mlx-lm on `model` (with `adapter`).
pub fn mlx_run(model: &Path, adapter: Option<&Path>, prompt: &[u32]) -> (Vec<u32>, Vec<f32>, Vec<f32>) {
    let ids = prompt.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let steps = STEPS.to_string();
    let mut args = vec!["run", "--model", model.to_str().unwrap(), "--prompt-ids", &ids, "--max-tokens", &steps];
    if let Some(a) = adapter {
        args.extend(["--adapter-path", a.to_str().unwrap()]);
    }
    let v = oracle(&args).unwrap();
    let floats = |k: &str| v[k].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect::<Vec<_>>();
    let tokens = v["tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    (tokens, floats("logits"), floats("margins"))
}
