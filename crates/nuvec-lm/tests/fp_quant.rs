//! Checkpoints in MLX's floating-point quantization modes (mxfp4, mxfp8, nvfp4, and a per-layer
//! mix of them with affine and dense layers), written by mlx_lm.convert, and a Qwen3-MoE in nvfp4
//! with per-expert global scales (mlx_lm.utils.quantize_model; its oracle is mlx-lm on the
//! same weights with those experts dequantized by mx.dequantize, since mlx's CPU cannot run
//! them), recorded by scripts/oracle/more/fp_quant.py in `$NUVEC_FIXTURES/fp_quant/<case>`:
//! - teacher-forced on mlx-lm's greedy tokens, our logits match its recorded ones (the first
//!   step's full vector, then the top 16 of every step) within f32 summation error, and decoding
//!   freely we produce its tokens up to the first near-tie (as tests/parity.rs checks);
//! - `convert` with a floating-point mode writes mlx_lm.convert's tensors bit for bit, and its
//!   config entry;
//! - a config that contradicts its tensors, or an invalid mode/bits pair, is refused clearly.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use nuvec::io::SafetensorsFile;
use nuvec::{Array, DType, QuantMode, QuantSpec};
use nuvec_lm::convert::{convert, ConvertOptions};
use nuvec_lm::sample::argmax;
use nuvec_lm::Model;

/// Summation order alone: the tolerance of an f32 computation (tests/parity.rs's).
const TOLERANCE: f32 = 2e-3;

fn fp_cases() -> Vec<PathBuf> {
    cases_in(&fixtures().join("fp_quant"))
}

fn logits_after(model: &Model, tokens: &[u32], cache: &mut [nuvec_lm::cache::LayerCache]) -> Vec<f32> {
    model.forward_last(tokens, cache).unwrap().to_vec::<f32>().unwrap()
}

fn check_case(dir: &Path) -> Result<String, String> {
    let name = dir.file_name().unwrap().to_string_lossy().to_string();
    let oracle = oracle_json(dir);
    let (model, tokenizer) = nuvec_lm::load_dir(dir).map_err(|e| format!("{name}: load failed: {e}"))?;
    let prompt = ids(&oracle["prompt_ids"]);
    let ours = tokenizer.encode(oracle["prompt"].as_str().unwrap(), true).unwrap();
    if ours != prompt {
        return Err(format!("{name}: prompt ids {ours:?} != mlx-lm's {prompt:?}"));
    }
    let GreedyRecord { tokens, margins, first, top_ids, top_logits, k } = greedy_record(dir, &oracle);

    let mut cache = model.new_cache();
    let mut logits = logits_after(&model, &prompt, &mut cache);
    if logits.len() != first.len() {
        return Err(format!("{name}: {} logits, mlx-lm has {}", logits.len(), first.len()));
    }
    let first_diff = logits.iter().zip(&first).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    if first_diff > TOLERANCE {
        return Err(format!("{name}: first-step logits differ by up to {first_diff} (tolerance {TOLERANCE})"));
    }
    let mut worst = 0f32;
    for (step, &token) in tokens.iter().enumerate() {
        for j in 0..k {
            let id = top_ids[step * k + j] as usize;
            let theirs = top_logits[step * k + j];
            let diff = (logits[id] - theirs).abs();
            worst = worst.max(diff);
            if diff > TOLERANCE {
                return Err(format!("{name}: step {step}, token {id}: logit {} vs mlx-lm {theirs}", logits[id]));
            }
        }
        let ours = argmax(&logits);
        if ours != token && margins[step] > 2.0 * TOLERANCE {
            return Err(format!("{name}: step {step}: argmax {ours}, mlx-lm {token} (margin {})", margins[step]));
        }
        logits = logits_after(&model, &[token], &mut cache);
    }
    let mut cache = model.new_cache();
    let mut logits = logits_after(&model, &prompt, &mut cache);
    let mut agreed = 0;
    for (step, &token) in tokens.iter().enumerate() {
        let ours = argmax(&logits);
        if ours != token {
            if margins[step] > 2.0 * TOLERANCE {
                return Err(format!("{name}: free-running step {step}: {ours} vs {token} (margin {})", margins[step]));
            }
            break; // a near-tie: the two runs may part here legitimately
        }
        agreed += 1;
        logits = logits_after(&model, &[ours], &mut cache);
    }
    Ok(format!(
        "{name}: first step max diff {first_diff:.2e}, worst top-{k} diff {worst:.2e}, {agreed}/{} free-running tokens equal",
        tokens.len()
    ))
}

