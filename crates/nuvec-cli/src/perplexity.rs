//! `nuvec perplexity`: a model's perplexity over a dataset, as mlx_lm.perplexity computes and
//! prints it (its flags and defaults; the windows drawn in the same order for the same seed),
//! the windows batched through the batch-first step.

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use nuvec_lm::perplexity::{evaluate, Dataset};

use crate::common::{parse_device, peak_memory, ThreadArgs};

/// Evaluate a model's perplexity on a dataset (as mlx_lm.perplexity).
#[derive(Parser, Debug)]
#[command(allow_negative_numbers = true)]
pub struct Args {
    #[command(flatten)]
    load: crate::common::LoadArgs,
    /// The dataset: a folder in mlx-lm's local layout (train.jsonl is read) or a .jsonl file of
    /// records with "text", "messages", or "prompt" and "completion". Hugging Face dataset ids
    /// (mlx-lm's default, allenai/tulu-3-sft-mixture) are not downloaded.
    #[arg(long)]
    data_path: PathBuf,
    /// Windows scored per forward pass.
    #[arg(long, default_value_t = 8)]
    batch_size: usize,
    /// Tokens per window.
    #[arg(long, default_value_t = 512)]
    sequence_length: usize,
    /// Windows to score (-1: every whole window the dataset holds).
    #[arg(long, default_value_t = 256)]
    num_samples: i64,
    /// The seed of the records' order (numpy's permutation, as mlx-lm draws it).
    #[arg(long, default_value_t = 123)]
    seed: u32,
    /// Device: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    device: String,
    #[command(flatten)]
    threads: ThreadArgs,
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    args.threads.apply()?;
    let samples = match args.num_samples {
        -1 => None,
        n if n > 0 => Some(n as usize),
        n => return Err(format!("--num-samples {n}: give a positive count, or -1 for every window").into()),
    };
    if args.batch_size == 0 {
        return Err("--batch-size must be at least 1".into());
    }
    if args.sequence_length < 2 {
        return Err("--sequence-length must be at least 2 (a token and the one it predicts)".into());
    }
    let dataset = Dataset::open(&args.data_path)?;
    let model_name = args.load.name()?;
    println!("Loading model from {model_name}...");
    let (model, tokenizer) = args.load.load(&model_name, parse_device(&args.device)?)?;
    println!("\nLoading dataset...");
    println!("  Sequence length: {}", args.sequence_length);
    let windows = dataset.windows(&tokenizer, args.sequence_length, samples, args.seed)?;
    println!("  Loaded {} samples", windows.len());
    println!("\nEvaluating perplexity with batch size {}...", args.batch_size);
    let started = Instant::now();
    let result = evaluate(&model, &windows, args.batch_size, |done, total| {
        eprint!("  Processed {done}/{total} batches...\r");
    })?;
    eprintln!();
    let secs = started.elapsed().as_secs_f64();
    println!("\n{}", "=".repeat(60));
    println!("EVALUATION RESULTS");
    println!("{}", "=".repeat(60));
    println!("Model: {model_name}");
    println!("Perplexity: {:.3} ± {:.3}", result.perplexity, result.standard_error);
    println!("Evaluation time: {secs:.2} seconds");
    println!("Peak memory: {:.2} GB", peak_memory() as f64 / 1e9);
    println!("Tokens per second: {:.0}", result.tokens as f64 / secs.max(1e-9));
    println!("\nDataset statistics:");
    println!("  Total samples: {}", windows.len());
    println!("  Total tokens: {}", windows.len() * args.sequence_length);
    Ok(())
}
