//! Perplexity against mlx_lm.perplexity (the oracle venv's mlx-lm running its own load_data and
//! eval_ppl, tests/support/mlx_perplexity.py): numpy's permutation reproduced, the same windows
//! token for token from text and chat records, and the same perplexity within 0.5 % on the real
//! SmolLM2 and a tiny random Llama; batching the windows changes only rounding.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::fixtures;
use nuvec_lm::perplexity::{evaluate, numpy_permutation, Dataset, Format};
use nuvec_lm::{load_dir, Tokenizer};
use serde_json::{json, Value};

fn oracle(args: &[&str]) -> Value {
    let python = std::env::var("NUVEC_ORACLE_PYTHON").expect("NUVEC_ORACLE_PYTHON is not set: run scripts/test.sh");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/mlx_perplexity.py");
    let out = Command::new(python).arg(&script).args(args).output().expect("run the oracle's python");
    assert!(out.status.success(), "mlx_perplexity.py {args:?}:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A dataset folder holding `records` as train.jsonl.
fn dataset_dir(name: &str, records: &[Value]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nuvec-perplexity-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lines: Vec<String> = records.iter().map(Value::to_string).collect();
    std::fs::write(dir.join("train.jsonl"), lines.join("\n") + "\n").unwrap();
    dir
}

/// Sentences of varied length from a fixed word list (a linear congruential walk).
fn text_records(n: usize) -> Vec<Value> {
    const WORDS: [&str; 24] = [
        "the", "model", "reads", "a", "long", "river", "of", "tokens", "and", "each", "one", "predicts", "what",
        "comes", "next", "in", "quiet", "rooms", "people", "write", "small", "stories", "about", "rain",
    ];
    let mut state = 12345u64;
    (0..n)
        .map(|i| {
            let len = 5 + i * 7 % 40;
            let words: Vec<&str> = (0..len)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    WORDS[(state >> 33) as usize % WORDS.len()]
                })
                .collect();
            json!({"text": format!("{}.", words.join(" "))})
        })
        .collect()
}

fn windows_of(v: &Value) -> Vec<Vec<u32>> {
    serde_json::from_value(v["windows"].clone()).unwrap()
}

#[test]
fn the_permutation_is_numpy_s() {
    for seed in [0u32, 7, 123, u32::MAX] {
        let sizes = [1usize, 2, 3, 10, 257, 1000];
        let mut args = vec!["perm".to_string(), seed.to_string()];
        args.extend(sizes.iter().map(usize::to_string));
        let want = oracle(&args.iter().map(String::as_str).collect::<Vec<_>>());
        for (i, &n) in sizes.iter().enumerate() {
            let want: Vec<usize> = serde_json::from_value(want[i].clone()).unwrap();
            assert_eq!(numpy_permutation(seed, n), want, "seed {seed}, n {n}");
        }
    }
}

/// nuvec's windows and perplexity over `records` (the dataset `name`) against mlx-lm's on the
/// checkpoint `case`.
fn check(case: &str, name: &str, records: &[Value], (length, samples, batch, seed): (usize, usize, usize, u32)) {
    let model_dir = fixtures().join(case);
    let data = dataset_dir(&format!("{name}-{}", case.replace('/', "-")), records);
    let args = [length, samples, batch].map(|n| n.to_string());
    let want = oracle(&[
        "ppl",
        model_dir.to_str().unwrap(),
        data.to_str().unwrap(),
        &args[0],
        &args[1],
        &args[2],
        &seed.to_string(),
    ]);
    let (model, tokenizer) = load_dir(&model_dir).unwrap();
    let dataset = Dataset::open(&data).unwrap();
    let windows = dataset.windows(&tokenizer, length, Some(samples), seed).unwrap();
    assert_eq!(windows, windows_of(&want), "{case}: the windows");
    let got = evaluate(&model, &windows, batch, |_, _| {}).unwrap();
    let (ppl, se) = (want["ppl"].as_f64().unwrap(), want["se"].as_f64().unwrap());
    let rel = (got.perplexity - ppl).abs() / ppl;
    eprintln!(
        "RESULT {case}: perplexity {:.4} ± {:.4} against mlx-lm's {ppl:.4} ± {se:.4} ({rel:.2e} apart)",
        got.perplexity, got.standard_error
    );
    assert!(rel < 0.005, "{case}: perplexity {} against mlx-lm's {ppl}", got.perplexity);
    assert!((got.standard_error - se).abs() / se < 0.02, "{case}: standard error {} against {se}", got.standard_error);
    assert_eq!(got.tokens, samples * (length - 1));
    // Windows one a pass: the same to rounding.
    let alone = evaluate(&model, &windows, 1, |_, _| {}).unwrap();
    assert!((alone.perplexity - got.perplexity).abs() / got.perplexity < 1e-4, "{case}: batched and alone");
    std::fs::remove_dir_all(&data).ok();
}

#[test]
fn text_records_score_as_mlx_lm_scores_them() {
    let records = text_records(40);
    check("smollm2-q4_1", "text", &records, (48, 6, 4, 7));
    check("llama-q4g64", "text", &records, (32, 5, 2, 123));
}

#[test]
fn chat_records_go_through_the_template() {
    let records: Vec<Value> = (0..12)
        .map(|i| {
            json!({"messages": [
                {"role": "user", "content": format!("What is {i} plus {}?", i * 3)},
                {"role": "assistant", "content": format!("It is {}.", i * 4)},
            ]})
        })
        .collect();
    let dir = dataset_dir("chat-format", &records);
    assert_eq!(Dataset::open(&dir).unwrap().format(), Format::Chat);
    std::fs::remove_dir_all(&dir).ok();
    check("smollm2-q4_1", "chat", &records, (40, 4, 3, 5));
}

#[test]
fn bad_datasets_are_refused_naming_the_input() {
    let tokenizer = Tokenizer::load(&fixtures().join("smollm2-q4_1"), &[]).unwrap();
    let err = |dir: &Path| Dataset::open(dir).err().map(|e| e.to_string()).unwrap_or_default();
    let missing = std::env::temp_dir().join("nuvec-perplexity-no-such-dataset");
    assert!(err(&missing).contains("does not download"), "{}", err(&missing));
    let empty = std::env::temp_dir().join(format!("nuvec-perplexity-empty-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    assert!(err(&empty).contains("no train.jsonl"), "{}", err(&empty));
    std::fs::write(empty.join("train.jsonl"), "{\"title\": \"x\"}\n").unwrap();
    assert!(err(&empty).contains("\"text\""), "{}", err(&empty));
    std::fs::write(empty.join("train.jsonl"), "{\"text\": \"a\"}\nnot json\n").unwrap();
    assert!(err(&empty).contains("line 2"), "{}", err(&empty));
    // Too little text for the windows asked: an error saying how much there is.
    std::fs::write(empty.join("train.jsonl"), "{\"text\": \"a short line\"}\n").unwrap();
    let dataset = Dataset::open(&empty).unwrap();
    let short = dataset.windows(&tokenizer, 512, Some(4), 123).unwrap_err().to_string();
    assert!(short.contains("fewer than 4 windows of 512"), "{short}");
    std::fs::remove_dir_all(&empty).ok();
}
