//! The chat page `nuvec serve` serves at `/`, end to end in headless Chromium: the real binary
//! with the default SmolLM2 model and an API key, the page driven by tests/serve_page.cjs
//! through npm's playwright-core and Debian's chromium (both installed by
//! scripts/setup-page-tests.sh, which scripts/test.sh runs). The script checks the page: the
//! 401 without a key, a refused setting shown, streamed greedy answers equal to the server's
//! whole answers to the same messages, Stop cancelling the request on the server, the
//! conversation kept over a reload, reasoning folded, an error in a stream shown; then it takes
//! a screenshot, checked here.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

mod common;
use common::served::Served;

const KEY: &str = "sk-page-test";

fn required(name: &str) -> String {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} is not set: run scripts/test.sh (it runs scripts/setup-page-tests.sh)"))
}

/// `GET /health`'s body, over a bare socket.
fn health(addr: &str) -> Value {
    let mut socket = TcpStream::connect(addr).unwrap();
    write!(socket, "GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    socket.read_to_string(&mut text).unwrap();
    let (_, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no body: {text}"));
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn the_chat_page_streams_stops_and_keeps_its_conversation_in_chromium() {
    let chromium = required("NUVEC_CHROMIUM");
    let modules = required("NUVEC_PAGE_NODE_MODULES");
    let served = Served::start(&["--api-key", KEY]);
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("serve_page.png");
    let _ = std::fs::remove_file(&shot); // so an old run's picture cannot pass for this one's
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/serve_page.cjs");
    let out = Command::new("node")
        .arg(script)
        .env("NUVEC_PAGE_BASE", &served.base)
        .env("NUVEC_PAGE_KEY", KEY)
        .env("NUVEC_PAGE_SHOT", &shot)
        .env("NUVEC_CHROMIUM", &chromium)
        .env("NUVEC_PAGE_NODE_MODULES", &modules)
        .output()
        .unwrap_or_else(|e| panic!("node is needed for this test ({e}); scripts/setup-page-tests.sh installs it"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(
        out.status.success() && stdout.lines().last() == Some("[page] ok"),
        "{stdout}\n{stderr}\nserver:\n{}",
        served.log()
    );

    // The one request the page stopped is the one the server cancelled.
    let h = health(served.addr());
    assert_eq!(h["requests"]["cancelled"], 1, "{h}");
    assert_eq!(h["requests"]["running"], 0, "{h}");

    // A PNG with a picture in it: the signature, then IHDR's width and height.
    let png = std::fs::read(&shot).unwrap_or_else(|e| panic!("no screenshot at {}: {e}", shot.display()));
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 24, "{} is not a PNG", shot.display());
    let width = u32::from_be_bytes([png[16], png[17], png[18], png[19]]);
    let height = u32::from_be_bytes([png[20], png[21], png[22], png[23]]);
    assert!(width > 0 && height > 0 && png.len() > 4096, "{}: {width}x{height}, {} bytes", shot.display(), png.len());
    eprintln!("screenshot: {} ({width}x{height})", shot.display());
}
