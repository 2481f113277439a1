//! `nuvec bench --workload FILE`: an open-loop serving workload through the `Batcher`, as
//! `bench/compare-serve-workload` writes it for every engine alike: requests with their arrival
//! times (seconds from the start), prompts (token ids) and token counts, and the most requests
//! in flight at once. Each request is submitted once it has arrived and a slot is free; every
//! generated token's time is recorded. Reports throughput, time to first token (from
//! submission) and inter-token latency (p50/p99), the prompt tokens served from the prefix
//! cache, and the time spent in steps that prefilled and in steps that only decoded.

use std::collections::HashMap;
use std::time::Instant;

use nuvec_lm::constrain::Grammar;
use nuvec_lm::{Batcher, BatcherOptions, Event, GenerateOptions, Model, RequestId, Sampler};
use serde_json::Value;

/// One request of a workload file.
struct Planned {
    arrival: f64,
    prompt: Vec<u32>,
    max_tokens: usize,
}

/// What happened to one request.
#[derive(Default)]
struct Timeline {
    submitted: f64,
    tokens: Vec<f64>,
    cached: usize,
}

/// Where a run's time went: `Batcher::step` calls that took prompt tokens' rows and those that
/// only decoded, each a count and seconds. A call submits its pass and reads that pass's results
/// (steps are not pipelined), so its seconds are the host's work and the pass together.
#[derive(Default)]
struct StepTimes {
    decode: (usize, f64),
    mixed: (usize, f64),
    prefill_tokens: u64,
}

impl StepTimes {
    fn record(&mut self, seconds: f64, prefill_tokens: u64) {
        let kind = if prefill_tokens > 0 { &mut self.mixed } else { &mut self.decode };
        kind.0 += 1;
        kind.1 += seconds;
        self.prefill_tokens += prefill_tokens;
    }
}

fn parse(path: &str) -> Result<(usize, Vec<Planned>), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{path}: not JSON: {e}"))?;
    let field = |key: &str| format!("{path}: {key}");
    let concurrency = v["concurrency"]
        .as_u64()
        .filter(|&c| c > 0)
        .ok_or_else(|| format!("{}: give the most requests in flight, a positive integer", field("concurrency")))?
        as usize;
    let requests = v["requests"].as_array().ok_or_else(|| format!("{}: give a list", field("requests")))?;
    let mut planned = vec![];
    for (i, r) in requests.iter().enumerate() {
        let bad = |what: &str| format!("{path}: requests[{i}].{what}");
        let arrival = r["arrival"].as_f64().filter(|a| *a >= 0.0).ok_or_else(|| bad("arrival: seconds >= 0"))?;
        let prompt = r["prompt"]
            .as_array()
            .ok_or_else(|| bad("prompt: a list of token ids"))?
            .iter()
            .map(|t| t.as_u64().map(|t| t as u32))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| bad("prompt: token ids"))?;
        let max_tokens = r["max_tokens"].as_u64().ok_or_else(|| bad("max_tokens: an integer"))? as usize;
        planned.push(Planned { arrival, prompt, max_tokens });
    }
    planned.sort_by(|a, b| a.arrival.total_cmp(&b.arrival));
    Ok((concurrency, planned))
}

/// The `q`-quantile of `values` (nearest rank), 0 for none.
fn quantile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    values[((values.len() as f64 * q).ceil() as usize).clamp(1, values.len()) - 1]
}

