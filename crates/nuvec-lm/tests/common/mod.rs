//! Shared by the integration tests: where the oracle's records are and how to read them.
#![allow(dead_code)]

pub mod gguf_oracle;
pub mod gpu_cases;
pub mod mlx_adapter;
#[path = "../../../nuvec/tests/support/mpirun.rs"]
pub mod mpirun;
pub mod paged;
pub mod scripted;

use std::path::{Path, PathBuf};

use nuvec::io::SafetensorsFile;
use serde_json::Value;

/// The fixtures made by `scripts/setup-oracle.sh` (mlx-lm's records). Missing fixtures fail the
/// test: a parity test that silently skips would prove nothing.
pub fn fixtures() -> PathBuf {
    let dir = std::env::var_os("NUVEC_FIXTURES").map(PathBuf::from).unwrap_or_else(|| {
        panic!("NUVEC_FIXTURES is not set: run `scripts/test.sh` (it runs scripts/setup-oracle.sh and sets it)")
    });
    assert!(
        dir.join("DONE").exists(),
        "{} is not a complete fixture directory: rerun scripts/setup-oracle.sh",
        dir.display()
    );
    dir
}

/// The default model's GGUF file, installed by the setup script.
pub fn default_gguf() -> PathBuf {
    std::env::var_os("NUVEC_DEFAULT_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("NUVEC_DEFAULT_GGUF is not set: run `scripts/test.sh`"))
}

/// One case's `oracle.json`.
pub fn oracle_json(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join("oracle.json")).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    serde_json::from_str(&text).unwrap()
}

/// Tensor `name` of one case's `oracle.safetensors`, as f32 or i32 values with its shape.
pub fn oracle_f32(dir: &Path, name: &str) -> (Vec<f32>, Vec<usize>) {
    let file = SafetensorsFile::open(dir.join("oracle.safetensors")).unwrap();
    let a = file.array(name).unwrap();
    (a.to_f32_vec().unwrap(), a.shape().to_vec())
}

/// A recorded greedy run (make_fixtures.py's `record_plain_prompt`): the tokens, each step's top-2
/// margin, the first step's logits, and each step's `k` best ids and their logits.
pub struct GreedyRecord {
    pub tokens: Vec<u32>,
    pub margins: Vec<f32>,
    pub first: Vec<f32>,
    pub top_ids: Vec<f32>,
    pub top_logits: Vec<f32>,
    pub k: usize,
}

/// The greedy run recorded in `dir` (`oracle`: its parsed oracle.json).
pub fn greedy_record(dir: &Path, oracle: &Value) -> GreedyRecord {
    let margins = oracle["margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap() as f32).collect();
    let (top_ids, shape) = oracle_f32(dir, "step_top_ids");
    GreedyRecord {
        tokens: ids(&oracle["greedy_tokens"]),
        margins,
        first: oracle_f32(dir, "first_logits").0,
        top_ids,
        top_logits: oracle_f32(dir, "step_top_logits").0,
        k: shape[1],
    }
}

/// `ids` of a JSON list.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap_or_else(|| panic!("not a list: {v}")).iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// The model cases (subdirectories with an oracle.json), sorted.
pub fn cases() -> Vec<PathBuf> {
    cases_in(&fixtures())
}

/// The model cases in `dir` (a recording script's own folder, e.g. `fixtures()/qwen3_5`), sorted.
pub fn cases_in(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}; rerun scripts/setup-oracle.sh", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("oracle.json").exists() && p.join("config.json").exists())
        .collect();
    out.sort();
    out
}

/// `len` fixed pseudo-random ids in `3..vocab - 1`, different for each `seed` (batched-decoding
/// tests give each sequence its own).
pub fn seeded_prompt(len: usize, seed: u32, vocab: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed * 97) >> 7) % (vocab as u32 - 4) + 3)
        .collect()
}

/// The rows of a `[rows, cols]` array.
pub fn rows_of(a: &nuvec::Array) -> Vec<Vec<f32>> {
    let v = a.to_vec::<f32>().unwrap();
    v.chunks(a.dim(1)).map(<[f32]>::to_vec).collect()
}
