//! Downloading a repo id from the Hub: against `tests/support/hub_server.py` (the Hub's listing
//! and resolve routes over a local folder, with redirects, a token, a transfer cut short and a
//! corrupted file on demand), each test with a server and a cache of its own. The fixture served
//! is a tiny mlx-lm checkpoint; what lands in the cache is checked file by file, by generating
//! with it, and by `huggingface_hub` itself (the oracle's venv) finding the same snapshot.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::{fixtures, oracle_json};
use nuvec_lm::hub::{resolve_with, HubOptions, DEFAULT_ALLOW_PATTERNS};
use nuvec_lm::{generate, GenerateOptions};

const REPO: &str = "org/tiny";
/// What the server answers as the repo's commit.
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

struct Hub {
    child: Child,
    endpoint: String,
    log: PathBuf,
    cache: PathBuf,
}

impl Drop for Hub {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(self.cache.parent().unwrap());
    }
}

/// The checkpoint served: config, weights, tokenizer, template, and mlx-lm's records (which a
/// download must leave out: `oracle.safetensors` is not `model*.safetensors`).
fn served() -> PathBuf {
    fixtures().join("llama-q4g64")
}

fn start(test: &str, flags: &[&str]) -> Hub {
    let root = std::env::temp_dir().join(format!("nuvec-hub-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let log = root.join("requests.jsonl");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/support/hub_server.py");
    let mut child = Command::new("python3")
        .arg(script)
        .args(["--repo-dir", served().to_str().unwrap(), "--repo-id", REPO, "--commit", COMMIT, "--log"])
        .arg(&log)
        .args(flags)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs the test Hub");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let port = line.trim().strip_prefix("PORT ").unwrap_or_else(|| panic!("the test Hub said {line:?}"));
    Hub { child, endpoint: format!("http://127.0.0.1:{port}"), log, cache: root.join("hub") }
}

impl Hub {
    fn options(&self) -> HubOptions {
        HubOptions {
            endpoint: self.endpoint.clone(),
            cache: Some(self.cache.clone()),
            retries: 0,
            ..HubOptions::default()
        }
    }

    /// The requests the server saw: (method, path, Range header).
    fn requests(&self) -> Vec<(String, String, Option<String>)> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                let s = |k: &str| v[k].as_str().map(str::to_string);
                (s("method").unwrap(), s("path").unwrap(), s("range"))
            })
            .collect()
    }

    fn repo_dir(&self) -> PathBuf {
        self.cache.join("models--org--tiny")
    }

    /// Every file under the repo's cache folder, relative to it.
    fn files(&self) -> Vec<String> {
        fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let p = e.path();
                match p.symlink_metadata().unwrap().is_dir() {
                    true => walk(&p, root, out),
                    false => out.push(p.strip_prefix(root).unwrap().display().to_string()),
                }
            }
        }
        let mut out = vec![];
        walk(&self.repo_dir(), &self.repo_dir(), &mut out);
        out.sort();
        out
    }
}

fn greedy(path: &Path) -> Vec<u32> {
    let (model, _) = nuvec_lm::load_dir(path).unwrap();
    let prompt: Vec<u32> =
        oracle_json(&served())["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let options = GenerateOptions { max_tokens: 8, ignore_eos: true, ..Default::default() };
    generate(&model, &prompt, options).unwrap().map(|t| t.unwrap()).collect()
}

#[test]
fn a_repo_id_downloads_into_the_cache_layout_huggingface_hub_reads() {
    let hub = start("whole", &["--redirect", "--token", "secret"]);
    let options = HubOptions { token: Some("secret".into()), ..hub.options() };
    let snapshot = resolve_with(REPO, &options).unwrap();
    assert_eq!(snapshot, hub.repo_dir().join("snapshots").join(COMMIT));
    let wanted = [
        "chat_template.jinja",
        "config.json",
        "model.safetensors",
        "model.safetensors.index.json",
        "oracle.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ];
    for name in wanted {
        let link = snapshot.join(name);
        let target = std::fs::read_link(&link).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(target.starts_with("../../blobs"), "{name} links to {}", target.display());
        assert_eq!(std::fs::read(&link).unwrap(), std::fs::read(served().join(name)).unwrap(), "{name}");
    }
    assert!(!snapshot.join("oracle.safetensors").exists(), "a file outside the allow-patterns was fetched");
    assert_eq!(std::fs::read_to_string(hub.repo_dir().join("refs/main")).unwrap(), COMMIT);
    assert!(!hub.files().iter().any(|f| f.ends_with(".incomplete")), "{:?}", hub.files());
    // The LFS file's bytes came from the redirect's target, the token sent to the Hub's address.
    let got = hub.requests();
    assert!(got.iter().any(|(m, p, _)| m == "GET" && p.starts_with("/cdn/")), "{got:?}");
    assert_eq!(greedy(&snapshot), greedy(&served()), "the downloaded checkpoint generates other tokens");

    // Found again without the network: the server sees no new request, offline or not.
    let before = hub.requests().len();
    assert_eq!(resolve_with(REPO, &options).unwrap(), snapshot);
    assert_eq!(resolve_with(REPO, &HubOptions { offline: true, ..options.clone() }).unwrap(), snapshot);
    assert_eq!(hub.requests().len(), before);

    // huggingface_hub (what mlx-lm and transformers call) finds the same snapshot, offline.
    let Some(python) = std::env::var_os("NUVEC_ORACLE_PYTHON") else {
        panic!("NUVEC_ORACLE_PYTHON is not set: run `scripts/test.sh` (the oracle's venv has huggingface_hub)");
    };
    let patterns = serde_json::to_string(&DEFAULT_ALLOW_PATTERNS).unwrap();
    let code = format!(
        "from huggingface_hub import snapshot_download\n\
         print(snapshot_download('{REPO}', cache_dir={:?}, local_files_only=True, allow_patterns={patterns}))",
        hub.cache.display().to_string()
    );
    let out = Command::new(python).args(["-c", &code]).env("HF_HUB_OFFLINE", "1").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), snapshot.display().to_string());
}

