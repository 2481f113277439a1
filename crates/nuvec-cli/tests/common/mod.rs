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

/// Runs tmux on a server of `session`'s own: a session killed ends its server, and a new
/// session asked of a server still shutting down (another test's) never starts.
pub fn tmux(session: &str, args: &[&str]) -> String {
    let out = Command::new("tmux")
        .args(["-L", session])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("tmux is needed for this test ({e})"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}