#[test]
fn every_fp_case_matches_mlx_lm() {
    let cases = fp_cases();
    let mut failures = vec![];
    for dir in &cases {
        match check_case(dir) {
            Ok(line) => eprintln!("{line}"),
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{} cases differ from mlx-lm:\n{}", failures.len(), failures.join("\n"));
    // llama and qwen3 (tied embeddings), each in mxfp4, mxfp8, nvfp4 and the per-layer mix, and
    // Qwen3-MoE in nvfp4 with per-expert global scales.
    assert_eq!(cases.len(), 9, "expected 9 fp_quant cases, found {cases:?}");
}

fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nuvec-fpquant-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    dir
}

/// A tensor's stored bytes, for bit-for-bit comparison.
fn stored(a: &Array) -> Vec<u8> {
    match a.dtype() {
        DType::U32 => a.to_vec::<u32>().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::U8 => a.to_vec::<u8>().unwrap(),
        _ => a.to_f32_vec().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

fn config(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

#[test]
fn convert_writes_mlx_lm_convert_tensors() {
    let source = fixtures().join("llama-f32");
    for mode in [QuantMode::Mxfp4, QuantMode::Mxfp8, QuantMode::Nvfp4] {
        let (bits, group_size) = mode.defaults();
        let dir = out_dir(mode.name());
        let options = ConvertOptions {
            quantize: Some(QuantSpec { mode, bits, group_size }),
            dtype: Some(DType::F32),
            ..Default::default()
        };
        convert(source.to_str().unwrap(), &dir, &options).unwrap();
        let reference = fixtures().join(format!("fp_quant/llama-{}", mode.name()));
        let theirs = SafetensorsFile::open(reference.join("model.safetensors")).unwrap();
        let ours = SafetensorsFile::open(dir.join("model.safetensors")).unwrap();
        let mut names: Vec<&String> = theirs.tensors().keys().collect();
        names.sort();
        let mut ours_names: Vec<&String> = ours.tensors().keys().collect();
        ours_names.sort();
        assert_eq!(names, ours_names, "{}: tensor names", mode.name());
        for name in names {
            let (a, b) = (theirs.array(name).unwrap(), ours.array(name).unwrap());
            assert_eq!((a.dtype(), a.shape()), (b.dtype(), b.shape()), "{name}");
            assert!(stored(&a) == stored(&b), "{}: {name} differs from mlx_lm.convert's", mode.name());
        }
        assert_eq!(config(&dir)["quantization"], config(&reference)["quantization"], "{}", mode.name());

        // Dequantized (as mlx_lm.convert -d: bfloat16 weights), it loads with no quantized tensor.
        let dense = out_dir(&format!("{}-dense", mode.name()));
        convert(dir.to_str().unwrap(), &dense, &ConvertOptions { dequantize: true, ..Default::default() }).unwrap();
        assert!(config(&dense).get("quantization").is_none());
        let file = SafetensorsFile::open(dense.join("model.safetensors")).unwrap();
        assert_eq!(file.tensors()["lm_head.weight"].dtype, DType::BF16);
        assert!(!file.tensors().keys().any(|n| n.ends_with(".scales")));
        nuvec_lm::load_dir(&dense).unwrap();
        std::fs::remove_dir_all(&dir).ok();
        std::fs::remove_dir_all(&dense).ok();
    }
}

/// A copy of fixture case `case` whose config.json's `quantization` is edited by `edit`.
fn with_config(case: &str, label: &str, edit: impl Fn(&mut serde_json::Value)) -> PathBuf {
    let src = fixtures().join("fp_quant").join(case);
    let dir = out_dir(label);
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    let mut c = config(&dir);
    for key in ["quantization", "quantization_config"] {
        edit(&mut c[key]);
    }
    std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&c).unwrap()).unwrap();
    dir
}

/// Edits a config's quantization entry.
type Edit = Box<dyn Fn(&mut serde_json::Value)>;

#[test]
fn contradictions_and_invalid_modes_are_refused() {
    let cases: [(&str, &str, Edit, &[&str]); 4] = [
        ("llama-mxfp4", "bits8", Box::new(|q| q["bits"] = 8.into()), &["config.json", "mode mxfp4 needs bits = 4"]),
        ("llama-nvfp4", "group32", Box::new(|q| q["group_size"] = 32.into()), &["nvfp4 needs", "group_size = 16"]),
        (
            "llama-fpmixed",
            "wrong-mode",
            Box::new(|q| {
                q["model.layers.0.mlp.down_proj"] = serde_json::json!({"group_size": 32, "bits": 4, "mode": "mxfp4"})
            }),
            &["down_proj.weight", "config.json says mode mxfp4", "mxfp8"],
        ),
        ("llama-fpmixed", "unknown-mode", Box::new(|q| q["mode"] = "fp6".into()), &["\"fp6\"", "mxfp4, mxfp8, nvfp4"]),
    ];
    for (case, label, edit, wanted) in cases {
        let dir = with_config(case, label, edit);
        let err = nuvec_lm::load_dir(&dir).map(|_| ()).unwrap_err().to_string();
        for w in wanted {
            assert!(err.contains(w), "{case} ({label}): {err:?} should mention {w:?}");
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
