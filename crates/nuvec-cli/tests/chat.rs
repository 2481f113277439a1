//! `nuvec chat` end to end on the default model: over a pipe, and in a real terminal (tmux,
//! driven with send-keys and read with capture-pane).

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{gguf, tmux};

#[test]
fn chat_over_a_pipe_keeps_the_conversation() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_nuvec"))
        .args(["chat", "--model", &gguf(), "-m", "30"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"What is the capital of France?\nAnd of Germany?\nq\nnot read\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].contains("Paris"), "{text}");
    assert!(lines[1].contains("Berlin"), "the second turn sees the first: {text}");
}

fn wait_for(session: &str, needle: &str) -> String {
    let start = Instant::now();
    loop {
        let screen = tmux(session, &["capture-pane", "-p", "-t", session]);
        if screen.contains(needle) || start.elapsed() > Duration::from_secs(60) {
            eprintln!("waited {:?} for {needle:?}", start.elapsed());
            return screen;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn chat_in_a_terminal() {
    let session = format!("nuvec-chat-{}", std::process::id());
    let command = format!("{} chat --model {} -m 30; sleep 30", env!("CARGO_BIN_EXE_nuvec"), gguf());
    tmux(&session, &["new-session", "-d", "-s", &session, "-x", "160", "-y", "40", &command]);
    let screen = wait_for(&session, ">>"); // capture-pane drops the prompt's trailing space
    assert!(screen.contains("'q' quits"), "{screen}");
    tmux(&session, &["send-keys", "-t", &session, "What is the capital of France?", "Enter"]);
    let screen = wait_for(&session, "Paris");
    tmux(&session, &["send-keys", "-t", &session, "r", "Enter"]);
    let after_reset = wait_for(&session, "was reset");
    tmux(&session, &["send-keys", "-t", &session, "q", "Enter"]);
    tmux(&session, &["kill-session", "-t", &session]);
    assert!(screen.contains("Paris"), "{screen}");
    assert!(after_reset.contains("The conversation was reset"), "{after_reset}");
}
