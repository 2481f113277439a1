//! LoRA and DoRA adapters made by mlx-lm's own layers (`tests/support/mlx_adapter.py`: its
//! `linear_to_lora_layers` on the tiny checkpoints, adapter values drawn so they matter, saved
//! as `mlx_lm.lora` saves them): nuvec with the adapter gives mlx-lm's greedy tokens and
//! first-step logits (`mlx_lm.load(path, adapter_path=…)`), and `nuvec fuse`'s checkpoint loads
//! in mlx-lm and answers as the adapter does. Adapters nuvec does not apply (MoE experts) are
//! errors naming them.

mod common;

use std::path::Path;

use common::fixtures;
use common::mlx_adapter::{mlx_run, oracle, prompt, scratch, STEPS};
use nuvec_lm::convert::{convert, ConvertOptions};
use nuvec_lm::{generate, load_with, GenerateOptions, LoadOptions, Model};

/// f32 logits: nuvec and mlx-lm sum in other orders.
const TOLERANCE: f32 = 2e-3;

fn ours(model: &Model, prompt: &[u32]) -> (Vec<u32>, Vec<f32>) {
    let logits = model.forward_last(prompt, &mut model.new_cache()).unwrap().to_vec::<f32>().unwrap();
    let options = GenerateOptions { max_tokens: STEPS, ignore_eos: true, ..Default::default() };
    (generate(model, prompt, options).unwrap().map(|t| t.unwrap()).collect(), logits)
}

fn load(dir: &Path, adapter: Option<&Path>) -> Model {
    let options = LoadOptions { adapter_path: adapter.map(Path::to_path_buf), ..Default::default() };
    load_with(dir.to_str().unwrap(), &options).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).0
}

/// Ours against mlx-lm's run: the first logits within the tolerance, the tokens equal up to a
/// step where mlx-lm's own top two are that close.
fn assert_agrees(
    what: &str,
    (tokens, logits): &(Vec<u32>, Vec<f32>),
    (want, first, margins): &(Vec<u32>, Vec<f32>, Vec<f32>),
) {
    let diff = logits.iter().zip(first).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(logits.len() == first.len() && diff <= TOLERANCE, "{what}: first-step logits differ by {diff}");
    if let Some(step) = tokens.iter().zip(want).position(|(a, b)| a != b) {
        assert!(margins[step] <= 2.0 * TOLERANCE, "{what}: step {step}: {tokens:?} vs mlx-lm's {want:?}");
    }
}

#[test]
fn adapters_answer_as_mlx_lm_with_them() {
    // Both kinds over dense and 4-bit weights, with and without biases (DoRA rescales before the bias).
    let cases = [("llama-f32", "lora"), ("qwen3-f32", "dora"), ("qwen3-q4g64", "lora"), ("llama-bias-q4g64", "dora")];
    for (case, kind) in cases {
        let dir = fixtures().join(case);
        let adapter = scratch(&format!("{case}-{kind}"));
        oracle(&["make", "--model", dir.to_str().unwrap(), "--out", adapter.to_str().unwrap(), "--kind", kind])
            .unwrap();
        let prompt = prompt(&dir);
        let what = format!("{case} {kind}");
        let want = mlx_run(&dir, Some(&adapter), &prompt);
        let got = ours(&load(&dir, Some(&adapter)), &prompt);
        assert_agrees(&what, &got, &want);
        // The adapter matters: without it, other logits.
        let (_, plain) = ours(&load(&dir, None), &prompt);
        let moved = plain.iter().zip(&got.1).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(moved > 0.1, "{what}: the adapter moved no logit ({moved})");
        // A prompt of more rows than one pass of the few-row adapter op takes (64).
        let long: Vec<u32> = prompt.iter().cycle().take(100).copied().collect();
        let want = mlx_run(&dir, Some(&adapter), &long);
        assert_agrees(&format!("{what}, 100-token prompt"), &ours(&load(&dir, Some(&adapter)), &long), &want);
        let _ = std::fs::remove_dir_all(&adapter);
    }
}

