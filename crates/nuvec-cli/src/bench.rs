//! `nuvec bench`: prompt and generation throughput on random tokens, shaped like `mlx_lm.benchmark`.
//!
//! The model is driven directly (no sampler, no stop conditions: EOS is ignored), so every trial
//! processes exactly `-p` prompt tokens and generates exactly `-g` tokens (greedy). As
//! `llama-bench`, `-p`, `-g`, `-b` and `-d` take comma lists, swept in one run (every
//! combination is a test), `-d` puts a context of that many tokens before the prompt, and `-o`
//! prints the tests as JSON, CSV or a Markdown table.

use std::time::Instant;

use clap::Parser;
use nuvec_lm::decode_graph::{DecodeGraph, GraphMode};
use nuvec_lm::{decode_batch, default_prefill_step, BatcherOptions, Model, PagedCache, SeqId};

use crate::bench_report::Report;
use crate::common::{parse_device, peak_memory};

/// Measure prompt processing and generation speed, as `mlx_lm.benchmark` does.
#[derive(Parser, Debug)]
pub struct Args {
    #[command(flatten)]
    load: crate::common::LoadArgs,
    /// Prompt length in (random) tokens; a comma list sweeps several (`-p 128,512`).
    #[arg(short = 'p', long, value_delimiter = ',', default_value = "512", conflicts_with = "workload")]
    prompt_tokens: Vec<usize>,
    /// Tokens to generate per trial; a comma list sweeps several.
    #[arg(short = 'g', long, value_delimiter = ',', default_value = "1024", conflicts_with = "workload")]
    generation_tokens: Vec<usize>,
    /// Sequences decoded together (as mlx_lm.benchmark's -b): each gets its own random prompt
    /// of -p tokens and generates -g; the rates are totals over all of them. Above 1 the
    /// sequences live in a paged cache and every decode step is one forward pass for all. A
    /// comma list sweeps several.
    #[arg(short = 'b', long, value_delimiter = ',', default_value = "1", conflicts_with = "workload")]
    batch_size: Vec<usize>,
    /// Tokens of (random) context already in each sequence's cache before the prompt, as
    /// llama-bench's -d: the prompt and the generation are timed after it. A comma list sweeps
    /// several.
    #[arg(short = 'd', long, value_delimiter = ',', default_value = "0", conflicts_with = "workload")]
    depth: Vec<usize>,
    /// How the results are printed: `text` (mlx_lm.benchmark's lines), or one row per test as
    /// `json`, `csv` or `md` (a Markdown table) on stdout, with the progress lines on stderr.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text, conflicts_with = "workload")]
    output: Output,
    /// Timed trials (after one untimed warm-up).
    #[arg(short = 'n', long, default_value_t = 5, conflicts_with = "workload")]
    num_trials: usize,
    /// Prompt tokens processed per forward pass (default 2048 on the CPU, as mlx-lm; 4096 on
    /// CUDA, where each pass decodes the quantized weights for the tensor cores).
    #[arg(long, conflicts_with = "workload")]
    prefill_step_size: Option<usize>,
    /// Where the model runs: cpu, cuda or cuda:N (cuda needs a build with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    device: String,
    #[command(flatten)]
    threads: crate::common::ThreadArgs,
    /// Seed of the random prompt.
    #[arg(long, default_value_t = 0, conflicts_with = "workload")]
    seed: u64,
    /// Skip the untimed warm-up trial.
    #[arg(long, conflicts_with = "workload")]
    no_warmup: bool,
    /// Run a serving workload through the Batcher instead: a JSON file of requests with
    /// arrival times, as bench/compare-serve-workload writes (see crates/nuvec-cli/src/workload.rs);
    /// reports throughput, time to first token and inter-token latency. The file sets the
    /// prompts and lengths, so the flags of the random-prompt tests are refused beside it.
    #[arg(long, value_name = "FILE")]
    workload: Option<String>,
    /// With --workload: sample every request at this temperature (alone: no other filter; each
    /// request seeded by its place in the file) instead of greedily.
    #[arg(long, requires = "workload", default_value_t = 0.0)]
    temp: f32,
    /// With --workload: turn the Batcher's prefix cache off.
    #[arg(long, requires = "workload")]
    no_prefix_cache: bool,
    /// With --workload: cache blocks of 16 positions (default: sized from memory).
    #[arg(long, requires = "workload")]
    blocks: Option<usize>,
    /// With --workload: prompt-lookup speculation in the Batcher (as `nuvec serve
    /// --prompt-lookup`, with its defaults but --num-draft-tokens).
    #[arg(long, requires = "workload")]
    prompt_lookup: bool,
    /// With --workload: speculation with this draft model in the Batcher (as `nuvec serve
    /// --draft-model`).
    #[arg(long, value_name = "PATH", requires = "workload", conflicts_with = "prompt_lookup")]
    draft_model: Option<String>,
    /// With --prompt-lookup or --draft-model: tokens guessed per request and step.
    #[arg(long, default_value_t = 3)]
    num_draft_tokens: usize,
    /// With --prompt-lookup or --draft-model: most decoding requests in a step that speculates
    /// (as `nuvec serve --speculation-max-batch`; default 2 on the CPU, 8 on a GPU).
    #[arg(long)]
    speculation_max_batch: Option<usize>,
    /// With --workload: every request's output held to this (structured output). Requests then
    /// end where their grammar does, or at their max_tokens, instead of ignoring end-of-sequence.
    #[command(flatten)]
    constraint: crate::constraint::ConstraintArgs,
    /// Quantize the paged cache's keys and values to this many bits (as `nuvec serve
    /// --kv-bits`): the sequences, even one, then run in a quantized paged cache.
    #[arg(long)]
    kv_bits: Option<usize>,
    /// Values per quantization group of the KV cache, with --kv-bits.
    #[arg(long, default_value_t = 64)]
    kv_group_size: usize,
    /// Store keys and values as f32, f16 or bf16 (default: the model's own type, f16 for GGUF).
    #[arg(long, value_parser = crate::common::parse_kv_dtype)]
    kv_dtype: Option<nuvec_lm::cache::KvDtype>,
    #[command(flatten)]
    split: crate::common::SplitArgs,
}

