//! A running `nuvec serve` on a free port with the default model, for the serve tests.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::gguf;

/// What `nuvec generate --model <default> ARGS` prints: the reference a served answer equals.
#[allow(dead_code)] // not every test binary compares with it
pub fn generate(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_nuvec"))
        .args(["generate", "--model", &gguf(), "--verbose", "false"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    text.strip_suffix('\n').unwrap_or(&text).to_string()
}

/// A running `nuvec serve`, killed when dropped.
pub struct Served {
    pub child: Child,
    /// `http://HOST:PORT`.
    pub base: String,
    log: Arc<Mutex<String>>,
    /// Stopped with SIGTERM first (a launcher such as mpirun, which then stops what it started).
    terminate: bool,
}

impl Served {
    /// Starts `nuvec serve --model <default> --port 0 <extra>` and waits for its address.
    pub fn start(extra: &[&str]) -> Served {
        Served::start_model(&gguf(), extra)
    }

    /// Starts `nuvec serve --model <model> --port 0 <extra>` and waits for its address.
    pub fn start_model(model: &str, extra: &[&str]) -> Served {
        let mut command = Command::new(env!("CARGO_BIN_EXE_nuvec"));
        command.args(["serve", "--model", model, "--port", "0"]).args(extra);
        Served::start_command(command, false)
    }

    /// Starts `command` (a `nuvec serve … --port 0`, or a launcher of one) and waits for the
    /// address it prints; `terminate`: stop it with SIGTERM first when dropped.
    pub fn start_command(mut command: Command, terminate: bool) -> Served {
        let mut child = command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(at) = line.find("listening on http://") {
                    let _ = tx.send(line[at + "listening on ".len()..].trim().to_string());
                }
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(base) => Served { child, base, log, terminate },
            Err(_) => {
                let _ = child.kill();
                panic!("nuvec serve did not start: {}", log.lock().unwrap());
            }
        }
    }

    /// Waits (at most `limit`) for the server to exit, then its exit status.
    #[allow(dead_code)] // not every test binary stops it
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let start = std::time::Instant::now();
        loop {
            if let Some(exit) = self.child.try_wait().unwrap() {
                return exit;
            }
            assert!(start.elapsed() < limit, "still running after {limit:?}: {}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `HOST:PORT`, for clients speaking HTTP over a socket themselves.
    #[allow(dead_code)] // not every test binary reads it
    pub fn addr(&self) -> &str {
        self.base.trim_start_matches("http://")
    }

    /// What the server wrote to stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if self.terminate {
            let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
            let start = std::time::Instant::now();
            while start.elapsed() < Duration::from_secs(15) && matches!(self.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