/// Runs the workload in `path`; `draft` guesses for speculation when given, and `constraint`
/// holds every request's output to a grammar.
pub fn run(
    model: &Model,
    draft: Option<&Model>,
    path: &str,
    options: BatcherOptions,
    constraint: Option<Grammar>,
    temperature: f32,
) -> Result<(), Box<dyn std::error::Error>> {
    let (concurrency, planned) = parse(path)?;
    let options = BatcherOptions { max_batch: options.max_batch.max(concurrency), ..options };
    let speculating = options.speculation.is_some();
    let mut batcher = match draft {
        Some(d) => Batcher::with_draft(model, d, options)?,
        None => Batcher::new(model, options)?,
    };
    let mut next = 0;
    let mut in_flight: HashMap<RequestId, usize> = HashMap::new();
    let mut timelines: Vec<Timeline> = (0..planned.len()).map(|_| Timeline::default()).collect();
    let mut steps = StepTimes::default();
    let start = Instant::now();
    while next < planned.len() || batcher.is_busy() {
        let now = start.elapsed().as_secs_f64();
        while next < planned.len() && planned[next].arrival <= now && in_flight.len() < concurrency {
            let p = &planned[next];
            // Fixed lengths (end-of-sequence ignored), unless a grammar decides where each ends.
            let options = GenerateOptions {
                max_tokens: p.max_tokens,
                ignore_eos: constraint.is_none(),
                constraint: constraint.clone(),
                sampler: Sampler { temperature, ..Default::default() },
                // Each request its own seed, the same in every run.
                seed: Some(next as u64),
                ..Default::default()
            };
            let id = batcher.submit(p.prompt.clone(), options)?;
            timelines[next].submitted = now;
            in_flight.insert(id, next);
            next += 1;
        }
        if !batcher.is_busy() {
            // Idle until the next arrival.
            if let Some(p) = planned.get(next) {
                std::thread::sleep(std::time::Duration::from_secs_f64((p.arrival - now).max(0.0)));
            }
            continue;
        }
        let (before, began) = (batcher.stats().prefill_tokens, Instant::now());
        let events = batcher.step()?;
        steps.record(began.elapsed().as_secs_f64(), batcher.stats().prefill_tokens - before);
        for event in events {
            let t = start.elapsed().as_secs_f64();
            match event {
                Event::Token { id, .. } => timelines[in_flight[&id]].tokens.push(t),
                Event::Started { id, cached_tokens } => timelines[in_flight[&id]].cached = cached_tokens,
                Event::Failed { id, error } => return Err(format!("request {} failed: {error}", id.0).into()),
                Event::Finished { id, .. } => {
                    in_flight.remove(&id);
                }
                Event::Logprobs { .. } => {}
            }
        }
    }
    let end = start.elapsed().as_secs_f64();
    let generated: usize = timelines.iter().map(|t| t.tokens.len()).sum();
    let first = timelines.iter().map(|t| t.submitted).fold(f64::INFINITY, f64::min);
    let mut ttft: Vec<f64> = timelines.iter().filter_map(|t| Some(t.tokens.first()? - t.submitted)).collect();
    let mut itl: Vec<f64> = timelines.iter().flat_map(|t| t.tokens.windows(2).map(|w| w[1] - w[0])).collect();
    let cached: usize = timelines.iter().map(|t| t.cached).sum();
    let prompt: usize = planned.iter().map(|p| p.prompt.len()).sum();
    println!(
        "Workload: requests={} concurrency={concurrency} generated={generated} time={:.3}s prompt_tokens={prompt} \
         cached_tokens={cached} preemptions={}",
        planned.len(),
        end - first,
        batcher.stats().preemptions
    );
    println!(
        "Workload steps: decode-only {} in {:.3}s, with prefill {} in {:.3}s ({} prefill tokens)",
        steps.decode.0, steps.decode.1, steps.mixed.0, steps.mixed.1, steps.prefill_tokens
    );
    let stats = batcher.stats();
    if constraint.is_some() {
        println!("Workload masks: waited {:.3}s for constraint masks after the passes", stats.mask_wait.as_secs_f64());
    }
    if speculating {
        println!("Workload speculation: drafted={} accepted={}", stats.drafted_tokens, stats.accepted_tokens);
    }
    if temperature > 0.0 {
        println!("Workload sampling: drawn_on_device={} drawn_again={}", stats.drawn_on_device, stats.drawn_again);
    }
    if batcher.pipelined() {
        // Steps enqueued before the step before was read (each step's counts above are those it read).
        println!("Workload pipeline: pipelined_steps={} taken_back={}", stats.pipelined_steps, stats.taken_back);
    }
    println!(
        "Workload results: throughput={:.3} ttft_p50={:.1} ttft_p99={:.1} itl_p50={:.1} itl_p99={:.1} \
         total_throughput={:.3}",
        generated as f64 / (end - first).max(1e-9),
        1e3 * quantile(&mut ttft, 0.5),
        1e3 * quantile(&mut ttft, 0.99),
        1e3 * quantile(&mut itl, 0.5),
        1e3 * quantile(&mut itl, 0.99),
        // vLLM's "total token throughput": prompt tokens (cached or computed) and generated ones.
        (prompt + generated) as f64 / (end - first).max(1e-9)
    );
    Ok(())
}
