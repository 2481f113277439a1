//! `nuvec bench`: prompt and generation throughput on random tokens, shaped like `mlx_lm.benchmark`.
//!
//! The model is driven directly (no sampler, no stop conditions: EOS is ignored), so every trial
//! processes exactly `-p` prompt tokens and generates exactly `-g` tokens (greedy).

use std::time::Instant;

use clap::Parser;
use nuvec_lm::decode_graph::{DecodeGraph, GraphMode};
use nuvec_lm::{decode_batch, default_prefill_step, load_on, BatcherOptions, Model, PagedCache, SeqId};

use crate::common::{model_or_default, parse_device, peak_memory};

/// Measure prompt processing and generation speed, as `mlx_lm.benchmark` does.
#[derive(Parser, Debug)]
pub struct Args {
    /// Model directory, Hugging Face repo id in the local cache, or .gguf file
    /// (default: SmolLM2-135M-Instruct, see scripts/get-default-model.sh).
    #[arg(long)]
    model: Option<String>,
    /// Prompt length in (random) tokens.
    #[arg(short = 'p', long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Tokens to generate per trial.
    #[arg(short = 'g', long, default_value_t = 1024)]
    generation_tokens: usize,
    /// Sequences decoded together (as mlx_lm.benchmark's -b): each gets its own random prompt
    /// of -p tokens and generates -g; the rates are totals over all of them. Above 1 the
    /// sequences live in a paged cache and every decode step is one forward pass for all.
    #[arg(short = 'b', long, default_value_t = 1)]
    batch_size: usize,
    /// Timed trials (after one untimed warm-up).
    #[arg(short = 'n', long, default_value_t = 5)]
    num_trials: usize,
    /// Prompt tokens processed per forward pass (default 2048 on the CPU, as mlx-lm; 4096 on
    /// CUDA, where each pass decodes the quantized weights for the tensor cores).
    #[arg(long)]
    prefill_step_size: Option<usize>,
    /// Where the model runs: cpu, cuda or cuda:N (cuda needs a build with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Worker threads for the CPU kernels (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Seed of the random prompt.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Skip the untimed warm-up trial.
    #[arg(long)]
    no_warmup: bool,
    /// Run a serving workload through the Batcher instead: a JSON file of requests with
    /// arrival times, as bench/compare-serve-workload writes (see crates/nuvec-cli/src/workload.rs);
    /// reports throughput, time to first token and inter-token latency.
    #[arg(long, value_name = "FILE")]
    workload: Option<String>,
    /// With --workload: turn the Batcher's prefix cache off.
    #[arg(long, requires = "workload")]
    no_prefix_cache: bool,
    /// With --workload: cache blocks of 16 positions (default: sized from memory).
    #[arg(long, requires = "workload")]
    blocks: Option<usize>,
    /// With --workload: every request's output held to this (structured output). Requests then
    /// end where their grammar does, or at their max_tokens, instead of ignoring end-of-sequence.
    #[command(flatten)]
    constraint: crate::constraint::ConstraintArgs,
    /// Quantize the paged cache's keys and values to this many bits (the CPU; as `nuvec serve
    /// --kv-bits`): the sequences, even one, then run in a quantized paged cache.
    #[arg(long)]
    kv_bits: Option<usize>,
    /// Values per quantization group of the KV cache, with --kv-bits.
    #[arg(long, default_value_t = 64)]
    kv_group_size: usize,
    /// Store keys and values as f32, f16 or bf16 (default: the model's own type, f16 for GGUF).
    #[arg(long, value_parser = crate::common::parse_kv_dtype)]
    kv_dtype: Option<nuvec_lm::cache::KvDtype>,
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
}

fn trial(model: &Model, prompt: &[u32], args: &Args, graphs: GraphMode) -> Result<Trial, Box<dyn std::error::Error>> {
    let mut cache = model.new_cache();
    let start = Instant::now();
    // As mlx-lm: chunks of prefill_step_size, the last prompt token goes through the first step.
    let (body, last) = prompt.split_at(prompt.len() - 1);
    let step = args.prefill_step_size.unwrap_or_else(|| default_prefill_step(model.device()));
    for chunk in body.chunks(step.max(1)) {
        model.prefill(chunk, &mut cache)?;
    }
    // Greedy, with the argmax where the logits are (on a GPU only the token id comes back).
    let mut token = argmax(&model.forward_last(last, &mut cache)?)?;
    let prompt_time = start.elapsed().as_secs_f64();
    let start = Instant::now();
    // One-token steps as CUDA graphs where the model allows (NUVEC_CUDA_GRAPHS=0: never).
    let mut steps = DecodeGraph::new(graphs);
    for _ in 1..args.generation_tokens {
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
        generation_tps: if args.generation_tokens > 1 { (args.generation_tokens - 1) as f64 / gen_time } else { 0.0 },
        peak: peak_memory(),
        replayed: steps.replayed_steps(),
    })
}