#[test]
fn a_fused_checkpoint_answers_as_the_adapter_in_mlx_lm() {
    for (case, kind, dequantize) in [("llama-f32", "dora", false), ("qwen3-q4g64", "lora", true)] {
        let dir = fixtures().join(case);
        let adapter = scratch(&format!("fuse-{case}-{kind}"));
        let fused = scratch(&format!("fused-{case}-{kind}"));
        oracle(&["make", "--model", dir.to_str().unwrap(), "--out", adapter.to_str().unwrap(), "--kind", kind])
            .unwrap();
        let options = ConvertOptions { adapter: Some(adapter.clone()), dequantize, ..Default::default() };
        convert(dir.to_str().unwrap(), &fused, &options).unwrap();
        let prompt = prompt(&dir);
        let what = format!("{case} {kind} fused");
        let (tokens, logits, _) = mlx_run(&fused, None, &prompt);
        let want = mlx_run(&dir, Some(&adapter), &prompt);
        assert_agrees(&what, &(tokens, logits), &want);
        assert_agrees(&format!("{what}, by nuvec"), &ours(&load(&fused, None), &prompt), &want);
        for d in [&adapter, &fused] {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

#[test]
fn a_requantized_fuse_matches_mlx_lm_s_own_fuse() {
    // mlx_lm.fuse requantizes a fused 4-bit weight with the weight's own settings: the same
    // checkpoint's tensors, value for value within a rounding step of the quantizer.
    let dir = fixtures().join("qwen3-q4g64");
    let adapter = scratch("requant-adapter");
    let (ours_dir, theirs) = (scratch("requant-ours"), scratch("requant-theirs"));
    oracle(&["make", "--model", dir.to_str().unwrap(), "--out", adapter.to_str().unwrap(), "--kind", "lora"]).unwrap();
    let options = ConvertOptions { adapter: Some(adapter.clone()), ..Default::default() };
    convert(dir.to_str().unwrap(), &ours_dir, &options).unwrap();
    let args = ["fuse", "--model", dir.to_str().unwrap(), "--adapter-path", adapter.to_str().unwrap()];
    oracle(&[&args[..], &["--save-path", theirs.to_str().unwrap()]].concat()).unwrap();
    let prompt = prompt(&dir);
    let want = mlx_run(&theirs, None, &prompt);
    let got = mlx_run(&ours_dir, None, &prompt);
    assert_agrees("qwen3-q4g64 lora requantized", &(got.0, got.1), &want);
    for d in [&adapter, &ours_dir, &theirs] {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[test]
fn adapters_nuvec_does_not_apply_are_errors() {
    // mlx-lm's default keys put LoRA on Qwen3-MoE's router and its stacked experts.
    let dir = fixtures().join("qwen3_moe-f32");
    let adapter = scratch("moe");
    oracle(&["make", "--model", dir.to_str().unwrap(), "--out", adapter.to_str().unwrap(), "--kind", "lora"]).unwrap();
    let options = LoadOptions { adapter_path: Some(adapter.clone()), ..Default::default() };
    let err = load_with(dir.to_str().unwrap(), &options).err().unwrap().to_string();
    assert!(err.contains("switch_mlp") && err.contains("not supported"), "{err}");
    // Restricted to attention, the same model takes it.
    let keys = "self_attn.q_proj,self_attn.v_proj";
    let attention = scratch("moe-attention");
    let made = ["make", "--model", dir.to_str().unwrap(), "--out", attention.to_str().unwrap(), "--kind", "lora"];
    oracle(&[&made[..], &["--keys", keys]].concat()).unwrap();
    let prompt = prompt(&dir);
    let want = mlx_run(&dir, Some(&attention), &prompt);
    assert_agrees("qwen3_moe attention lora", &ours(&load(&dir, Some(&attention)), &prompt), &want);
    // A broken config names the file and the fix.
    std::fs::write(attention.join("adapter_config.json"), r#"{"lora_parameters": {"rank": 4, "alpha": 8}}"#).unwrap();
    let options = LoadOptions { adapter_path: Some(attention.clone()), ..Default::default() };
    let err = load_with(dir.to_str().unwrap(), &options).err().unwrap().to_string();
    assert!(err.contains("adapter_config.json") && err.contains("scale"), "{err}");
    for d in [&adapter, &attention] {
        let _ = std::fs::remove_dir_all(d);
    }
}