/// The form of `nuvec bench`'s report.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
    Csv,
    Md,
}

/// One test of a sweep: the values it runs with.
#[derive(Clone, Copy, Debug)]
pub struct Test {
    pub prompt_tokens: usize,
    pub generation_tokens: usize,
    pub batch_size: usize,
    pub depth: usize,
}

/// A small deterministic generator (splitmix64) for the prompt ids.
fn random_tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut state = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) % vocab as u64) as u32
        })
        .collect()
}

/// The id of the first largest logit of `logits [1, vocab]`.
fn argmax(logits: &nuvec::Array) -> Result<u32, Box<dyn std::error::Error>> {
    Ok(logits.argmax()?.to_vec::<u32>()?[0])
}

struct Trial {
    prompt_tps: f64,
    generation_tps: f64,
    peak: u64,
    /// Decode steps replayed as a CUDA graph.
    replayed: usize,
    /// Positions in the (first) sequence's cache at the end: its context, prompt and the
    /// generated tokens but the last.
    positions: usize,
}

/// One sequence alone: its context (`t.depth` tokens, untimed), then the prompt and the
/// generation, timed.
fn trial(
    model: &Model,
    (context, prompt): (&[u32], &[u32]),
    args: &Args,
    t: Test,
    graphs: GraphMode,
) -> Result<Trial, Box<dyn std::error::Error>> {
    let mut cache = model.new_cache();
    let step = args.prefill_step_size.unwrap_or_else(|| default_prefill_step(model.device()));
    for chunk in context.chunks(step.max(1)) {
        model.prefill(chunk, &mut cache)?;
    }
    let start = Instant::now();
    // As mlx-lm: chunks of prefill_step_size, the last prompt token goes through the first step.
    let (body, last) = prompt.split_at(prompt.len() - 1);
    for chunk in body.chunks(step.max(1)) {
        model.prefill(chunk, &mut cache)?;
    }
    // Greedy, with the argmax where the logits are (on a GPU only the token id comes back).
    let mut token = argmax(&model.forward_last(last, &mut cache)?)?;
    let prompt_time = start.elapsed().as_secs_f64();
    let start = Instant::now();
    // One-token steps as CUDA graphs where the model allows (NUVEC_CUDA_GRAPHS=0: never).
    let mut steps = DecodeGraph::new(graphs);
    for _ in 1..t.generation_tokens {
        token = argmax(&steps.step(model, &mut cache, token)?)?;
    }
    if let Some(why) = steps.stopped() {
        eprintln!("CUDA graphs stopped: {why}");
    }
    let gen_time = start.elapsed().as_secs_f64();
    let _ = token;
    Ok(Trial {
        prompt_tps: prompt.len() as f64 / prompt_time,
        // The first generated token comes with the prompt pass, as in mlx-lm's statistics.
        generation_tps: if t.generation_tokens > 1 { (t.generation_tokens - 1) as f64 / gen_time } else { 0.0 },
        peak: peak_memory(),
        replayed: steps.replayed_steps(),
        positions: cache.first().map_or(0, nuvec_lm::cache::LayerCache::offset),
    })
}

