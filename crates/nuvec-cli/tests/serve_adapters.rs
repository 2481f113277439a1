//! `nuvec serve --lora-modules NAME=PATH`: adapters chosen per request by `model`, driven by the
//! real OpenAI SDK (`serve_adapters.py`, installed by scripts/setup-serve-tests.sh): each
//! request, batched with the others, answers as `nuvec generate --adapter-path` does alone (the
//! adapters made by mlx-lm's own layers, crates/nuvec-lm/tests/support/mlx_adapter.py; their
//! values against mlx-lm are nuvec-lm's tests/served_adapters.rs). Bad flags are refused.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::served::Served;

fn nuvec(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nuvec")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn make_adapter(model: &Path, kind: &str, seed: u32) -> PathBuf {
    let python = std::env::var("NUVEC_ORACLE_PYTHON").expect("NUVEC_ORACLE_PYTHON is not set: run scripts/test.sh");
    let out = std::env::temp_dir().join(format!("nuvec-serve-adapter-{kind}-{seed}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../nuvec-lm/tests/support/mlx_adapter.py");
    let (m, o) = (model.to_str().unwrap(), out.to_str().unwrap());
    let made = Command::new(python)
        .arg(script)
        .args(["make", "--model", m, "--out", o, "--kind", kind, "--seed", &seed.to_string()])
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    out
}

/// `nuvec generate`'s greedy continuation of "hello world" on `model` with `extra` flags.
fn solo(model: &Path, extra: &[&str]) -> String {
    let m = model.to_str().unwrap();
    let args =
        ["generate", "--model", m, "-p", "hello world", "-m", "12", "--ignore-chat-template", "--verbose", "false"];
    let (ok, out, err) = nuvec(&[&args[..], extra].concat());
    assert!(ok, "{err}");
    out.strip_suffix('\n').unwrap_or(&out).to_string()
}

#[test]
fn each_request_runs_with_the_adapter_it_names() {
    let fixtures = std::env::var("NUVEC_FIXTURES").expect("NUVEC_FIXTURES is not set: run scripts/test.sh");
    let model = Path::new(&fixtures).join("llama-f32");
    let (a, b) = (make_adapter(&model, "lora", 0), make_adapter(&model, "dora", 1));
    let (pa, pb) = (a.to_str().unwrap(), b.to_str().unwrap());
    let expected = serde_json::json!({
        "llama-f32": solo(&model, &[]),
        "tuned": solo(&model, &["--adapter-path", pa]),
        "other": solo(&model, &["--adapter-path", pb]),
    });
    assert_ne!(expected["tuned"], expected["llama-f32"], "the adapter changed nothing: {expected}");
    assert_ne!(expected["tuned"], expected["other"], "the adapters answer alike: {expected}");
    let (tuned, other) = (format!("tuned={pa}"), format!("other={pb}"));
    let served = Served::start_model(model.to_str().unwrap(), &["--lora-modules", &tuned, "--lora-modules", &other]);

    let python = std::env::var("NUVEC_OPENAI_PYTHON").unwrap_or_else(|_| {
        panic!("NUVEC_OPENAI_PYTHON is not set: run scripts/test.sh (it runs scripts/setup-serve-tests.sh)")
    });
    let script = format!("{}/tests/serve_adapters.py", env!("CARGO_MANIFEST_DIR"));
    let base = format!("{}/v1", served.base);
    let out = Command::new(&python).args([&script, &base, &expected.to_string()]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.lines().last() == Some("ok"),
        "{stdout}\n{}\nserver:\n{}",
        String::from_utf8_lossy(&out.stderr),
        served.log()
    );
    drop(served);

    // A malformed flag, two adapters of one name, a missing folder, an adapter beside
    // --adapter-path, an adapter named as the model: refused before serving.
    let m = model.to_str().unwrap();
    let same = format!("llama-f32={pa}");
    for (flags, says) in [
        (vec!["--lora-modules", pa], "NAME=PATH"),
        (vec!["--lora-modules", &tuned, "--lora-modules", &tuned], "two served adapters are named \"tuned\""),
        (vec!["--lora-modules", "x=/nonexistent/adapter"], "/nonexistent/adapter"),
        (vec!["--lora-modules", &tuned, "--adapter-path", pb], "nuvec fuse"),
        (vec!["--lora-modules", &same], "another name"),
    ] {
        let (ok, _, err) = nuvec(&[&["serve", "--model", m, "--port", "0"][..], &flags].concat());
        assert!(!ok && err.contains(says), "{flags:?}: {err}");
    }
    for d in [&a, &b] {
        let _ = std::fs::remove_dir_all(d);
    }
}
