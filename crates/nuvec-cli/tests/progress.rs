//! The progress bars: the prefill's of `nuvec cache-prompt` and `nuvec generate`, drawn in a real
//! terminal (tmux) while a long prompt is prefilled in many passes, and cleared afterwards;
//! `nuvec convert`'s dequantizing (script(1) gives it a terminal); absent when stderr is a pipe,
//! where the output is what it was without the bar.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::{gguf, tmux};

/// Polls the pane until `done` shows; returns whether `bar` showed at some point, and the last
/// screen.
fn watch(session: &str, bar: &str, done: &str) -> (bool, String) {
    let (start, mut seen) = (Instant::now(), false);
    loop {
        let screen = tmux(session, &["capture-pane", "-p", "-t", session]);
        seen |= screen.contains(bar);
        if screen.contains(done) || start.elapsed() > Duration::from_secs(120) {
            return (seen, screen);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A prompt of about 650 tokens, in a file.
fn long_prompt(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("nuvec-progress-{name}-{}.txt", std::process::id()));
    let text =
        (0..150).map(|i| format!("Line {i}: the quick brown fox jumps over the lazy dog.\n")).collect::<String>();
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_long_prefill_shows_a_bar_in_a_terminal() {
    let prompt = long_prompt("tty");
    let cache = std::env::temp_dir().join(format!("nuvec-progress-{}.safetensors", std::process::id()));
    let bin = env!("CARGO_BIN_EXE_nuvec");
    let runs = [
        (
            "cache",
            format!(
                "{bin} cache-prompt --model {} -f {} --prompt-cache-file {} --prefill-step-size 8; sleep 30",
                gguf(),
                prompt.display(),
                cache.display()
            ),
            "Saved ",
        ),
        (
            "generate",
            format!(
                "{bin} generate --model {} -f {} --prefill-step-size 8 -m 4 --ignore-chat-template; sleep 30",
                gguf(),
                prompt.display()
            ),
            "Peak memory",
        ),
    ];
    for (name, command, done) in runs {
        let session = format!("nuvec-progress-{name}-{}", std::process::id());
        tmux(&session, &["new-session", "-d", "-s", &session, "-x", "160", "-y", "40", &command]);
        let (seen, screen) = watch(&session, "Prefill [", done);
        tmux(&session, &["kill-session", "-t", &session]);
        assert!(screen.contains(done), "{name}: did not finish: {screen}");
        assert!(seen, "{name}: no progress bar while prefilling: {screen}");
        assert!(!screen.contains("Prefill ["), "{name}: the bar was not cleared: {screen}");
    }
    let _ = std::fs::remove_file(&cache);
    let _ = std::fs::remove_file(&prompt);
}

#[test]
fn no_bar_when_stderr_is_not_a_terminal() {
    let prompt = long_prompt("pipe");
    let cache = std::env::temp_dir().join(format!("nuvec-progress-pipe-{}.safetensors", std::process::id()));
    let (p, c) = (prompt.to_str().unwrap(), cache.to_str().unwrap());
    let out = Command::new(env!("CARGO_BIN_EXE_nuvec"))
        .args(["cache-prompt", "--model", &gguf(), "-f", p, "--prompt-cache-file", c, "--prefill-step-size", "64"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("Processed ") && !err.contains("Prefill"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_nuvec"))
        .args(["generate", "--model", &gguf(), "-f", p, "--prefill-step-size", "64", "-m", "4"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("Prefill") && !String::from_utf8_lossy(&out.stdout).contains("Prefill"), "{err}");
    let _ = std::fs::remove_file(&cache);
    let _ = std::fs::remove_file(&prompt);
}

#[test]
fn convert_draws_its_stages_in_a_terminal_only() {
    // `nuvec convert -d` of the default GGUF dequantizes its 211 quantized weights: a
    // "Dequantize [...] n/211 tensors" bar in a terminal (the script(1) log of one), none piped.
    let bin = env!("CARGO_BIN_EXE_nuvec");
    let dir = |name: &str| std::env::temp_dir().join(format!("nuvec-progress-convert-{name}-{}", std::process::id()));
    let (tty, piped, log) = (dir("tty"), dir("pipe"), dir("log"));
    let command = format!("{bin} convert --hf-path {} --mlx-path {} -d", gguf(), tty.display());
    let status = Command::new("script").args(["-qc", &command, log.to_str().unwrap()]).output();
    let status = status.unwrap_or_else(|e| panic!("script(1) is needed for this test ({e})"));
    let screen = String::from_utf8_lossy(&std::fs::read(&log).unwrap()).into_owned();
    assert!(status.status.success() && screen.contains("Saved to"), "{screen}");
    assert!(screen.contains("Dequantize [") && screen.contains("/211 tensors"), "no bar in a terminal: {screen}");
    let out = Command::new(bin)
        .args(["convert", "--hf-path", &gguf(), "--mlx-path", piped.to_str().unwrap(), "-d"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !err.contains("Dequantize"), "{err}");
    for d in [&tty, &piped] {
        let _ = std::fs::remove_dir_all(d);
    }
    let _ = std::fs::remove_file(&log);
}
