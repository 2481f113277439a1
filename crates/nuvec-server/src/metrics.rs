//! `GET /metrics`: the server's counters, gauges and latency histograms in Prometheus' text
//! format (version 0.0.4), named as vLLM names its own (`vllm:` becomes `nuvec:`) so that
//! dashboards written for one read the other.
//!
//! The engine thread updates [`Metrics`] once per step, where the events are; the handler
//! renders a copy. The text is written here directly: a dozen series do not need a registry,
//! and writing it keeps the output exactly what the tests read.

use std::fmt::Write;
use std::time::Duration;

use nuvec_lm::FinishReason;

use crate::engine::EngineStats;

/// Upper bounds (seconds) of the time-to-first-token buckets: vLLM's, with finer steps below
/// 10 ms for a small model on a fast device.
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
];

/// Upper bounds (seconds) of the inter-token-latency buckets: vLLM's, from 1 ms.
const ITL_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0];

/// Upper bounds (seconds) of the whole-request latency buckets (vLLM's).
const E2E_BUCKETS: &[f64] =
    &[0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0];

/// A cumulative histogram over fixed bounds.
#[derive(Debug, Clone)]
pub(crate) struct Histogram {
    bounds: &'static [f64],
    /// Observations at or below each bound (not yet cumulative: one count per bucket, the
    /// last for above every bound).
    counts: Vec<u64>,
    sum: f64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, counts: vec![0; bounds.len() + 1], sum: 0.0 }
    }

    pub fn observe(&mut self, value: Duration) {
        let secs = value.as_secs_f64();
        let at = self.bounds.iter().position(|&b| secs <= b).unwrap_or(self.bounds.len());
        self.counts[at] += 1;
        self.sum += secs;
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// Why requests ended, as vLLM's `finished_reason` label names it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Finished {
    pub stop: u64,
    pub length: u64,
    /// Cancelled: the client went away.
    pub abort: u64,
    pub error: u64,
}

impl Finished {
    pub fn count(&mut self, reason: &FinishReason) {
        match reason {
            FinishReason::EndOfSequence | FinishReason::Stop(_) => self.stop += 1,
            FinishReason::Length
            | FinishReason::ConstraintUnfinished
            | FinishReason::ContextLength(_)
            | FinishReason::CacheFull => self.length += 1,
            FinishReason::Cancelled => self.abort += 1,
            FinishReason::Error => self.error += 1,
        }
    }
}

/// What the engine counts for `/metrics` (gauges come from [`EngineStats`]).
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    /// Prompt tokens of requests the engine took.
    pub prompt_tokens: u64,
    /// Tokens sent to requests.
    pub generation_tokens: u64,
    /// Prompt tokens looked up in the prefix cache (every admitted request's whole prompt).
    pub prefix_queries: u64,
    /// Of those, tokens served from the cache.
    pub prefix_hits: u64,
    pub finished: Finished,
    /// From the request's arrival to its first token.
    pub ttft: Histogram,
    /// Between consecutive tokens of a request.
    pub itl: Histogram,
    /// From arrival to the end, for requests that produced a token.
    pub e2e: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            prompt_tokens: 0,
            generation_tokens: 0,
            prefix_queries: 0,
            prefix_hits: 0,
            finished: Finished::default(),
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
        }
    }
}

/// A label value with `\`, `"` and newlines escaped, as the text format asks.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Prometheus' text for a float (`+Inf`, `NaN` spelled its way).
fn number(x: f64) -> String {
    if x.is_nan() {
        "NaN".into()
    } else if x == f64::INFINITY {
        "+Inf".into()
    } else if x == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{x}")
    }
}

struct Text {
    out: String,
    labels: String,
}

impl Text {
    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        self.header(name, kind, help);
        let _ = writeln!(self.out, "{name}{{{}}} {}", self.labels, number(value));
    }

    fn histogram(&mut self, name: &str, help: &str, h: &Histogram) {
        self.header(name, "histogram", help);
        let mut cumulative = 0;
        for (bound, count) in h.bounds.iter().chain([&f64::INFINITY]).zip(&h.counts) {
            cumulative += count;
            let _ = writeln!(self.out, "{name}_bucket{{{},le=\"{}\"}} {cumulative}", self.labels, number(*bound));
        }
        let _ = writeln!(self.out, "{name}_sum{{{}}} {}", self.labels, number(h.sum));
        let _ = writeln!(self.out, "{name}_count{{{}}} {}", self.labels, h.count());
    }
}

