//! `nuvec serve` under load: the real binary with the default SmolLM2 model, N requests from
//! 64 concurrent clients over bare sockets, a fifth of them hanging up mid-stream and one in
//! twenty sending a malformed body. Every answer that completes must equal the answer its
//! prompt gets alone (greedy; computed once per distinct prompt, one request at a time,
//! before the load), every malformed body must get a 400, no request may hang, `/health` must
//! end idle with every request accounted for, and the server's resident memory after the run
//! must be within 10 % of what it was after a warm-up round of the same mix.
//!
//! Size: NUVEC_LOAD_REQUESTS requests (default 1,000, the size: about 65 s on two shared
//! cores, warm-up included); fewer for a quick run, e.g. `NUVEC_LOAD_REQUESTS=200
//! scripts/test.sh -p nuvec-cli --test serve_load`.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::served::Served;

const CLIENTS: usize = 64;
/// Tokens each completed answer gets at most (short: the point is many requests).
const MAX_TOKENS: usize = 8;
/// No request may take longer than this, queueing included.
const REQUEST_BOUND: Duration = Duration::from_secs(120);

const PROMPTS: [&str; 8] = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "What is 2 + 2?",
    "Tell me a joke about cats.",
    "Why is the sky blue?",
    "List four fruits.",
    "Say hello in Spanish.",
];

/// Bodies the server must refuse with 400.
const MALFORMED: [&str; 5] = [
    "{\"messages\": [",
    "{\"messages\": \"hi\"}",
    "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": \"eight\"}",
    "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"temperature\": -1}",
    "[1, 2, 3]",
];

/// Resident memory in KiB of `served` (/proc/PID/status VmRSS).
fn rss_kib(served: &Served) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", served.child.id())).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS in /proc/PID/status");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// An HTTP/1.1 response read to the end (`Connection: close`).
struct Response {
    status: u16,
    body: String,
}

fn send(addr: &str, method: &str, path: &str, body: &str) -> TcpStream {
    let mut socket = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    socket.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        socket,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    socket
}

