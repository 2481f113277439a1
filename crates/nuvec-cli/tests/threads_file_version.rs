//! The flags every command shares with llama.cpp's tools: `-t/--threads` on each command that
//! computes, `-f FILE` for a prompt, and `nuvec --version` with the build's features and the ISA
//! the CPU kernels run (checked against /proc/cpuinfo).

use std::process::Command;

mod common;

use common::gguf;

/// `nuvec ARGS` with `env` set: (success, stdout, stderr).
fn nuvec(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nuvec")).args(args).envs(env.iter().copied()).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// The kernels this CPU should get, from the kernel's own report of its flags.
fn isa_from_cpuinfo() -> &'static str {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags: Vec<&str> =
        info.lines().find(|l| l.starts_with("flags")).map_or(vec![], |l| l.split_whitespace().collect());
    let has = |all: &[&str]| all.iter().all(|f| flags.contains(f));
    if !cfg!(target_arch = "x86_64") || !has(&["avx2", "fma", "f16c"]) {
        "scalar"
    } else if has(&["avx512f", "avx512bw", "avx512vl"]) {
        "avx512"
    } else {
        "avx2"
    }
}

#[test]
fn version_names_the_build_and_the_cpu_kernels() {
    let (ok, out, err) = nuvec(&["--version"], &[]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], format!("nuvec {}", env!("CARGO_PKG_VERSION")));
    let features = lines.iter().find(|l| l.starts_with("features: ")).expect("a features line");
    assert_eq!(features.starts_with("features: cuda"), cfg!(feature = "cuda"), "{out}");
    let cpu = lines.iter().find(|l| l.starts_with("cpu: ")).expect("a cpu line");
    assert!(cpu.contains(&format!("kernels: {} (", isa_from_cpuinfo())), "{cpu}");
    assert_eq!(nuvec(&["-V"], &[]).1, out, "-V is --version");
    let (_, capped, _) = nuvec(&["--version"], &[("NUVEC_CPU_ISA", "scalar")]);
    assert!(capped.contains("kernels: scalar ("), "{capped}");
}

#[test]
fn threads_are_taken_by_every_computing_command() {
    let model = gguf();
    let (ok, out, err) =
        nuvec(&["bench", "--model", &model, "-t", "1", "-p", "4", "-g", "2", "-n", "1", "--no-warmup"], &[]);
    assert!(ok && out.contains("threads=1"), "{out}{err}");
    for cmd in ["generate", "chat", "cache-prompt", "convert", "serve", "bench"] {
        let (_, help, _) = nuvec(&[cmd, "--help"], &[]);
        assert!(help.contains("-t, --threads <THREADS>"), "{cmd} --help: {help}");
    }
    let (ok, _, err) = nuvec(&["generate", "--model", &model, "-t", "0", "-m", "1"], &[]);
    assert!(!ok && err.contains("--threads"), "{err}");
}

#[test]
fn a_prompt_file_is_the_prompt() {
    let model = gguf();
    let dir = std::env::temp_dir().join(format!("nuvec-prompt-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("prompt.txt");
    let text = "The capital of France is";
    std::fs::write(&file, text).unwrap();
    let path = file.to_str().unwrap();
    let common = ["generate", "--model", &model, "--ignore-chat-template", "-m", "8"];
    let (ok, from_file, err) = nuvec(&[&common[..], &["-f", path]].concat(), &[]);
    assert!(ok, "{err}");
    let (ok, from_flag, err) = nuvec(&[&common[..], &["-p", text]].concat(), &[]);
    assert!(ok, "{err}");
    // stdout is the answer alone (the statistics go to stderr).
    assert!(!from_file.trim().is_empty());
    assert_eq!(from_file, from_flag);
    let missing = dir.join("missing.txt");
    let (ok, _, err) = nuvec(&[&common[..], &["-f", missing.to_str().unwrap()]].concat(), &[]);
    assert!(!ok && err.contains("--file") && err.contains("missing.txt"), "{err}");
    let (ok, _, err) = nuvec(&[&common[..], &["-f", path, "-p", text]].concat(), &[]);
    assert!(!ok && err.contains("cannot be used with"), "{err}");
    // cache-prompt reads it too.
    let cache = dir.join("cache.safetensors");
    let args = ["cache-prompt", "--model", &model, "-f", path, "--prompt-cache-file", cache.to_str().unwrap()];
    let (ok, _, err) = nuvec(&args, &[]);
    assert!(ok && cache.exists(), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
