//! Runs a test binary's case on several ranks under Open MPI's `mpirun` (installed by
//! scripts/setup-mpi.sh). Shared by the process-group tests here and nuvec-lm's pipeline and
//! tensor-parallel tests (`#[path]`).
#![allow(dead_code)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Set in the ranks' environment, so that a rank's case knows it runs under mpirun.
pub const ROLE: &str = "MPIRUN_TEST_RANK";

/// Whether this process is a rank that [`mpirun`] started.
pub fn under_mpirun() -> bool {
    std::env::var_os(ROLE).is_some()
}

/// Runs this binary's ignored case `case` on `ranks` ranks, with `env` set; both streams of every
/// rank, and whether mpirun succeeded. Killed past `limit`.
pub fn mpirun(ranks: usize, case: &str, env: &[(&str, &str)], limit: Duration) -> (String, bool) {
    let exe = std::env::current_exe().unwrap();
    let mut command = Command::new("mpirun");
    command
        .args(["-n", &ranks.to_string(), "--oversubscribe"])
        .arg(exe)
        .args(["--exact", case, "--ignored", "--nocapture", "--test-threads=1"])
        .env(ROLE, "1")
        // Root in containers; shared memory without ptrace attach.
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        command.env(k, v);
    }
    let mut child = command.spawn().expect("mpirun could not start: install Open MPI (scripts/setup-mpi.sh)");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (text, out.status.success())
}

/// The text after `prefix` on the line where it appears, for every such line.
pub fn reports<'a>(out: &'a str, prefix: &str) -> Vec<&'a str> {
    out.match_indices(prefix).map(|(at, _)| out[at + prefix.len()..].lines().next().unwrap_or("")).collect()
}
