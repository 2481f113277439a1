//! `nuvec manage` against mlx_lm.manage (the oracle venv's mlx-lm and huggingface_hub) on the
//! same Hugging Face cache: `--scan` prints the same table (repos of every type, snapshots
//! sharing blobs, nested refs and files, a repo with no files, blobs of set ages), and `--delete`
//! the same listing and question; then what deleting does: a "no" keeps everything, an unclear
//! answer is asked again, `--yes` deletes without asking, only the matching repos go, and a file
//! outside the cache that a snapshot links to is never touched.

use std::fs::{self, File, FileTimes};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, SystemTime};

const DAY: u64 = 86_400;

/// A folder of this test's own, removed when it ends.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("nuvec-manage-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn nuvec(cache: &Path, args: &[&str], stdin: &str) -> Output {
    run(Command::new(env!("CARGO_BIN_EXE_nuvec")).arg("manage").args(args), cache, stdin)
}

fn mlx_lm(cache: &Path, args: &[&str], stdin: &str) -> Output {
    let python = std::env::var("NUVEC_ORACLE_PYTHON").expect("NUVEC_ORACLE_PYTHON is not set: run scripts/test.sh");
    run(Command::new(python).args(["-m", "mlx_lm", "manage"]).args(args), cache, stdin)
}

fn run(cmd: &mut Command, cache: &Path, stdin: &str) -> Output {
    let mut child = cmd
        .env("HF_HUB_CACHE", cache)
        .env_remove("HF_HOME")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the command");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A blob of `len` bytes last accessed `accessed` and modified `modified` seconds ago (both
/// well inside their unit, so that the two programs' clocks print the same words).
fn blob(repo: &Path, name: &str, len: usize, accessed: u64, modified: u64) {
    let path = repo.join("blobs").join(name);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, vec![7u8; len]).unwrap();
    set_age(&path, accessed, modified);
}

fn set_age(path: &Path, accessed: u64, modified: u64) {
    let now = SystemTime::now();
    let times = FileTimes::new()
        .set_accessed(now - Duration::from_secs(accessed))
        .set_modified(now - Duration::from_secs(modified));
    File::open(path).unwrap().set_times(times).unwrap();
}

/// `snapshots/<commit>/<file>` linking to `target` (relative, as the hub writes them).
fn link(repo: &Path, commit: &str, file: &str, target: &str) {
    let path = repo.join("snapshots").join(commit).join(file);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(target, &path).unwrap();
}

fn refs(repo: &Path, name: &str, commit: &str) {
    let path = repo.join("refs").join(name);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, commit).unwrap();
}

/// The cache: two mlx repos (one model with two snapshots sharing a blob, a nested file and a
/// nested ref; one dataset), a repo outside the pattern, an mlx repo with an empty snapshot, and
/// a `.locks` folder.
fn cache(dir: &Path) -> PathBuf {
    let cache = dir.join("hub");
    let tiny = cache.join("models--mlx-community--Tiny-4bit");
    blob(&tiny, "aaa", 100, 2 * 3600 + 600, 400 * DAY + 3600);
    blob(&tiny, "bbb", 2_500, 3 * DAY + 3600, 3 * DAY + 3600);
    blob(&tiny, "ccc", 12_345, 5 * 60 + 10, 20 * DAY + 3600);
    link(&tiny, "c1", "config.json", "../../blobs/aaa");
    link(&tiny, "c1", "model.safetensors", "../../blobs/bbb");
    link(&tiny, "c2", "config.json", "../../blobs/aaa");
    link(&tiny, "c2", "sub/tokenizer.json", "../../../blobs/ccc");
    refs(&tiny, "main", "c1");
    refs(&tiny, "refs/pr/1", "c2");
    let data = cache.join("datasets--someone--mlx-data");
    blob(&data, "ddd", 1_500_000, 40 * DAY + 3600, 90 * DAY + 3600);
    link(&data, "d1", "data.txt", "../../blobs/ddd");
    refs(&data, "main", "d1");
    let other = cache.join("models--other--llama");
    blob(&other, "eee", 10, 7200 + 60, 7200 + 60);
    link(&other, "e1", "x.json", "../../blobs/eee");
    refs(&other, "main", "e1");
    let empty = cache.join("models--mlx-empty--nothing");
    fs::create_dir_all(empty.join("snapshots/f1")).unwrap();
    set_age(&empty, 50 * DAY + 3600, 50 * DAY + 3600);
    fs::create_dir_all(cache.join(".locks/models--mlx-community--Tiny-4bit")).unwrap();
    cache
}

#[test]
fn scan_prints_mlx_lm_manage_s_table() {
    let dir = Scratch::new("scan");
    let cache = cache(dir.path());
    for pattern in [None, Some("Tiny"), Some("llama"), Some("nothing-matches")] {
        let args: Vec<&str> = match pattern {
            None => vec!["--scan"],
            Some(p) => vec!["--scan", "--pattern", p],
        };
        let (ours, theirs) = (nuvec(&cache, &args, ""), mlx_lm(&cache, &args, ""));
        assert!(ours.status.success(), "{}", String::from_utf8_lossy(&ours.stderr));
        assert!(theirs.status.success(), "mlx_lm.manage: {}", String::from_utf8_lossy(&theirs.stderr));
        assert_eq!(text(&ours), text(&theirs), "--scan {pattern:?}");
    }
    // The numbers themselves, not only the agreement: the model's 3 distinct blobs (100 + 2,500 +
    // 12,345 bytes; config.json's blob is shared by both snapshots), the dataset's one.
    let out = text(&nuvec(&cache, &["--scan"], ""));
    let row = |id: &str| -> Vec<String> {
        let line = out.lines().find(|l| l.starts_with(id)).unwrap_or_else(|| panic!("no {id} in {out}"));
        line.split_whitespace().map(str::to_string).collect()
    };
    assert_eq!(row("mlx-community/Tiny-4bit")[1..4], ["model", "14.9K", "3"]);
    assert_eq!(row("mlx-community/Tiny-4bit")[4..7], ["5", "minutes", "ago"], "the latest access, blob ccc's");
    assert_eq!(row("someone/mlx-data")[1..4], ["dataset", "1.5M", "1"]);
    assert_eq!(row("mlx-empty/nothing")[1..4], ["model", "0.0", "0"]);
    assert!(!out.contains("other/llama"), "{out}");
}

