//! Helpers shared by the CLI's test binaries (each binary uses some of them).
#![allow(dead_code)]

pub mod served;

use std::process::Command;

/// The default GGUF model scripts/test.sh installs.
pub fn gguf() -> String {
    std::env::var("NUVEC_DEFAULT_GGUF").unwrap_or_else(|_| panic!("NUVEC_DEFAULT_GGUF is not set: run scripts/test.sh"))
}

/// `nuvec generate --model <default> ARGS`: (success, stdout, stderr).
pub fn run_generate(args: &[&str]) -> (bool, String, String) {
    let out =
        Command::new(env!("CARGO_BIN_EXE_nuvec")).args(["generate", "--model", &gguf()]).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}
