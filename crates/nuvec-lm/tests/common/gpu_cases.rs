//! Helpers of the GPU test binaries (`gpu_parity.rs`, `gpu_parity_bf16.rs`, `cuda_graphs.rs`):
//! where their fixture cases are, a fixed pseudo-random prompt, greedy choice and its margin.
//! Plain Rust (no CUDA), so it compiles with every test that includes `common`.

use std::path::PathBuf;

pub fn case_dir(case: &str) -> PathBuf {
    let root = std::env::var_os("NUVEC_GPU_FIXTURES")
        .or_else(|| std::env::var_os("NUVEC_FIXTURES"))
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("set NUVEC_GPU_FIXTURES (or NUVEC_FIXTURES) to the fixture case directories"));
    let dir = root.join(case);
    assert!(
        dir.join("config.json").exists() || dir.join("model.gguf").exists(),
        "{}: no such fixture case",
        dir.display()
    );
    dir
}

/// `n` fixed pseudo-random ids below `vocab`.
pub fn prompt(vocab: usize, n: usize) -> Vec<u32> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % vocab as u64) as u32
        })
        .collect()
}

pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

pub fn margin(row: &[f32]) -> f32 {
    let top = argmax(row) as usize;
    let second = row.iter().enumerate().filter(|&(i, _)| i != top).map(|(_, &v)| v).fold(f32::MIN, f32::max);
    row[top] - second
}
