//! `nuvec generate --pipeline` on two ranks and `--tensor-parallel` on three, under Open MPI's
//! `mpirun` (scripts/setup-mpi.sh): rank 0 prints mlx-lm's answer from SmolLM2's real weights,
//! once; the others print nothing (and `bench --pipeline` reports once). Started alone, or on a GGUF file, it says what to do instead.
#![cfg(feature = "mpi")]

mod common;

use std::process::Command;

fn fixture(case: &str) -> String {
    let dir = std::env::var("NUVEC_FIXTURES").expect("NUVEC_FIXTURES is not set: run scripts/test.sh");
    format!("{dir}/{case}")
}

/// `mpirun -n RANKS nuvec ARGS`: (success, stdout, stderr).
fn mpirun(ranks: usize, args: &[&str]) -> (bool, String, String) {
    let out = Command::new("mpirun")
        .args(["-n", &ranks.to_string(), "--oversubscribe", env!("CARGO_BIN_EXE_nuvec")])
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        .output()
        .expect("mpirun could not start: install Open MPI (scripts/setup-mpi.sh)");
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
