//! `nuvec generate --pipeline` on two ranks and `--tensor-parallel` on three, under Open MPI's
//! `mpirun` (scripts/setup-mpi.sh): rank 0 prints mlx-lm's answer from SmolLM2's real weights,
//! once; the others print nothing (and `bench --pipeline` reports once). Started alone, or on a
//! GGUF file, it says what to do instead. `nuvec serve` split the same ways answers concurrent
//! requests (curl) as `nuvec generate` answers each alone on the whole model, and `nuvec chat`
//! split answers a conversation on stdin as it does run whole.
#![cfg(feature = "mpi")]

mod common;

use std::process::Command;

use common::served::Served;
use serde_json::{json, Value};

fn fixture(case: &str) -> String {
    let dir = std::env::var("NUVEC_FIXTURES").expect("NUVEC_FIXTURES is not set: run scripts/test.sh");
    format!("{dir}/{case}")
}

/// `mpirun -n RANKS nuvec ARGS`: (success, stdout, stderr).
fn mpirun(ranks: usize, args: &[&str]) -> (bool, String, String) {
    run_with_input(mpirun_command(ranks).args(args), "")
}

/// `mpirun -n RANKS nuvec`, to which the arguments are added.
fn mpirun_command(ranks: usize) -> Command {
    let mut command = Command::new("mpirun");
    command
        .args(["-n", &ranks.to_string(), "--oversubscribe", env!("CARGO_BIN_EXE_nuvec")])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none");
    command
}

/// Runs `command` with `input` on its stdin: (success, stdout, stderr).
fn run_with_input(command: &mut Command, input: &str) -> (bool, String, String) {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("could not start (mpirun: install Open MPI, scripts/setup-mpi.sh)");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn generate_pipelined_over_two_ranks_answers_like_mlx_lm_once() {
    let model = fixture("smollm2-q4_1");
    let oracle: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{model}/oracle.json")).unwrap()).unwrap();
    let question = oracle["question"].as_str().unwrap();
    let args = ["generate", "--model", &model, "-p", question, "--pipeline", "--pipeline-split", "20,10"];
    let (ok, stdout, stderr) = mpirun(2, &args);
    assert!(ok, "{stdout}\n{stderr}");
    assert_eq!(stdout.trim_end(), oracle["text"].as_str().unwrap(), "{stderr}");
    assert_eq!(stderr.matches("Generation: ").count(), 1, "rank 0 alone reports:\n{stderr}");
    // Stages sized by the ranks' free memory (on one machine, about even).
    let by_memory = ["generate", "--model", &model, "-p", question, "--pipeline", "--pipeline-split", "memory"];
    let (ok, stdout, stderr) = mpirun(2, &by_memory);
    assert!(ok, "{stdout}\n{stderr}");
    assert_eq!(stdout.trim_end(), oracle["text"].as_str().unwrap(), "{stderr}");
    // mlx_lm.benchmark's --pipeline: rank 0 reports, once per trial.
    let bench = ["bench", "--model", &model, "-p", "16", "-g", "8", "-n", "2", "--pipeline"];
    let (ok, stdout, stderr) = mpirun(2, &bench);
    assert!(ok, "{stdout}\n{stderr}");
    assert_eq!(stdout.matches("Trial ").count(), 2, "{stdout}");
    assert_eq!(stdout.matches("Averages: ").count(), 1, "{stdout}");
}

#[test]
fn generate_split_over_three_ranks_answers_like_mlx_lm_once() {
    let model = fixture("smollm2-q4_1");
    let oracle: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{model}/oracle.json")).unwrap()).unwrap();
    let question = oracle["question"].as_str().unwrap();
    let (ok, stdout, stderr) = mpirun(3, &["generate", "--model", &model, "-p", question, "--tensor-parallel"]);
    assert!(ok, "{stdout}\n{stderr}");
    assert_eq!(stdout.trim_end(), oracle["text"].as_str().unwrap(), "{stderr}");
    assert_eq!(stderr.matches("Generation: ").count(), 1, "rank 0 alone reports:\n{stderr}");
    let (ok, _, stderr) = mpirun(2, &["generate", "--model", &model, "-p", question, "--tensor-parallel"]);
    assert!(!ok && stderr.contains("9 query heads do not split evenly over 2 ranks"), "{stderr}");
}

#[test]
fn generate_pipelined_says_how_to_start_it() {
    let model = fixture("smollm2-q4_1");
    let (ok, _, stderr) = common::run_generate(&["--pipeline"]);
    assert!(!ok && stderr.contains("start every rank with `mpirun -n N"), "{stderr}");
    let gguf = common::gguf();
    let (ok, _, stderr) = mpirun(2, &["generate", "--model", &gguf, "--pipeline"]);
    assert!(!ok && stderr.contains("a GGUF file is converted whole"), "{stderr}");
    let (ok, _, stderr) = mpirun(2, &["generate", "--model", &model, "--pipeline", "--pipeline-split", "1,2"]);
    assert!(!ok && stderr.contains("30 layers in all"), "{stderr}");
}

/// The text `nuvec generate` gives `prompt` (`max_tokens` tokens, chat-templated) on `model`
/// run whole, in one process.
fn solo(model: &str, prompt: &str, max_tokens: usize) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_nuvec"))
        .args(["generate", "--model", model, "--verbose", "false", "-p", prompt, "-m", &max_tokens.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim_end_matches('\n').to_string()
}

/// A chat completion's answer from the server at `base`, by curl.
fn chat(base: &str, prompt: &str, max_tokens: usize) -> String {
    let body = json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}).to_string();
    let url = format!("{base}/v1/chat/completions");
    let out = Command::new("curl")
        .args(["-sS", "--fail-with-body", "-H", "content-type: application/json", "--data-binary", &body, &url])
        .output()
        .expect("curl is needed for this test (scripts/setup-serve-tests.sh installs it)");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let answer: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    answer["choices"][0]["message"]["content"].as_str().unwrap_or_else(|| panic!("no answer: {text}")).to_string()
}