/// The body of a `Transfer-Encoding: chunked` message.
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = vec![];
    loop {
        let line_end = raw.windows(2).position(|w| w == b"\r\n").expect("a chunk size line");
        let size = usize::from_str_radix(std::str::from_utf8(&raw[..line_end]).unwrap().trim(), 16).unwrap();
        raw = &raw[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

fn request(addr: &str, method: &str, path: &str, body: &str) -> Response {
    let mut socket = send(addr, method, path, body);
    let mut raw = vec![];
    socket.read_to_end(&mut raw).unwrap_or_else(|e| panic!("{method} {path}: reading the response: {e}"));
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a header");
    let head = String::from_utf8_lossy(&raw[..split]).to_lowercase();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let rest = &raw[split + 4..];
    let body = if head.contains("transfer-encoding: chunked") { dechunk(rest) } else { rest.to_vec() };
    Response { status, body: String::from_utf8(body).unwrap() }
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn chat(prompt: &str, max_tokens: usize, stream: bool) -> String {
    json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "stream": stream}).to_string()
}

/// A chat answer's text, whole or streamed (checking the stream ends with `[DONE]`).
fn answer(response: &Response, stream: bool) -> String {
    assert_eq!(response.status, 200, "{}", response.body);
    if !stream {
        return json_of(&response.body)["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    }
    let data: Vec<&str> = response.body.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{}", response.body);
    let mut text = String::new();
    for d in &data[..data.len() - 1] {
        let chunk = json_of(d);
        assert!(chunk.get("error").is_none(), "{d}");
        if let Some(piece) = chunk["choices"][0]["delta"]["content"].as_str() {
            text.push_str(piece);
        }
    }
    text
}

/// Sends a long streaming request, reads its role chunk and two more, then hangs up.
fn stream_then_hang_up(addr: &str, prompt: &str) {
    let body = json!({
        "messages": [{"role": "user", "content": prompt}], "max_tokens": 256, "ignore_eos": true, "stream": true
    });
    let mut socket = send(addr, "POST", "/v1/chat/completions", &body.to_string());
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    while seen.matches("data: ").count() < 3 {
        let n = socket.read(&mut buf).unwrap_or_else(|e| panic!("reading a stream: {e}: {seen}"));
        assert!(n > 0, "the server closed the stream early: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    let _ = socket.shutdown(std::net::Shutdown::Both);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    Complete,
    HangUp,
    Malformed,
}

/// Request `i`'s kind: one in twenty malformed, four in twenty hang up (spread over the run).
fn kind(i: usize) -> Kind {
    match i % 20 {
        7 => Kind::Malformed,
        2 | 6 | 11 | 16 => Kind::HangUp,
        _ => Kind::Complete,
    }
}

#[derive(Default)]
struct Tally {
    kinds: HashMap<Kind, usize>,
    /// (request, what went wrong)
    wrong: Vec<(usize, String)>,
    slowest: Duration,
}

/// Runs requests `0..n` from [`CLIENTS`] threads; every completed answer is checked against
/// `solo`.
fn round(addr: &str, n: usize, solo: &Arc<Vec<String>>) -> Tally {
    let next = Arc::new(AtomicUsize::new(0));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (addr, next, tally, solo) = (addr.to_string(), next.clone(), tally.clone(), solo.clone());
            std::thread::spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return;
                }
                let p = i % PROMPTS.len();
                let start = Instant::now();
                let k = kind(i);
                let wrong = match k {
                    Kind::Complete => {
                        let stream = i % 2 == 1;
                        let r = request(&addr, "POST", "/v1/chat/completions", &chat(PROMPTS[p], MAX_TOKENS, stream));
                        let text = answer(&r, stream);
                        (text != solo[p]).then(|| format!("{:?} got {text:?}, alone {:?}", PROMPTS[p], solo[p]))
                    }
                    Kind::HangUp => {
                        stream_then_hang_up(&addr, PROMPTS[p]);
                        None
                    }
                    Kind::Malformed => {
                        let body = MALFORMED[(i / 20) % MALFORMED.len()];
                        let r = request(&addr, "POST", "/v1/chat/completions", body);
                        let error =
                            serde_json::from_str::<Value>(&r.body).ok().filter(|e| e["error"]["message"].is_string());
                        (r.status != 400 || error.is_none()).then(|| format!("{body} got {}: {}", r.status, r.body))
                    }
                };
                let took = start.elapsed();
                let mut t = tally.lock().unwrap();
                *t.kinds.entry(k).or_default() += 1;
                t.slowest = t.slowest.max(took);
                if let Some(w) = wrong {
                    t.wrong.push((i, w));
                }
                if took > REQUEST_BOUND {
                    t.wrong.push((i, format!("took {took:?}, over the bound of {REQUEST_BOUND:?}")));
                }
            })
        })
        .collect();
    for c in clients {
        c.join().expect("a client thread panicked (see its message above)");
    }
    Arc::try_unwrap(tally).ok().unwrap().into_inner().unwrap()
}

fn health(addr: &str) -> Value {
    let r = request(addr, "GET", "/health", "");
    assert_eq!(r.status, 200, "{}", r.body);
    json_of(&r.body)
}

