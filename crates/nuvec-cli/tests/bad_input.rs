//! What a user can get wrong on the command line: every case exits with 1 (never a panic's 101
//! or a signal), says what was wrong with which input, and changes nothing outside what the
//! user named. Each test works in a scratch directory holding a sentinel file that must survive.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn env_path(name: &str) -> PathBuf {
    std::env::var_os(name).map(PathBuf::from).unwrap_or_else(|| panic!("{name} is not set: run `scripts/test.sh`"))
}

/// A tiny random Llama checkpoint made by mlx-lm (with a real tokenizer).
fn small_model() -> PathBuf {
    env_path("NUVEC_FIXTURES").join("llama-f32")
}

fn gguf() -> String {
    env_path("NUVEC_DEFAULT_GGUF").display().to_string()
}

/// A scratch directory with a sentinel file (and a "key" in a hidden folder) in it.
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("nuvec-cli-bad-{name}-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(dir.join(".ssh")).unwrap();
        std::fs::write(dir.join("sentinel.txt"), "keep me").unwrap();
        std::fs::write(dir.join(".ssh/id_ed25519"), "secret").unwrap();
        Scratch { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    /// Every file below the directory with its contents.
    fn snapshot(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    out.insert(path.strip_prefix(root).unwrap().join(""), vec![]);
                    walk(&path, root, out);
                } else {
                    out.insert(path.strip_prefix(root).unwrap().to_path_buf(), std::fs::read(&path).unwrap());
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(&self.dir, &self.dir, &mut out);
        out
    }

    fn names(&self) -> Vec<String> {
        self.snapshot().keys().map(|p| p.display().to_string()).collect()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

fn nuvec_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nuvec")).current_dir(dir).args(args).output().expect("run nuvec")
}

/// `nuvec` with the size of any file it writes capped at `kib` KiB: writes past it fail as on a
/// full disk (EFBIG; the signal that would kill it is ignored, as a shell's trap leaves it).
fn nuvec_with_file_limit(dir: &Path, kib: usize, args: &[&str]) -> Output {
    let quoted: Vec<String> = args.iter().map(|a| format!("'{}'", a.replace('\'', "'\\''"))).collect();
    let script = format!("ulimit -f {kib}; trap '' XFSZ; exec '{}' {}", env!("CARGO_BIN_EXE_nuvec"), quoted.join(" "));
    Command::new("bash").current_dir(dir).args(["-c", &script]).output().expect("run bash")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Exit code 1 and an error that mentions every one of `parts`.
fn assert_refused(out: &Output, parts: &[&str]) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "exit status {:?}, stderr: {err}", out.status);
    assert!(!err.contains("panicked"), "{err}");
    for p in parts {
        assert!(err.contains(p), "the error does not mention {p:?}: {err}");
    }
    err
}

fn convert(dir: &Path, out: &str, force: bool) -> Output {
    let source = small_model();
    let mut args = vec!["convert", "--hf-path", source.to_str().unwrap(), "--mlx-path", out];
    if force {
        args.push("--force");
    }
    nuvec_in(dir, &args)
}

#[test]
fn convert_force_never_deletes_what_is_not_a_model() {
    let s = Scratch::new("convert-foreign");
    let before = s.snapshot();
    // The scratch directory itself holds a key and a sentinel: as --mlx-path, by name and as ".".
    let named = s.dir.display().to_string();
    let err = assert_refused(&convert(&std::env::temp_dir(), &named, true), &["--mlx-path", ".ssh", "sentinel.txt"]);
    assert!(err.contains("--force replaces only a model checkpoint"), "{err}");
    assert_refused(&convert(&s.dir, ".", true), &["--mlx-path", "working directory"]);
    // $HOME.
    let home = Command::new(env!("CARGO_BIN_EXE_nuvec"))
        .current_dir("/")
        .env("HOME", &s.dir)
        .args(["convert", "--hf-path", small_model().to_str().unwrap(), "--mlx-path", &named, "--force"])
        .output()
        .unwrap();
    assert_refused(&home, &["--mlx-path", "home"]);
    // A directory holding the source (and the source itself).
    let parent = small_model().parent().unwrap().display().to_string();
    assert_refused(&convert(&s.dir, &parent, true), &["--mlx-path", "holds the source"]);
    assert_refused(&convert(&s.dir, small_model().to_str().unwrap(), true), &["holds the source"]);
    assert_eq!(s.snapshot(), before, "a refused convert changed the scratch directory");
}

#[test]
fn convert_replaces_a_model_only_whole_and_only_when_it_loads() {
    let s = Scratch::new("convert-replace");
    let first = convert(&s.dir, "out", false);
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(stderr(&first).contains("Saved"), "{}", stderr(&first));
    let model_files: Vec<String> = s.names().into_iter().filter(|n| n.starts_with("out/")).collect();
    assert!(model_files.contains(&"out/model.safetensors".to_string()), "{model_files:?}");
    // Without --force an existing output is refused, as mlx_lm.convert does.
    assert_refused(&convert(&s.dir, "out", false), &["--mlx-path", "out", "already exists", "--force"]);
    // A full disk in the middle of writing the new one leaves the old one as it was.
    let before = s.snapshot();
    let source = small_model();
    let full = nuvec_with_file_limit(
        &s.dir,
        64,
        &["convert", "--hf-path", source.to_str().unwrap(), "--mlx-path", "out", "--force"],
    );
    assert_refused(&full, &["out", "File too large"]);
    assert_eq!(s.snapshot(), before, "a failed convert left something behind or changed the old output");
    // With --force a checkpoint directory is replaced by the new one.
    std::fs::write(s.path("out/config.json"), "{\"model_type\": \"stale\"}").unwrap();
    let again = convert(&s.dir, "out", true);
    assert!(again.status.success(), "{}", stderr(&again));
    let config = std::fs::read_to_string(s.path("out/config.json")).unwrap();
    assert!(config.contains("\"llama\""), "{config}");
    assert_eq!(std::fs::read(s.path("sentinel.txt")).unwrap(), b"keep me");
    let leftovers: Vec<String> = s.names().into_iter().filter(|n| n.contains("nuvec-")).collect();
    assert!(leftovers.is_empty(), "temporary entries left: {leftovers:?}");
}

fn cache_prompt(dir: &Path, file: &str, extra: &[&str]) -> Output {
    let model = gguf();
    let mut args = vec![
        "cache-prompt",
        "--model",
        model.as_str(),
        "-p",
        "Remember: the code is 1234.",
        "--prompt-cache-file",
        file,
    ];
    args.extend_from_slice(extra);
    nuvec_in(dir, &args)
}

#[test]
fn cache_prompt_refuses_to_overwrite_other_files_before_the_prefill() {
    let s = Scratch::new("cache-prompt");
    std::fs::write(s.path("model.safetensors"), "my weights").unwrap();
    let before = s.snapshot();
    let err = assert_refused(
        &cache_prompt(&s.dir, "model.safetensors", &[]),
        &["model.safetensors", "not a nuvec prompt cache", "--force"],
    );
    assert!(!err.contains("Processed"), "refused only after the prefill: {err}");
    let err = assert_refused(&cache_prompt(&s.dir, ".ssh", &[]), &[".ssh", "is a directory"]);
    assert!(!err.contains("Processed"), "{err}");
    let err =
        assert_refused(&cache_prompt(&s.dir, "no/such/dir/c.safetensors", &[]), &["no/such/dir", "does not exist"]);
    assert!(!err.contains("Processed"), "{err}");
    assert_eq!(s.snapshot(), before);

    // A prompt cache may be made, and made again over itself.
    for _ in 0..2 {
        let made = cache_prompt(&s.dir, "c.safetensors", &[]);
        assert!(made.status.success(), "{}", stderr(&made));
    }
    // A full disk: the error names the file and the cause, the old cache stays, no partial file.
    let before = s.snapshot();
    let model = gguf();
    let full = nuvec_with_file_limit(
        &s.dir,
        16,
        &["cache-prompt", "--model", &model, "-p", "Another prompt entirely.", "--prompt-cache-file", "c.safetensors"],
    );
    let err = assert_refused(&full, &["c.safetensors", "File too large"]);
    assert!(!err.contains("IoError(Os"), "{err}");
    assert_eq!(s.snapshot(), before, "a failed save changed the directory");
    // --force replaces a file that is not a prompt cache.
    let forced = cache_prompt(&s.dir, "model.safetensors", &["--force"]);
    assert!(forced.status.success(), "{}", stderr(&forced));
    assert_eq!(std::fs::read(s.path("sentinel.txt")).unwrap(), b"keep me");
}

#[test]
fn generate_takes_the_model_a_prompt_cache_names_and_words_its_refusals() {
    let s = Scratch::new("prompt-cache");
    let model = gguf();
    let made = cache_prompt(&s.dir, "c.safetensors", &[]);
    assert!(made.status.success(), "{}", stderr(&made));
    // Without --model: the cache's model, not the default one (which is made unloadable here).
    let out = Command::new(env!("CARGO_BIN_EXE_nuvec"))
        .current_dir(&s.dir)
        .env("NUVEC_DEFAULT_MODEL", "/nonexistent/default-model")
        .args(["generate", "--prompt-cache-file", "c.safetensors", "-p", " What is the code?", "-m", "4"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("from the prompt cache"), "{}", stderr(&out));
    // Other KV settings: named as flags, not as a struct.
    let out =
        nuvec_in(&s.dir, &["generate", "--prompt-cache-file", "c.safetensors", "--kv-bits", "4", "-p", "x", "-m", "2"]);
    let err = assert_refused(&out, &["c.safetensors", "--kv-bits 4"]);
    assert!(!err.contains("CacheOptions"), "{err}");
    // A directory, an empty --model.
    assert_refused(
        &nuvec_in(&s.dir, &["generate", "--model", &model, "--prompt-cache-file", ".ssh"]),
        &[".ssh", "is a directory"],
    );
    assert_refused(&nuvec_in(&s.dir, &["generate", "--model", ""]), &["--model is empty"]);
}

#[test]
fn generate_settings_that_cannot_be_right_are_refused_with_their_range() {
    let s = Scratch::new("settings");
    let model = gguf();
    let before = s.snapshot();
    let out = nuvec_in(&s.dir, &["generate", "--model", &model, "--temp", "-1"]);
    assert_refused(&out, &["temperature", "-1", ">= 0"]);
    let out = nuvec_in(&s.dir, &["generate", "--model", &model, "--min-tokens", "5", "-m", "2"]);
    assert_refused(&out, &["min_tokens = 5", "max_tokens = 2"]);
    assert_eq!(s.snapshot(), before);
}

#[test]
fn the_context_limit_refuses_long_prompts_and_ends_long_answers() {
    let s = Scratch::new("context");
    let model = gguf();
    let long = "the quick brown fox jumps over the lazy dog ".repeat(8);
    let out = nuvec_in(&s.dir, &["generate", "--model", &model, "--ignore-chat-template", "-p", &long, "-c", "32"]);
    assert_refused(&out, &["the prompt is", "32 positions", "raise context_length (--ctx-size)"]);
    // Above the model's own context (8192 for SmolLM2) without the override.
    let out = nuvec_in(&s.dir, &["generate", "--model", &model, "-c", "100000"]);
    assert_refused(&out, &["100000", "8192", "--allow-past-context"]);
    // An answer that fills the context ends there, saying so.
    let out = nuvec_in(
        &s.dir,
        &[
            "generate",
            "--model",
            &model,
            "--ignore-chat-template",
            "-p",
            "Once upon a time",
            "-c",
            "12",
            "-m",
            "50",
            "--ignore-eos",
        ],
    );
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("Finish: length (the context of 12 positions is full)"), "{err}");
    let prompt_tokens: usize = field(&err, "Prompt: ");
    assert_eq!(field::<usize>(&err, "Generation: "), 12 - prompt_tokens, "{err}");
}

/// The number after `label` in mlx-lm's statistics block.
fn field<T: std::str::FromStr>(text: &str, label: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    let line = text.lines().find_map(|l| l.strip_prefix(label)).unwrap_or_else(|| panic!("no {label:?} in {text}"));
    line.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn one_token_has_a_rate_measured_as_mlx_lm_measures_it() {
    let s = Scratch::new("rate");
    let out = nuvec_in(&s.dir, &["generate", "--model", &gguf(), "-m", "1"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let line = err.lines().find(|l| l.starts_with("Generation: 1 tokens, ")).unwrap_or_else(|| panic!("{err}"));
    let rate: f64 =
        line.trim_start_matches("Generation: 1 tokens, ").trim_end_matches(" tokens-per-sec").parse().unwrap();
    // A rate over an interval of zero would print 1e9 (the clamp), over a real one far less.
    assert!(rate.is_finite() && rate > 0.0 && rate < 1e8, "{line}");
}

/// A copy of the small checkpoint in `dir/name` (its large files linked), with `edit` applied.
fn broken_copy(dir: &Path, name: &str, edit: impl FnOnce(&Path)) -> PathBuf {
    let out = dir.join(name);
    std::fs::create_dir_all(&out).unwrap();
    for entry in std::fs::read_dir(small_model()).unwrap() {
        let path = entry.unwrap().path();
        let target = out.join(path.file_name().unwrap());
        if path.metadata().unwrap().len() > 1 << 20 {
            std::os::unix::fs::symlink(&path, &target).unwrap();
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
    edit(&out);
    out
}

fn edit_json(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

#[test]
fn broken_checkpoints_exit_1_naming_the_file_and_field() {
    let s = Scratch::new("checkpoints");
    let eps = broken_copy(&s.dir, "eps", |d| edit_json(&d.join("config.json"), |c| c["rms_norm_eps"] = 0.into()));
    let template = broken_copy(&s.dir, "template", |d| {
        let doubling =
            "{% set s = namespace(t='ab') %}{% for i in range(100) %}{% set s.t = s.t + s.t %}{% endfor %}{{ s.t }}";
        std::fs::write(d.join("chat_template.jinja"), doubling).unwrap();
    });
    let extra = broken_copy(&s.dir, "extra", |d| {
        let tensor = nuvec::Array::from_slice(&[1f32, 2.0], &[2]).unwrap();
        nuvec::io::save_safetensors(
            d.join("extra.safetensors"),
            &[("model.layers.0.unused.weight".into(), tensor)],
            None,
        )
        .unwrap();
        edit_json(&d.join("model.safetensors.index.json"), |i| {
            i["weight_map"]["model.layers.0.unused.weight"] = "extra.safetensors".into()
        });
    });
    let escape = broken_copy(&s.dir, "escape", |d| {
        edit_json(&d.join("model.safetensors.index.json"), |i| {
            i["weight_map"]["model.norm.weight"] = "../../sentinel.txt".into()
        });
    });
    let before = s.snapshot();
    let run = |dir: &Path| nuvec_in(&s.dir, &["generate", "--model", dir.to_str().unwrap(), "-p", "hi", "-m", "2"]);
    assert_refused(&run(&eps), &["config.json", "rms_norm_eps"]);
    let started = std::time::Instant::now();
    assert_refused(&run(&template), &["chat_template.jinja"]);
    assert!(started.elapsed().as_secs() < 60, "the hostile template ran for {:?}", started.elapsed());
    assert_refused(&run(&extra), &["model.layers.0.unused.weight"]);
    assert_refused(&run(&escape), &["model.safetensors.index.json", "weight_map.model.norm.weight"]);
    assert_eq!(s.snapshot(), before, "a refused load changed the scratch directory");
}
