//! GGUF K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), recorded by `scripts/oracle/more/gguf_kquants.py`:
//! - random super-blocks of each type convert to affine groups whose dequantized values equal
//!   gguf-py's (llama.cpp's) dequantization exactly, and the CPU kernels multiply with them
//!   within f32 rounding of an f64 dot product of gguf-py's values;
//! - a tiny llama whose matrices mix every K-quant with Q8_0 (q/k rows permuted as llama.cpp
//!   writes them) answers as mlx-lm does on the dense f32 checkpoint of the same values;
//! - `convert` refuses the file without -q/-d (MLX has no groups of 16), and with either
//!   writes a checkpoint that mlx-lm loads and answers from as nuvec does.

mod common;

use std::path::PathBuf;

use common::gguf_oracle::{check_against_oracle, mlx_lm_tokens, our_tokens};
use common::*;
use nuvec::io::{gguf_matrix, GgufFile, SafetensorsFile};
use nuvec::quantize::dequantize;
use nuvec::{Array, DType, Matrix, QuantMode, QuantSpec};
use nuvec_lm::convert::{convert, ConvertOptions};

fn case() -> PathBuf {
    fixtures().join("gguf-kquants")
}

fn model_gguf() -> String {
    case().join("model.gguf").to_str().unwrap().to_string()
}

/// Pseudo-random inputs in [-1, 1).
fn inputs(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

#[test]
fn kquant_blocks_dequantize_to_llama_cpp_values() {
    let dir = case();
    let file = GgufFile::open(dir.join("blocks.gguf")).unwrap();
    let want = SafetensorsFile::open(dir.join("blocks.safetensors")).unwrap();
    for (name, bits, group) in [("q2_k", 2, 16), ("q3_k", 3, 16), ("q4_k", 4, 32), ("q5_k", 5, 32), ("q6_k", 6, 16)] {
        let tensor = file.tensors().iter().find(|t| t.name == name).unwrap_or_else(|| panic!("{name} missing"));
        let Matrix::Quantized(q) = gguf_matrix(&file, tensor, None).unwrap() else { panic!("{name}: not quantized") };
        assert_eq!((q.spec.mode, q.spec.bits, q.spec.group_size), (QuantMode::Affine, bits, group), "{name}");
        assert_eq!(q.scales.dtype(), DType::F32, "{name}: scales must be f32 to be exact");
        let (rows, cols) = (q.rows(), q.cols());
        let theirs = want.array(name).unwrap();
        assert_eq!(theirs.shape(), &[rows, cols], "{name}");
        let theirs = theirs.to_f32_vec().unwrap();

        // Exactly gguf-py's values (compared as numbers: the sign of a zero may differ).
        let ours = dequantize(&q).unwrap();
        let bad: Vec<usize> = (0..ours.len()).filter(|&i| ours[i] != theirs[i]).collect();
        if let Some(&i) = bad.first() {
            panic!(
                "{name}: {} of {} values differ; first at {i}: {} vs gguf-py {}",
                bad.len(),
                ours.len(),
                ours[i],
                theirs[i]
            );
        }

        // Rows reordered at load (as llama's q/k are) move whole rows.
        let order: Vec<usize> = (0..rows).rev().collect();
        let Matrix::Quantized(p) = gguf_matrix(&file, tensor, Some(&order)).unwrap() else { unreachable!() };
        let permuted = dequantize(&p).unwrap();
        for r in 0..rows {
            assert!(
                permuted[r * cols..(r + 1) * cols] == theirs[(rows - 1 - r) * cols..(rows - r) * cols],
                "{name}: row {r} after reordering"
            );
        }

        // The kernels (one input row: the fused GEMV; 9: decoded tiles and GEMM), against an
        // f64 dot product of gguf-py's values, within f32 rounding of the terms' magnitudes.
        let matrix = Matrix::Quantized(q);
        for m in [1usize, 9] {
            let x = inputs(m * cols, m as u64);
            let got = Array::from_slice(&x, &[m, cols]).unwrap().linear(&matrix).unwrap().to_vec::<f32>().unwrap();
            for i in 0..m {
                for r in 0..rows {
                    let terms = (0..cols).map(|k| theirs[r * cols + k] as f64 * x[i * cols + k] as f64);
                    let (sum, size) = terms.fold((0f64, 0f64), |(s, a), t| (s + t, a + t.abs()));
                    let diff = (got[i * rows + r] as f64 - sum).abs();
                    assert!(
                        diff <= 4e-5 * size,
                        "{name} m {m}: row {r}: {} vs {sum} (terms up to {size})",
                        got[i * rows + r]
                    );
                }
            }
        }
    }
}

#[test]
fn kquant_model_answers_like_mlx_lm() {
    let dir = case();
    let oracle = oracle_json(&dir);
    let (model, tokenizer) = nuvec_lm::load(&model_gguf()).unwrap();
    let prompt = ids(&oracle["prompt_ids"]);
    assert_eq!(tokenizer.encode(oracle["prompt"].as_str().unwrap(), true).unwrap(), prompt);
    check_against_oracle(&model, &prompt, &dir);
}

fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nuvec-kquants-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    dir
}

#[test]
fn convert_needs_a_flag_for_groups_of_16_and_mlx_lm_loads_either_result() {
    let gguf = model_gguf();
    let dir = case();
    let oracle = oracle_json(&dir);
    let prompt = oracle["prompt"].as_str().unwrap();

    let refused = out_dir("plain");
    let err = convert(&gguf, &refused, &ConvertOptions::default()).unwrap_err().to_string();
    assert!(err.contains("groups of 16") && err.contains("-q") && err.contains("-d"), "{err}");
    assert!(!refused.exists(), "a refused conversion wrote {}", refused.display());
    // A group size MLX does not have is refused for the output too.
    let g16 = QuantSpec { mode: QuantMode::Affine, bits: 4, group_size: 16 };
    let err = convert(&gguf, &refused, &ConvertOptions { quantize: Some(g16), ..Default::default() })
        .unwrap_err()
        .to_string();
    assert!(err.contains("group_size = 16"), "{err}");

    // -d: exactly llama.cpp's values, dense f32: the oracle's own checkpoint, up to summation order.
    let dense = out_dir("dense");
    convert(&gguf, &dense, &ConvertOptions { dequantize: true, ..Default::default() }).unwrap();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dense.join("config.json")).unwrap()).unwrap();
    assert!(config.get("quantization").is_none(), "{config}");
    let (model, _) = nuvec_lm::load(dense.to_str().unwrap()).unwrap();
    check_against_oracle(&model, &ids(&oracle["prompt_ids"]), &dir);

    // -q: the groups of 16 requantized by MLX's algorithm, the rest (Q4_K, Q5_K, Q8_0) kept
    // exactly; mlx-lm loads it and answers as nuvec does on the same directory.
    let requantized = out_dir("requantized");
    let spec = QuantSpec { mode: QuantMode::Affine, bits: 6, group_size: 32 };
    convert(&gguf, &requantized, &ConvertOptions { quantize: Some(spec), ..Default::default() }).unwrap();
    let text = std::fs::read_to_string(requantized.join("config.json")).unwrap();
    assert!(!text.contains("\"group_size\": 16"), "{text}");
    let ours = our_tokens(&requantized, 24, prompt);
    assert!(!ours.is_empty());
    assert_eq!(mlx_lm_tokens(&requantized, 24, prompt), ours, "mlx-lm vs nuvec on the requantized checkpoint");
    for d in [dense, requantized] {
        std::fs::remove_dir_all(d).ok();
    }
}