/// `prompts.len()` sequences together in a paged cache: each sequence's context (untimed), then
/// the prompts prefilled in steps of at most `prefill_step_size` rows (whole prompts of several
/// sequences per step where they fit), then every decode step one forward pass over all
/// sequences.
fn batch_trial(
    model: &Model,
    (contexts, prompts): (&[Vec<u32>], &[Vec<u32>]),
    args: &Args,
    t: Test,
) -> Result<Trial, Box<dyn std::error::Error>> {
    const BLOCK: usize = nuvec_lm::cache::paged::DEFAULT_BLOCK_SIZE;
    let b = prompts.len();
    let per_seq = (t.depth + t.prompt_tokens + t.generation_tokens).div_ceil(BLOCK);
    let mut paged = match args.kv_bits {
        Some(bits) => PagedCache::new_quantized(model, b * per_seq, BLOCK, b, bits, args.kv_group_size)?,
        None => PagedCache::new(model, b * per_seq, BLOCK, b)?,
    };
    let ids: Vec<SeqId> = (0..b).map(|_| paged.add()).collect::<Result<_, _>>()?;
    let step = args.prefill_step_size.unwrap_or_else(|| default_prefill_step(model.device())).max(1);
    let prefill = |paged: &mut PagedCache, rows: &[Vec<u32>], len: usize| -> nuvec_lm::Result<()> {
        for chunk_start in (0..len).step_by(step) {
            let chunk_end = (chunk_start + step).min(len);
            let per_step = (step / (chunk_end - chunk_start)).max(1);
            for group in ids.iter().zip(rows).collect::<Vec<_>>().chunks(per_step) {
                let work: Vec<(SeqId, &[u32])> =
                    group.iter().map(|(&id, p)| (id, &p[chunk_start..chunk_end])).collect();
                paged.step(model, &work)?;
            }
        }
        Ok(())
    };
    prefill(&mut paged, contexts, t.depth)?;
    let start = Instant::now();
    // As mlx-lm: the prompt but its last token is prefilled; the last goes through the first step.
    prefill(&mut paged, prompts, t.prompt_tokens - 1)?;
    let mut tokens: Vec<u32> = prompts.iter().map(|p| p[p.len() - 1]).collect();
    let mut picks = decode_batch(model, &tokens, &ids, &mut paged)?.argmax_gap()?;
    tokens = picks.to_vec::<u32>()?.chunks(3).map(|p| p[0]).collect();
    let prompt_time = start.elapsed().as_secs_f64();
    let start = Instant::now();
    if nuvec_lm::pipeline_default(model.device())? {
        // As the Batcher's pipelined steps: each step is fed the step before's greedy picks on
        // the device and enqueued before those are read, one step behind. (Without prefix
        // caching the cache records no tokens: nothing to tell it of the fed ones.)
        let fed: Vec<(usize, usize)> = (0..b).map(|i| (i, i)).collect();
        let placeholders = vec![[0u32]; b];
        let work: Vec<(SeqId, &[u32])> = ids.iter().zip(&placeholders).map(|(&id, t)| (id, &t[..])).collect();
        let ones = vec![1; b];
        let mut reading: Option<nuvec::PendingRead> = None;
        for _ in 1..t.generation_tokens {
            let logits = paged.step_fed(model, &work, &ones, &picks, &fed)?;
            picks = logits.argmax_gap()?;
            if let Some(read) = reading.replace(picks.read_later()?) {
                read.wait::<u32>()?;
            }
        }
        if let Some(read) = reading {
            read.wait::<u32>()?;
        }
    } else {
        for _ in 1..t.generation_tokens {
            tokens = decode_batch(model, &tokens, &ids, &mut paged)?.argmax()?.to_vec::<u32>()?;
        }
    }
    let gen_time = start.elapsed().as_secs_f64();
    Ok(Trial {
        prompt_tps: (b * t.prompt_tokens) as f64 / prompt_time,
        generation_tps: if t.generation_tokens > 1 { (b * (t.generation_tokens - 1)) as f64 / gen_time } else { 0.0 },
        peak: peak_memory(),
        replayed: 0,
        positions: paged.positions(ids[0])?,
    })
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let lists = [
        ("--prompt-tokens", &args.prompt_tokens),
        ("--generation-tokens", &args.generation_tokens),
        ("--batch-size", &args.batch_size),
    ];
    for (flag, values) in lists {
        if values.is_empty() || values.contains(&0) {
            return Err(format!("{flag} must be at least 1 (each value of a comma list)").into());
        }
    }
    if args.num_trials == 0 {
        return Err("--num-trials must be at least 1".into());
    }
    if args.speculation_max_batch.is_some() && !args.prompt_lookup && args.draft_model.is_none() {
        return Err("--speculation-max-batch needs --prompt-lookup or --draft-model".into());
    }
    args.threads.apply()?;
    let model_path = args.load.name()?;
    let pipeline = args.split.pipeline()?;
    let (mut model, tokenizer) =
        args.load.load_as(&model_path, parse_device(&args.device)?, vec![], false, pipeline)?;
    args.split.shard(&mut model)?;
    let grammar = args.constraint.grammar(&tokenizer)?;
    if grammar.is_some() && args.workload.is_none() {
        return Err("the structured-output flags (--json, --json-schema, --regex, --choice, --grammar) apply to \
                    --workload runs: give a workload file"
            .into());
    }
    if let Some(kv) = args.kv_dtype {
        // Every cache of the run (alone, paged, the Batcher's) takes the model's type.
        model.set_kv_dtype(kv);
    }
    let model = model;
    if let Some(path) = &args.workload {
        let options = BatcherOptions {
            prefix_cache: args.no_prefix_cache.then_some(false),
            blocks: args.blocks,
            kv_bits: args.kv_bits,
            kv_group_size: args.kv_group_size,
            speculation: (args.prompt_lookup || args.draft_model.is_some()).then_some(nuvec_lm::BatchSpeculation {
                num_draft: args.num_draft_tokens,
                max_decodes: args.speculation_max_batch,
                ..Default::default()
            }),
            ..Default::default()
        };
        let draft = match &args.draft_model {
            Some(d) => Some(nuvec_lm::load_on(d, model.device())?.0),
            None => None,
        };
        if model.ranks().is_some_and(|group| group.rank() != 0) {
            // Rank 0 runs the workload; this rank its part of every step rank 0's Batcher takes.
            nuvec_lm::Batcher::follow(&model)?;
            return Ok(());
        }
        return crate::workload::run(&model, draft.as_ref(), path, options, grammar, args.temp);
    }
    // llama-bench's order: prompt lengths outermost, then generation lengths, batch sizes, depths.
    let mut tests = vec![];
    for &prompt_tokens in &args.prompt_tokens {
        for &generation_tokens in &args.generation_tokens {
            for &batch_size in &args.batch_size {
                for &depth in &args.depth {
                    tests.push(Test { prompt_tokens, generation_tokens, batch_size, depth });
                }
            }
        }
    }
    // Every rank of a split model runs the tests; rank 0 reports them.
    let quiet = model.ranks().is_some_and(|group| group.rank() != 0);
    let mut report = Report::new(args.output, &model_path, model.device().to_string(), quiet);
    for t in tests {
        let summary = run_test(&model, &args, t, &report)?;
        report.test(t, summary);
    }
    report.finish();
    Ok(())
}

