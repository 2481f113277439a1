//! `nuvec generate`'s structured-output flags on the default model: the text meets the
//! constraint, the statistics report what compiling it took, a bad one is refused naming it.

use std::process::Command;

fn gguf() -> String {
    std::env::var("NUVEC_DEFAULT_GGUF").unwrap_or_else(|_| panic!("NUVEC_DEFAULT_GGUF is not set: run scripts/test.sh"))
}

/// `nuvec generate --model <default> ARGS`: (success, stdout, stderr).
fn generate(args: &[&str]) -> (bool, String, String) {
    let out =
        Command::new(env!("CARGO_BIN_EXE_nuvec")).args(["generate", "--model", &gguf()]).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn the_text_meets_the_constraint_and_its_cost_is_reported() {
    let (ok, text, err) = generate(&["--prompt", "Is the sky blue?", "--choice", "yes", "no"]);
    assert!(ok, "{err}");
    assert!(["yes\n", "no\n"].contains(&text.as_str()), "{text:?}");
    assert!(err.contains("Constraint: vocabulary built in") && err.contains("grammar compiled in"), "{err}");
    let (ok, text, err) = generate(&["--prompt", "A three-digit number:", "--regex", "[0-9]{3}"]);
    assert!(ok, "{err}");
    let digits = text.trim_end_matches('\n');
    assert!(digits.len() == 3 && digits.bytes().all(|b| b.is_ascii_digit()), "{text:?}");
    let (ok, _, err) = generate(&["--prompt", "x", "--regex", "[0-9"]);
    assert!(!ok && err.contains("regex"), "{err}");
}