#[test]
fn a_transfer_cut_short_resumes_where_it_stopped() {
    let cut = 3_000_000;
    let hub = start("cut", &["--cut", &format!("model.safetensors:{cut}")]);
    let err = resolve_with(REPO, &hub.options()).unwrap_err().to_string();
    assert!(err.contains("model.safetensors") && err.contains("next run resumes"), "{err}");
    let part: Vec<String> = hub.files().into_iter().filter(|f| f.ends_with(".incomplete")).collect();
    assert_eq!(part.len(), 1, "{:?}", hub.files());
    assert_eq!(std::fs::metadata(hub.repo_dir().join(&part[0])).unwrap().len(), cut);
    assert!(!hub.repo_dir().join("refs/main").exists(), "a partial download was recorded as the snapshot");
    // The next run asks for the rest only.
    let snapshot = resolve_with(REPO, &hub.options()).unwrap();
    let range = format!("bytes={cut}-");
    assert!(
        hub.requests().iter().any(|(m, _, r)| m == "GET" && r.as_deref() == Some(range.as_str())),
        "{:?}",
        hub.requests()
    );
    let weights = served().join("model.safetensors");
    assert_eq!(std::fs::read(snapshot.join("model.safetensors")).unwrap(), std::fs::read(weights).unwrap());

    // A part already whole (a run stopped between the transfer and its check) is checked, not
    // asked for again (a range from its end would be refused).
    let whole = hub.repo_dir().join("blobs").join(part[0].rsplit('/').next().unwrap().trim_end_matches(".incomplete"));
    let weights_blob = std::fs::canonicalize(snapshot.join("model.safetensors")).unwrap();
    assert_eq!(weights_blob, std::fs::canonicalize(&whole).unwrap());
    std::fs::rename(&whole, hub.repo_dir().join(&part[0])).unwrap();
    std::fs::remove_file(snapshot.join("model.safetensors")).unwrap();
    std::fs::remove_file(hub.repo_dir().join("refs/main")).unwrap();
    let before = hub.requests().len();
    assert_eq!(resolve_with(REPO, &hub.options()).unwrap(), snapshot);
    let asked: Vec<_> = hub.requests()[before..]
        .iter()
        .filter(|(m, p, _)| m == "GET" && p.contains("model.safetensors"))
        .cloned()
        .collect();
    assert!(asked.is_empty(), "a whole part was fetched again: {asked:?}");
    assert!(
        std::fs::read(snapshot.join("model.safetensors")).unwrap()
            == std::fs::read(served().join("model.safetensors")).unwrap()
    );

    // Within one run, with retries: the same cut, resumed without an error.
    let again = start("cut-retry", &["--cut", &format!("model.safetensors:{cut}")]);
    let snapshot = resolve_with(REPO, &HubOptions { retries: 2, ..again.options() }).unwrap();
    assert_eq!(greedy(&snapshot), greedy(&served()));
}

#[test]
fn a_corrupted_file_is_not_kept() {
    for (file, check) in [("model.safetensors", "sha256"), ("config.json", "git blob id")] {
        let hub = start(&format!("corrupt-{}", file.replace('.', "-")), &["--corrupt", file]);
        let err = resolve_with(REPO, &hub.options()).unwrap_err().to_string();
        assert!(err.contains(file) && err.contains("corrupt") && err.contains(check), "{err}");
        let files = hub.files();
        assert!(!files.iter().any(|f| f.ends_with(".incomplete") || f.ends_with(file)), "{files:?}");
        assert!(!hub.repo_dir().join("refs/main").exists());
    }
}

#[test]
fn refusals_name_the_cause_and_the_fix() {
    let hub = start("refused", &["--token", "secret"]);
    let err = resolve_with(REPO, &hub.options()).unwrap_err().to_string();
    assert!(err.contains("401") && err.contains("set HF_TOKEN"), "{err}");
    let wrong = HubOptions { token: Some("wrong".into()), ..hub.options() };
    let err = resolve_with(REPO, &wrong).unwrap_err().to_string();
    assert!(err.contains("401") && err.contains("token given"), "{err}");
    let options = HubOptions { token: Some("secret".into()), ..hub.options() };
    let err = resolve_with("org/other", &options).unwrap_err().to_string();
    assert!(err.contains("404") && err.contains("check the repo id"), "{err}");
    let err = resolve_with(REPO, &HubOptions { revision: "v9".into(), ..options.clone() }).unwrap_err().to_string();
    assert!(err.contains("no revision \"v9\"") && err.contains("--revision"), "{err}");
    let err = resolve_with(REPO, &HubOptions { revision: "../x".into(), ..options.clone() }).unwrap_err().to_string();
    assert!(err.contains("revision \"../x\""), "{err}");
    let offline = HubOptions { offline: true, ..options.clone() };
    let err = resolve_with(REPO, &offline).unwrap_err().to_string();
    assert!(err.contains("downloads are off") && err.contains("--offline"), "{err}");
    assert!(!hub.cache.exists() || hub.files().is_empty(), "{:?}", hub.files());
    // A commit asked for by hash is downloaded and found again by it, without refs.
    let by_commit = HubOptions { revision: COMMIT.into(), ..options };
    let snapshot = resolve_with(REPO, &by_commit).unwrap();
    assert!(!hub.repo_dir().join("refs").join(COMMIT).exists());
    assert_eq!(resolve_with(REPO, &HubOptions { offline: true, ..by_commit }).unwrap(), snapshot);
}
