//! `nuvec bench --workload`: a workload file served through the Batcher on the default model,
//! with and without a structured-output constraint on every request, and with speculation.

use std::process::Command;

mod common;

use common::gguf;

/// `nuvec bench --model <default> ARGS`: (success, stdout + stderr).
fn bench(args: &[&str]) -> (bool, String) {
    bench_with(&[], args)
}

/// [`bench`] with environment variables `vars` set.
fn bench_with(vars: &[(&str, &str)], args: &[&str]) -> (bool, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_nuvec"));
    command.args(["bench", "--model", &gguf()]).args(args).envs(vars.iter().copied());
    let out = command.output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// The number after the first `key` (`generated=`, ` throughput=`) of a workload report.
fn number<T: std::str::FromStr>(report: &str, key: &str) -> T {
    let at = report.find(key).unwrap_or_else(|| panic!("no {key} in {report}")) + key.len();
    let text = report[at..].split_whitespace().next().unwrap();
    text.parse().unwrap_or_else(|_| panic!("{key}{text} is not a number"))
}

/// The `generated=N` of a workload report.
fn generated(report: &str) -> usize {
    number(report, "generated=")
}

#[test]
fn workloads_run_with_and_without_a_constraint() {
    let dir = std::env::temp_dir().join(format!("nuvec-bench-workload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("workload.json");
    let requests: Vec<_> = (0..3)
        .map(|i| serde_json::json!({"arrival": 0.0, "max_tokens": 12, "prompt": [1, 504 + i, 2000, 3000 + i, 17]}))
        .collect();
    std::fs::write(&path, serde_json::json!({"concurrency": 3, "requests": requests}).to_string()).unwrap();
    let file = path.to_str().unwrap();
    // Plain: end-of-sequence ignored, so every request makes its 12 tokens.
    let (ok, plain) = bench(&["--workload", file]);
    assert!(ok && plain.contains("Workload results: throughput="), "{plain}");
    assert_eq!(generated(&plain), 36, "{plain}");
    // Total throughput counts the 15 prompt tokens beside the 36 generated, over the same time.
    let (output, total): (f64, f64) = (number(&plain, " throughput="), number(&plain, "total_throughput="));
    assert!((total / output - 51.0 / 36.0).abs() < 1e-3, "{plain}");
    // Where the time went: the prompts' tokens but the last (sampled from) were prefilled, by
    // some steps; the other steps only decoded.
    let steps = plain.lines().find(|l| l.starts_with("Workload steps: ")).unwrap_or_else(|| panic!("{plain}"));
    let numbers: Vec<f64> = steps
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|w| w.trim_end_matches('.').parse().ok())
        .collect();
    let [decode_steps, _, mixed_steps, _, prefill_tokens] = numbers[..] else { panic!("{steps}") };
    assert_eq!(prefill_tokens, 12.0, "{steps}");
    assert!(decode_steps >= 1.0 && mixed_steps >= 1.0, "{steps}");
    // Pipelined steps (off by default): the same tokens, the steps counted.
    let (ok, pipelined) = bench_with(&[("NUVEC_BATCH_PIPELINE", "1")], &["--workload", file]);
    assert!(ok && generated(&pipelined) == 36, "{pipelined}");
    assert!(number::<usize>(&pipelined, "pipelined_steps=") > 0, "{pipelined}");
    assert!(!plain.contains("Workload pipeline:"), "{plain}");
    let (ok, refused) = bench_with(&[("NUVEC_BATCH_PIPELINE", "yes")], &["--workload", file]);
    assert!(!ok && refused.contains("NUVEC_BATCH_PIPELINE"), "{refused}");
    // `-b` pipelines its decode loop as the Batcher would.
    let (ok, batched) = bench_with(&[("NUVEC_BATCH_PIPELINE", "1")], &["-p", "6", "-g", "5", "-b", "3", "-n", "1"]);
    assert!(ok && batched.contains("generation_tps="), "{batched}");
    // Sampled at a temperature: drawn on the host by default on the CPU, where the logits are
    // with NUVEC_DEVICE_SAMPLING=1 (the same tokens either way: the Batcher's tests).
    let (ok, sampled) = bench(&["--workload", file, "--temp", "0.8"]);
    assert!(ok && generated(&sampled) == 36, "{sampled}");
    assert_eq!(number::<usize>(&sampled, "drawn_on_device="), 0, "{sampled}");
    let (ok, drawn) = bench_with(&[("NUVEC_DEVICE_SAMPLING", "1")], &["--workload", file, "--temp", "0.8"]);
    assert!(ok && generated(&drawn) == 36, "{drawn}");
    assert_eq!(number::<usize>(&drawn, "drawn_on_device=") + number::<usize>(&drawn, "drawn_again="), 36, "{drawn}");
    assert!(!plain.contains("Workload sampling:"), "{plain}");
    let (ok, refused) = bench(&["--workload", file, "--temp=-1"]);
    assert!(!ok && refused.contains("temperature"), "{refused}");
    // With prompt-lookup speculation: the same token count, and the guesses reported.
    let (ok, guessed) = bench(&["--workload", file, "--prompt-lookup", "--num-draft-tokens", "2"]);
    assert!(ok && generated(&guessed) == 36, "{guessed}");
    assert!(guessed.contains("Workload speculation: drafted="), "{guessed}");
    // The three requests decode together from the first step to the last: with at most one
    // speculating decode a step, no step guesses; with three, steps do. The same tokens.
    let drafted = |report: &str| number::<usize>(report, "drafted=");
    for (most, guesses) in [("1", false), ("3", true)] {
        let args = ["--workload", file, "--prompt-lookup", "--speculation-max-batch", most];
        let (ok, report) = bench(&args);
        assert!(ok && generated(&report) == 36, "{report}");
        assert_eq!(drafted(&report) > 0, guesses, "--speculation-max-batch {most}: {report}");
    }
    let (ok, refused) = bench(&["--workload", file, "--speculation-max-batch", "4"]);
    assert!(!ok && refused.contains("--prompt-lookup"), "{refused}");
    // With a draft model: the same count, the guesses reported.
    let (ok, drafted) = bench(&["--workload", file, "--draft-model", &gguf(), "--num-draft-tokens", "2"]);
    assert!(ok && generated(&drafted) == 36, "{drafted}");
    assert!(drafted.contains("Workload speculation: drafted="), "{drafted}");
    // Held to a choice: each request ends with its grammar, after the few tokens of a word.
    let (ok, chosen) = bench(&["--workload", file, "--choice", "yes", "no"]);
    assert!(ok, "{chosen}");
    let n = generated(&chosen);
    assert!((3..=9).contains(&n), "three one-word answers, {n} tokens: {chosen}");
    // The random-prompt tests' flags would be ignored beside a workload: refused.
    for flag in [&["-p", "8"][..], &["-b", "2"], &["-d", "4"], &["-o", "json"], &["--no-warmup"]] {
        let (ok, refused) = bench(&[&["--workload", file][..], flag].concat());
        assert!(!ok && refused.contains("cannot be used with"), "{flag:?}: {refused}");
    }
    // The constraint flags are for workloads only.
    let (ok, refused) = bench(&["--regex", "a+", "-p", "4", "-g", "2", "-n", "1"]);
    assert!(!ok && refused.contains("--workload"), "{refused}");
    std::fs::remove_dir_all(&dir).ok();
}
