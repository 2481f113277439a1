//! `NUVEC_ALIGNED_CACHE` through the CLI: an mlx-lm checkpoint (its tensors misaligned, as
//! mlx-community's) generates the same text with the knob as without it; the first run writes
//! one aligned copy of its weights into the folder, the second reuses it, and the checkpoint's
//! own files are not changed.

use std::path::{Path, PathBuf};
use std::process::Command;

fn generate(model: &Path, cache: Option<&Path>) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nuvec"));
    cmd.args(["generate", "--model"]).arg(model).args(["-p", "The capital of", "-m", "12", "--temp", "0"]);
    match cache {
        Some(dir) => cmd.env("NUVEC_ALIGNED_CACHE", dir),
        None => cmd.env_remove("NUVEC_ALIGNED_CACHE"),
    };
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn listing(dir: &Path) -> Vec<(PathBuf, std::time::SystemTime)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let t = std::fs::metadata(&p).unwrap().modified().unwrap();
            (p, t)
        })
        .collect();
    v.sort();
    v
}

#[test]
fn generation_through_the_aligned_cache_is_unchanged() {
    let fixtures = PathBuf::from(std::env::var("NUVEC_FIXTURES").expect("NUVEC_FIXTURES: run scripts/test.sh"));
    let model = fixtures.join("llama-q4g64");
    let cache = std::env::temp_dir().join(format!("nuvec-cli-aligned-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let checkpoint = listing(&model);

    let plain = generate(&model, None);
    let first = generate(&model, Some(&cache));
    assert_eq!(first, plain);
    let copies = listing(&cache);
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert!(copies[0].0.file_name().unwrap().to_string_lossy().starts_with("model-"), "{copies:?}");
    let second = generate(&model, Some(&cache));
    assert_eq!(second, plain);
    assert_eq!(listing(&cache), copies, "the copy was written again");
    assert_eq!(listing(&model), checkpoint, "the checkpoint's files changed");
    std::fs::remove_dir_all(&cache).unwrap();
}
