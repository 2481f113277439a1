//! `--model org/name` downloads a repo not in the cache (`HF_ENDPOINT`: the test Hub of
//! tests/support/hub_server.py, serving a tiny mlx-lm checkpoint), with a bar per file in a
//! terminal (script(1) gives one), none when piped; `--offline` and `--revision` as huggingface_hub
//! reads them.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const COMMIT: &str = "89abcdef0123456789abcdef0123456789abcdef";

struct Hub(Child, String);

impl Drop for Hub {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start() -> Hub {
    let fixtures = std::env::var("NUVEC_FIXTURES").expect("NUVEC_FIXTURES is not set: run scripts/test.sh");
    let repo = Path::new(&fixtures).join("llama-q4g64");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/support/hub_server.py");
    let mut child = Command::new("python3")
        .arg(script)
        .args(["--repo-dir", repo.to_str().unwrap(), "--repo-id", "org/tiny", "--commit", COMMIT, "--redirect"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs the test Hub");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let port = line.trim().strip_prefix("PORT ").unwrap_or_else(|| panic!("the test Hub said {line:?}")).to_string();
    Hub(child, format!("http://127.0.0.1:{port}"))
}

fn cache(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nuvec-cli-download-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn generate(hub: &Hub, cache: &Path, extra: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nuvec"))
        .args(["generate", "--model", "org/tiny", "-p", "hello", "-m", "3", "--ignore-chat-template"])
        .args(extra)
        .env("HF_ENDPOINT", &hub.1)
        .env("HF_HUB_CACHE", cache)
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HF_TOKEN")
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn a_repo_id_is_downloaded_with_a_bar_in_a_terminal_only() {
    let hub = start();
    let (tty, piped) = (cache("tty"), cache("pipe"));
    let (ok, _, err) = generate(&hub, &piped, &["--offline"]);
    assert!(!ok && err.contains("org/tiny") && err.contains("downloads are off"), "{err}");
    assert!(!piped.exists(), "--offline wrote to the cache");
    let (ok, _, err) = generate(&hub, &piped, &["--revision", "v2"]);
    assert!(!ok && err.contains("no revision \"v2\""), "{err}");

    let (ok, out, err) = generate(&hub, &piped, &[]);
    assert!(ok, "{err}");
    assert!(!err.contains("Download ") && !out.contains("Download "), "a bar on a pipe: {err}");
    let snapshot = piped.join("models--org--tiny/snapshots").join(COMMIT);
    assert!(snapshot.join("model.safetensors").exists());
    // Found in the cache again, offline, and the same text.
    let (ok, again, err) = generate(&hub, &piped, &["--offline"]);
    assert!(ok, "{err}");
    assert_eq!(again, out);

    let log = cache("log");
    let command = format!(
        "HF_ENDPOINT={} HF_HUB_CACHE={} {} generate --model org/tiny -p hello -m 3 --ignore-chat-template",
        hub.1,
        tty.display(),
        env!("CARGO_BIN_EXE_nuvec")
    );
    let status = Command::new("script").args(["-qc", &command, log.to_str().unwrap()]).output();
    let status = status.unwrap_or_else(|e| panic!("script(1) is needed for this test ({e})"));
    let screen = String::from_utf8_lossy(&std::fs::read(&log).unwrap()).into_owned();
    assert!(status.status.success(), "{screen}");
    assert!(screen.contains("Download tokenizer.json ["), "no download bar in a terminal: {screen}");
    for dir in [&tty, &piped, &log] {
        let _ = std::fs::remove_dir_all(dir);
        let _ = std::fs::remove_file(dir);
    }
}