#[test]
fn serve_split_across_ranks_answers_concurrent_requests_as_generate_does() {
    let model = fixture("smollm2-q4_1");
    let asked = [("What is the capital of France?", 40), ("Write a haiku about the sea.", 48), ("Count to five.", 24)];
    let expected: Vec<String> = asked.iter().map(|&(p, n)| solo(&model, p, n)).collect();
    for (ranks, split) in [(2, "--pipeline"), (3, "--tensor-parallel")] {
        let mut command = mpirun_command(ranks);
        command.args(["serve", "--model", &model, "--port", "0", split]);
        let served = Served::start_command(command, true);
        let answers: Vec<String> = std::thread::scope(|s| {
            let asking: Vec<_> = asked
                .iter()
                .map(|&(p, n)| {
                    let base = &served.base;
                    s.spawn(move || chat(base, p, n))
                })
                .collect();
            asking.into_iter().map(|a| a.join().unwrap()).collect()
        });
        assert_eq!(answers, expected, "{split} over {ranks} ranks:\n{}", served.log());
        let log = served.log();
        assert_eq!(log.matches("follows rank 0's server").count(), ranks - 1, "{log}");
        assert_eq!(log.matches("listening on").count(), 1, "rank 0 alone listens:\n{log}");
    }
}

#[test]
fn chat_split_across_ranks_answers_as_run_whole() {
    let model = fixture("smollm2-q4_1");
    // Two messages (the second answered on the first's cache), a reset, one more, then 'q'.
    let input = "What is the capital of France?\nAnd of Italy?\nr\nName a colour.\nq\nnever read\n";
    let chat = ["chat", "--model", &model, "-m", "24"];
    let (ok, whole, stderr) = run_with_input(Command::new(env!("CARGO_BIN_EXE_nuvec")).args(chat), input);
    assert!(ok && whole.lines().count() >= 3, "{whole}\n{stderr}");
    for (ranks, split) in [(2, "--pipeline"), (3, "--tensor-parallel")] {
        let (ok, stdout, stderr) = run_with_input(mpirun_command(ranks).args(chat).arg(split), input);
        assert!(ok, "{split}: {stdout}\n{stderr}");
        assert_eq!(stdout, whole, "{split} over {ranks} ranks, rank 0 alone prints:\n{stderr}");
        assert_eq!(stderr.matches("The conversation was reset").count(), 1, "{stderr}");
    }
}