/// `prompts.len()` sequences together in a paged cache: the prompts prefilled in steps of at
/// most `prefill_step_size` rows (whole prompts of several sequences per step where they fit),
/// then every decode step one forward pass over all sequences.
fn batch_trial(model: &Model, prompts: &[Vec<u32>], args: &Args) -> Result<Trial, Box<dyn std::error::Error>> {
    const BLOCK: usize = nuvec_lm::cache::paged::DEFAULT_BLOCK_SIZE;
    let b = prompts.len();
    let per_seq = (args.prompt_tokens + args.generation_tokens).div_ceil(BLOCK);
    let mut paged = match args.kv_bits {
        Some(bits) => PagedCache::new_quantized(model, b * per_seq, BLOCK, b, bits, args.kv_group_size)?,
        None => PagedCache::new(model, b * per_seq, BLOCK, b)?,
    };
    let ids: Vec<SeqId> = (0..b).map(|_| paged.add()).collect::<Result<_, _>>()?;
    let step = args.prefill_step_size.unwrap_or_else(|| default_prefill_step(model.device())).max(1);
    let start = Instant::now();
    // As mlx-lm: the prompt but its last token is prefilled; the last goes through the first step.
    let body = args.prompt_tokens - 1;
    for chunk_start in (0..body).step_by(step) {
        let chunk_end = (chunk_start + step).min(body);
        let per_step = (step / (chunk_end - chunk_start)).max(1);
        for group in ids.iter().zip(prompts).collect::<Vec<_>>().chunks(per_step) {
            let work: Vec<(SeqId, &[u32])> = group.iter().map(|(&id, p)| (id, &p[chunk_start..chunk_end])).collect();
            paged.step(model, &work)?;
        }
    }
    let mut tokens: Vec<u32> = prompts.iter().map(|p| p[p.len() - 1]).collect();
    tokens = decode_batch(model, &tokens, &ids, &mut paged)?.argmax()?.to_vec::<u32>()?;
    let prompt_time = start.elapsed().as_secs_f64();
    let start = Instant::now();
    for _ in 1..args.generation_tokens {
        tokens = decode_batch(model, &tokens, &ids, &mut paged)?.argmax()?.to_vec::<u32>()?;
    }
    let gen_time = start.elapsed().as_secs_f64();
    Ok(Trial {
        prompt_tps: (b * args.prompt_tokens) as f64 / prompt_time,
        generation_tps: if args.generation_tokens > 1 {
            (b * (args.generation_tokens - 1)) as f64 / gen_time
        } else {
            0.0
        },
        peak: peak_memory(),
        replayed: 0,
    })
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    if args.prompt_tokens == 0 || args.generation_tokens == 0 || args.num_trials == 0 || args.batch_size == 0 {
        return Err("--prompt-tokens, --generation-tokens, --num-trials and --batch-size must be at least 1".into());
    }
    if let Some(threads) = args.threads {
        nuvec::backends::cpu::set_num_threads(threads)?;
    }
    let model_path = model_or_default(&args.model)?;
    let (mut model, tokenizer) = load_on(&model_path, parse_device(&args.device)?)?;
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
            ..Default::default()
        };
        return crate::workload::run(&model, path, options, grammar);
    }
    let prompts: Vec<Vec<u32>> = (0..args.batch_size as u64)
        .map(|i| random_tokens(args.prompt_tokens, model.vocab_size(), args.seed.wrapping_add(i)))
        .collect();
    println!(
        "Running benchmark on {} with prompt_tokens={}, generation_tokens={}, batch_size={}, threads={}",
        model.device(),
        args.prompt_tokens,
        args.generation_tokens,
        args.batch_size,
        nuvec::backends::cpu::num_threads()
    );
    let graphs = GraphMode::from_env()?;
    let run_trial = |graphs| match (args.batch_size, args.kv_bits) {
        (1, None) => trial(&model, &prompts[0], &args, graphs),
        _ => batch_trial(&model, &prompts, &args),
    };
    if !args.no_warmup {
        run_trial(graphs)?;
    }
    let mut trials = vec![];
    for i in 0..args.num_trials {
        let t = run_trial(graphs)?;
        println!(
            "Trial {}:  prompt_tps={:.3}, generation_tps={:.3}, peak_memory={:.3}",
            i + 1,
            t.prompt_tps,
            t.generation_tps,
            t.peak as f64 / 1e9
        );
        trials.push(t);
    }
    let n = trials.len() as f64;
    println!(
        "Averages: prompt_tps={:.3}, generation_tps={:.3}, peak_memory={:.3}",
        trials.iter().map(|t| t.prompt_tps).sum::<f64>() / n,
        trials.iter().map(|t| t.generation_tps).sum::<f64>() / n,
        trials.iter().map(|t| t.peak).max().unwrap_or(0) as f64 / 1e9
    );
    // CUDA graphs: when steps were replayed, one more trial without them, per-token times side
    // by side.
    let replayed = trials.iter().map(|t| t.replayed).sum::<usize>();
    if replayed > 0 {
        let eager = trial(&model, &prompts[0], &args, GraphMode::Off)?;
        let graph_tps = trials.iter().map(|t| t.generation_tps).sum::<f64>() / n;
        println!(
            "CUDA graphs: decode {:.3} ms/token with graphs ({} of {} steps replayed per trial), \
             {:.3} ms/token eager (NUVEC_CUDA_GRAPHS=0)",
            1e3 / graph_tps,
            replayed / trials.len(),
            args.generation_tokens - 1,
            1e3 / eager.generation_tps
        );
    }
    Ok(())
}