/// A test's trials: the mean and the standard deviation of each rate, the peak memory.
pub struct Summary {
    pub trials: usize,
    pub prompt_tps: (f64, f64),
    pub generation_tps: (f64, f64),
    pub peak: u64,
    /// The first sequence's cache positions after the last trial.
    pub positions: usize,
}

/// Mean and (sample) standard deviation.
fn mean_sd(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = if values.len() > 1 { values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    (mean, var.sqrt())
}

/// One test: its warm-up and timed trials, each trial's line (and, in text, the averages) as
/// mlx_lm.benchmark prints them.
fn run_test(model: &Model, args: &Args, t: Test, report: &Report) -> Result<Summary, Box<dyn std::error::Error>> {
    let vocab = model.vocab_size();
    let seeds = (0..t.batch_size as u64).map(|i| args.seed.wrapping_add(i));
    let prompts: Vec<Vec<u32>> = seeds.clone().map(|s| random_tokens(t.prompt_tokens, vocab, s)).collect();
    // The context of each sequence from seeds of its own (no prompt repeats its context).
    let contexts: Vec<Vec<u32>> = seeds.map(|s| random_tokens(t.depth, vocab, s ^ 0x5eed_c0de)).collect();
    report.line(&format!(
        "Running benchmark on {} with prompt_tokens={}, generation_tokens={}, batch_size={}, depth={}, threads={}",
        model.device(),
        t.prompt_tokens,
        t.generation_tokens,
        t.batch_size,
        t.depth,
        nuvec::backends::cpu::num_threads()
    ));
    let graphs = GraphMode::for_device(model.device())?;
    let run_trial = |graphs| match (t.batch_size, args.kv_bits) {
        (1, None) => trial(model, (&contexts[0], &prompts[0]), args, t, graphs),
        _ => batch_trial(model, (&contexts, &prompts), args, t),
    };
    if !args.no_warmup {
        run_trial(graphs)?;
    }
    let mut trials = vec![];
    for i in 0..args.num_trials {
        let tr = run_trial(graphs)?;
        report.line(&format!(
            "Trial {}:  prompt_tps={:.3}, generation_tps={:.3}, peak_memory={:.3}",
            i + 1,
            tr.prompt_tps,
            tr.generation_tps,
            tr.peak as f64 / 1e9
        ));
        trials.push(tr);
    }
    let summary = Summary {
        trials: trials.len(),
        prompt_tps: mean_sd(&trials.iter().map(|t| t.prompt_tps).collect::<Vec<_>>()),
        generation_tps: mean_sd(&trials.iter().map(|t| t.generation_tps).collect::<Vec<_>>()),
        peak: trials.iter().map(|t| t.peak).max().unwrap_or(0),
        positions: trials.last().map_or(0, |t| t.positions),
    };
    report.line(&format!(
        "Averages: prompt_tps={:.3}, generation_tps={:.3}, peak_memory={:.3}",
        summary.prompt_tps.0,
        summary.generation_tps.0,
        summary.peak as f64 / 1e9
    ));
    // CUDA graphs: when steps were replayed, one more trial without them, per-token times side
    // by side.
    let replayed = trials.iter().map(|t| t.replayed).sum::<usize>();
    if replayed > 0 {
        let eager = trial(model, (&contexts[0], &prompts[0]), args, t, GraphMode::Off)?;
        report.line(&format!(
            "CUDA graphs: decode {:.3} ms/token with graphs ({} of {} steps replayed per trial), \
             {:.3} ms/token eager (NUVEC_CUDA_GRAPHS=0)",
            1e3 / summary.generation_tps.0,
            replayed / trials.len(),
            t.generation_tokens - 1,
            1e3 / eager.generation_tps
        ));
    }
    Ok(summary)
}
