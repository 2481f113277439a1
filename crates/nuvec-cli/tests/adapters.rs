//! `--adapter-path` and `nuvec fuse` from the command line, on an adapter mlx-lm's own layers
//! made (crates/nuvec-lm/tests/support/mlx_adapter.py; the values against mlx-lm are
//! nuvec-lm's tests/adapters.rs): the adapter changes the answer, the fused checkpoint gives the
//! adapted answer, an existing --save-path is kept, a GGUF base is refused.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

fn nuvec(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nuvec")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nuvec-cli-adapters-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn answer(model: &Path, extra: &[&str]) -> String {
    let m = model.to_str().unwrap();
    let (ok, out, err) = nuvec(
        &[&["generate", "--model", m, "-p", "hello world", "-m", "12", "--ignore-chat-template"][..], extra].concat(),
    );
    assert!(ok, "{err}");
    out
}

#[test]
fn an_adapter_changes_the_answer_and_fuses_into_the_same_one() {
    let fixtures = std::env::var("NUVEC_FIXTURES").expect("NUVEC_FIXTURES is not set: run scripts/test.sh");
    let python = std::env::var("NUVEC_ORACLE_PYTHON").expect("NUVEC_ORACLE_PYTHON is not set: run scripts/test.sh");
    let model = Path::new(&fixtures).join("llama-f32");
    let (adapter, fused) = (scratch("adapter"), scratch("fused"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../nuvec-lm/tests/support/mlx_adapter.py");
    let made = Command::new(python)
        .arg(script)
        .args(["make", "--model", model.to_str().unwrap(), "--out", adapter.to_str().unwrap(), "--kind", "lora"])
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let a = adapter.to_str().unwrap();

    let fuse = || {
        let (m, f) = (model.to_str().unwrap(), fused.to_str().unwrap());
        nuvec(&["fuse", "--model", m, "--adapter-path", a, "--save-path", f])
    };
    let adapted = answer(&model, &["--adapter-path", a]);
    assert_ne!(adapted, answer(&model, &[]), "the adapter changed nothing");
    let (ok, _, err) = fuse();
    assert!(ok && err.contains("Saved the fused model"), "{err}");
    assert_eq!(answer(&fused, &[]), adapted, "the fused checkpoint answers otherwise");

    // An existing output is not replaced without --force.
    let config = std::fs::read(fused.join("config.json")).unwrap();
    let (ok, _, err) = fuse();
    assert!(!ok && err.contains("--force"), "{err}");
    assert_eq!(std::fs::read(fused.join("config.json")).unwrap(), config);

    let (ok, _, err) = nuvec(&["generate", "--model", &common::gguf(), "-p", "hi", "-m", "2", "--adapter-path", a]);
    assert!(!ok && err.contains("GGUF") && err.contains("adapter"), "{err}");
    let (ok, _, err) =
        nuvec(&["generate", "--model", model.to_str().unwrap(), "-p", "hi", "--adapter-path", "/nonexistent/adapter"]);
    assert!(!ok && err.contains("/nonexistent/adapter/adapter_config.json"), "{err}");
    for d in [&adapter, &fused] {
        let _ = std::fs::remove_dir_all(d);
    }
}