/// Waits (bounded) for the engine to be idle; its `/health`.
fn idle(addr: &str) -> Value {
    let start = Instant::now();
    loop {
        let h = health(addr);
        if h["requests"]["running"] == 0 && h["requests"]["waiting"] == 0 {
            return h;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the engine did not go idle: {h}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn metric(addr: &str, series: &str) -> f64 {
    let r = request(addr, "GET", "/metrics", "");
    assert_eq!(r.status, 200, "{}", r.body);
    let line = r.body.lines().find(|l| l.starts_with(series)).unwrap_or_else(|| panic!("{series}: {}", r.body));
    line.rsplit_once(' ').unwrap().1.parse().unwrap()
}

#[test]
fn many_clients_with_disconnects_and_bad_bodies_get_their_solo_answers() {
    let n: usize = std::env::var("NUVEC_LOAD_REQUESTS")
        .map_or(1000, |v| v.parse().unwrap_or_else(|_| panic!("NUVEC_LOAD_REQUESTS={v:?} is not a count of requests")));
    let served = Served::start(&[]);
    let addr = served.addr().to_string();
    let start = Instant::now();

    // Each prompt's answer alone, one request at a time.
    let solo: Arc<Vec<String>> = Arc::new(
        PROMPTS
            .iter()
            .map(|p| answer(&request(&addr, "POST", "/v1/chat/completions", &chat(p, MAX_TOKENS, false)), false))
            .collect(),
    );
    // A warm-up round of the same mix: caches, pools and the allocator reach their steady size.
    let warm = round(&addr, CLIENTS, &solo);
    assert!(warm.wrong.is_empty(), "warm-up: {:?}", warm.wrong);
    idle(&addr);
    let rss_before = rss_kib(&served);
    eprintln!("solo and warm-up: {:.1?}, RSS {rss_before} KiB", start.elapsed());

    let run = Instant::now();
    let tally = round(&addr, n, &solo);
    let ran = run.elapsed();
    let h = idle(&addr);
    let rss_after = rss_kib(&served);
    let count = |t: &Tally, k: Kind| t.kinds.get(&k).copied().unwrap_or(0);
    eprintln!(
        "{n} requests from {CLIENTS} clients in {ran:.1?} (slowest {:.1?}): {} complete, {} hung up, {} malformed; \
         RSS {rss_before} -> {rss_after} KiB; /health {h}",
        tally.slowest,
        count(&tally, Kind::Complete),
        count(&tally, Kind::HangUp),
        count(&tally, Kind::Malformed),
    );
    assert!(tally.wrong.is_empty(), "{} of {n} went wrong: {:?}", tally.wrong.len(), tally.wrong);
    assert_eq!(tally.kinds.values().sum::<usize>(), n);

    // Every request that reached the engine ended, and each is counted once: a hang-up is
    // cancelled, unless its answer was done before the engine saw the socket close.
    let sent = |k: Kind| PROMPTS.len() * usize::from(k == Kind::Complete) + count(&warm, k) + count(&tally, k);
    let (complete, hung_up) = (sent(Kind::Complete) as u64, sent(Kind::HangUp) as u64);
    let r = &h["requests"];
    let (completed, cancelled) = (r["completed"].as_u64().unwrap(), r["cancelled"].as_u64().unwrap());
    assert_eq!(r["failed"], 0, "{h}");
    assert_eq!(completed + cancelled, complete + hung_up, "{h}");
    assert!(cancelled <= hung_up && completed >= complete, "{h}");
    // The hang-ups asked for 256 tokens each: nearly all must have been cut short.
    assert!(cancelled * 10 >= hung_up * 9, "only {cancelled} of {hung_up} hang-ups were cancelled: {h}");
    let label = "{model_name=\"SmolLM2-135M-Instruct.Q4_1\",finished_reason=";
    assert_eq!(metric(&addr, &format!("nuvec:request_success_total{label}\"abort\"}}")), cancelled as f64);
    assert_eq!(metric(&addr, &format!("nuvec:request_success_total{label}\"error\"}}")), 0.0);
    assert_eq!(metric(&addr, "nuvec:requests_rejected_total"), 0.0);

    // No growth: memory after the run is within 10 % of memory after the warm-up.
    assert!(
        rss_after as f64 <= rss_before as f64 * 1.10,
        "RSS grew from {rss_before} KiB to {rss_after} KiB over {n} requests"
    );
    let log = served.log();
    assert!(!log.contains("panicked"), "{log}");
}