#[test]
fn delete_lists_asks_and_removes_only_the_matching_repos() {
    let dir = Scratch::new("delete");
    let cache = cache(dir.path());
    // A user's file outside the cache that a snapshot of a matching repo links to.
    let outside = dir.path().join("my-notes.txt");
    fs::write(&outside, "keep me").unwrap();
    let tiny = cache.join("models--mlx-community--Tiny-4bit");
    link(&tiny, "c1", "notes.txt", outside.to_str().unwrap());

    // "no": the listing and the question as mlx_lm.manage prints them, nothing deleted.
    let args = ["--delete", "--pattern", "Tiny"];
    let (ours, theirs) = (nuvec(&cache, &args, "n\n"), mlx_lm(&cache, &args, "n\n"));
    assert!(ours.status.success() && theirs.status.success(), "{}", String::from_utf8_lossy(&theirs.stderr));
    assert_eq!(text(&ours), text(&theirs));
    assert!(text(&ours).contains("Deletion cancelled - no changes made."));
    assert!(tiny.join("blobs/bbb").exists());
    // The end of input is a no.
    assert!(text(&nuvec(&cache, &args, "")).contains("Deletion cancelled"));
    assert!(tiny.exists());

    // An unclear answer is asked again; "yes" deletes that repo and nothing else.
    let out = nuvec(&cache, &args, "maybe\nyes\n");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = text(&out);
    assert!(said.contains("Invalid input. Must be one of: yes/no/y/n or empty for no"), "{said}");
    assert!(said.contains("Deleting mlx-community/Tiny-4bit...") && said.contains("Model(s) deleted successfully."));
    assert!(!tiny.exists());
    assert_eq!(fs::read_to_string(&outside).unwrap(), "keep me", "a file outside the cache was touched");
    for kept in ["datasets--someone--mlx-data", "models--other--llama", "models--mlx-empty--nothing", ".locks"] {
        assert!(cache.join(kept).exists(), "{kept} was deleted");
    }

    // --yes: no question; the default pattern ("mlx") takes the dataset and the empty repo.
    let out = nuvec(&cache, &["--delete", "--yes"], "");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!text(&out).contains("(y/n)"));
    assert!(!cache.join("datasets--someone--mlx-data").exists() && !cache.join("models--mlx-empty--nothing").exists());
    assert!(cache.join("models--other--llama/blobs/eee").exists());
    let out = nuvec(&cache, &["--delete", "--pattern", "mlx"], "");
    assert!(text(&out).contains("No models found matching pattern \"mlx\""), "{}", text(&out));
}

#[test]
fn folders_that_are_not_repos_are_reported_and_left_alone() {
    let dir = Scratch::new("notrepos");
    let cache = cache(dir.path());
    let broken = cache.join("models--mlx-broken--nosnapshots");
    fs::create_dir_all(broken.join("blobs")).unwrap();
    let dangling = cache.join("models--mlx-broken--dangling");
    link(&dangling, "g1", "config.json", "../../blobs/missing");
    // A repo folder that is a link to a folder outside the cache.
    let elsewhere = dir.path().join("elsewhere");
    fs::create_dir_all(elsewhere.join("snapshots/h1")).unwrap();
    fs::write(elsewhere.join("snapshots/h1/weights.bin"), "user data").unwrap();
    std::os::unix::fs::symlink(&elsewhere, cache.join("models--mlx-linked--repo")).unwrap();

    let out = nuvec(&cache, &["--scan", "--pattern", "mlx-broken"], "");
    assert!(out.status.success());
    let warnings = String::from_utf8_lossy(&out.stderr);
    assert!(warnings.contains("models--mlx-broken--nosnapshots: no snapshots folder; left alone"), "{warnings}");
    assert!(warnings.contains("is a broken link (its blob is missing)"), "{warnings}");
    assert!(!text(&out).contains("mlx-broken/"), "{}", text(&out));

    // Deleting refuses the linked folder (its target is outside the cache) and stops there.
    let out = nuvec(&cache, &["--delete", "--yes", "--pattern", "mlx-linked"], "");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a repo folder directly in the Hugging Face cache"), "{err}");
    assert_eq!(fs::read_to_string(elsewhere.join("snapshots/h1/weights.bin")).unwrap(), "user data");
    assert!(broken.exists() && dangling.exists());
}

#[test]
fn bad_invocations_say_what_to_do() {
    let dir = Scratch::new("bad");
    let out = nuvec(dir.path(), &[], "");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("pass --scan"));
    let out = nuvec(&dir.path().join("absent"), &["--scan"], "");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("absent: no Hugging Face cache here") && err.contains("HF_HUB_CACHE"), "{err}");
    let out = nuvec(dir.path(), &["--scan", "--yes"], "");
    assert!(!out.status.success(), "--yes without --delete must be refused");
}
