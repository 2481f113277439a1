//! `nuvec perplexity` on the default model: mlx_lm.perplexity's report, the value the library
//! computes (tests/perplexity.rs in nuvec-lm holds it against mlx-lm's), `--num-samples -1`,
//! and bad flags and datasets refused naming them.

use std::path::PathBuf;
use std::process::Command;

mod common;

use common::gguf;
use nuvec_lm::perplexity::{evaluate, Dataset};

/// `nuvec perplexity ARGS`: (success, stdout, stderr).
fn perplexity(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nuvec")).arg("perplexity").args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// A dataset folder of 20 short text records, `name`d (each test its own: they run in parallel).
fn dataset(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nuvec-cli-perplexity-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lines: Vec<String> = (0..20)
        .map(|i| {
            let text = format!("Record {i} says that {} apples and {} pears make {} fruit in all.", i, i * 2, i * 3);
            serde_json::json!({ "text": text }).to_string()
        })
        .collect();
    std::fs::write(dir.join("train.jsonl"), lines.join("\n")).unwrap();
    dir
}

#[test]
fn perplexity_reports_as_mlx_lm_does() {
    let dir = dataset("report");
    let data = dir.to_str().unwrap();
    let model = gguf();
    let args = ["--model", &model, "--data-path", data, "--sequence-length", "32", "--num-samples", "3"];
    let (ok, out, err) = perplexity(&[&args[..], &["--batch-size", "2", "--seed", "9"]].concat());
    assert!(ok, "{out}{err}");
    for line in ["Loaded 3 samples", "EVALUATION RESULTS", "Tokens per second:", "Total tokens: 96"] {
        assert!(out.contains(line), "no {line:?} in:\n{out}");
    }
    let printed = out.lines().find_map(|l| l.strip_prefix("Perplexity: ")).unwrap_or_else(|| panic!("{out}"));
    // The library's value for the same windows.
    let (m, tokenizer) = nuvec_lm::load(&model).unwrap();
    let windows = Dataset::open(&dir).unwrap().windows(&tokenizer, 32, Some(3), 9).unwrap();
    let want = evaluate(&m, &windows, 2, |_, _| {}).unwrap();
    assert_eq!(printed, format!("{:.3} ± {:.3}", want.perplexity, want.standard_error));
    // Every whole window the text holds.
    let all = windows_in(&dir, &tokenizer, 32);
    let (ok, out, err) =
        perplexity(&["--model", &model, "--data-path", data, "--sequence-length", "32", "--num-samples", "-1"]);
    assert!(ok && out.contains(&format!("Loaded {all} samples")), "{out}{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// How many windows of `length` the whole dataset makes.
fn windows_in(dir: &std::path::Path, tokenizer: &nuvec_lm::Tokenizer, length: usize) -> usize {
    Dataset::open(dir).unwrap().windows(tokenizer, length, None, 0).unwrap().len()
}

#[test]
fn bad_flags_and_datasets_are_refused() {
    let dir = dataset("refused");
    let data = dir.to_str().unwrap();
    let model = gguf();
    for (flags, says) in [
        (&["--num-samples", "0"][..], "--num-samples 0"),
        (&["--batch-size", "0"], "--batch-size"),
        (&["--sequence-length", "1"], "--sequence-length"),
        (&["--num-samples", "1000"], "fewer than 1000 windows"),
    ] {
        let (ok, out, err) = perplexity(&[&["--model", &model, "--data-path", data][..], flags].concat());
        assert!(!ok && err.contains(says), "{flags:?}: {out}{err}");
    }
    let (ok, _, err) = perplexity(&["--model", &model, "--data-path", "allenai/tulu-3-sft-mixture"]);
    assert!(!ok && err.contains("does not download Hugging Face datasets"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