/// The `/metrics` page for model `model_name`.
pub(crate) fn render(model_name: &str, m: &Metrics, stats: &EngineStats, rejected: u64) -> String {
    let mut t = Text { out: String::with_capacity(8192), labels: format!("model_name=\"{}\"", escape(model_name)) };
    t.one("nuvec:num_requests_running", "gauge", "Requests admitted to the batch.", stats.running as f64);
    t.one("nuvec:num_requests_waiting", "gauge", "Requests queued for admission.", stats.waiting as f64);
    t.one("nuvec:kv_cache_blocks_used", "gauge", "KV cache blocks held by requests.", stats.blocks_used as f64);
    t.one("nuvec:kv_cache_blocks_total", "gauge", "KV cache blocks in all.", stats.blocks_total as f64);
    let usage = if stats.blocks_total == 0 { 0.0 } else { stats.blocks_used as f64 / stats.blocks_total as f64 };
    t.one("nuvec:kv_cache_usage_perc", "gauge", "KV cache usage: 1 means every block is held.", usage);
    t.one(
        "nuvec:prefix_cache_queries_total",
        "counter",
        "Prompt tokens looked up in the prefix cache.",
        m.prefix_queries as f64,
    );
    t.one(
        "nuvec:prefix_cache_hits_total",
        "counter",
        "Prompt tokens whose keys and values came from the prefix cache.",
        m.prefix_hits as f64,
    );
    t.one("nuvec:prompt_tokens_total", "counter", "Prompt tokens of the requests taken.", m.prompt_tokens as f64);
    t.one("nuvec:generation_tokens_total", "counter", "Tokens generated and sent.", m.generation_tokens as f64);
    t.one(
        "nuvec:num_preemptions_total",
        "counter",
        "Requests preempted to free cache (each prefilled again later).",
        stats.preemptions as f64,
    );
    t.one(
        "nuvec:spec_decode_num_draft_tokens_total",
        "counter",
        "Guessed tokens fed to steps by speculation (--prompt-lookup, --draft-model or --mtp).",
        stats.drafted_tokens as f64,
    );
    t.one(
        "nuvec:spec_decode_num_accepted_tokens_total",
        "counter",
        "Of the guessed tokens, those that were right (each handed out without a step of its own).",
        stats.accepted_tokens as f64,
    );
    t.one(
        "nuvec:requests_rejected_total",
        "counter",
        "Requests refused with 429 because the queue was full (--max-queue).",
        rejected as f64,
    );
    let name = "nuvec:request_success_total";
    t.header(name, "counter", "Requests that ended, by why: stop, length, abort (client left) or error.");
    let f = &m.finished;
    for (reason, n) in [("stop", f.stop), ("length", f.length), ("abort", f.abort), ("error", f.error)] {
        let _ = writeln!(t.out, "{name}{{{},finished_reason=\"{reason}\"}} {n}", t.labels);
    }
    t.histogram("nuvec:time_to_first_token_seconds", "Seconds from a request's arrival to its first token.", &m.ttft);
    t.histogram("nuvec:inter_token_latency_seconds", "Seconds between consecutive tokens of a request.", &m.itl);
    t.histogram("nuvec:e2e_request_latency_seconds", "Seconds from a request's arrival to its end.", &m.e2e);
    t.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_with_an_inf_bucket() {
        let mut m = Metrics::default();
        m.ttft.observe(Duration::from_millis(250));
        m.ttft.observe(Duration::from_millis(250));
        m.ttft.observe(Duration::from_secs(5000));
        let text = render("a\"b", &m, &EngineStats::default(), 0);
        let line = |prefix: &str| {
            text.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("{prefix}: {text}")).to_string()
        };
        let labels = "model_name=\"a\\\"b\"";
        let bucket = |le: &str| line(&format!("nuvec:time_to_first_token_seconds_bucket{{{labels},le=\"{le}\"}}"));
        assert!(bucket("0.1").ends_with(" 0"), "{text}");
        assert!(bucket("0.25").ends_with(" 2"), "{text}");
        assert!(bucket("2560").ends_with(" 2"), "{text}");
        assert!(bucket("+Inf").ends_with(" 3"), "{text}");
        assert!(line(&format!("nuvec:time_to_first_token_seconds_count{{{labels}}}")).ends_with(" 3"));
        assert!(line(&format!("nuvec:time_to_first_token_seconds_sum{{{labels}}}")).ends_with(" 5000.5"));
        assert!(line(&format!("nuvec:kv_cache_usage_perc{{{labels}}}")).ends_with(" 0"));
        // Every sample line belongs to a declared family.
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let name = l.split(['{', ' ']).next().unwrap();
            let family = ["_bucket", "_sum", "_count"].iter().fold(name, |n, s| n.strip_suffix(s).unwrap_or(n));
            assert!(text.contains(&format!("# TYPE {family} ")), "{l}");
        }
    }
}
