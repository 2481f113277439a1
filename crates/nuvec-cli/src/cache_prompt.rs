//! `nuvec cache-prompt`: prefill a prompt once and save the cache (as mlx_lm.cache_prompt), for
//! `nuvec generate --prompt-cache-file` to continue from.

use std::path::PathBuf;

use clap::Parser;
use nuvec_lm::{prompt_cache, Session};

use crate::common::{read_prompt, KvArgs, ThreadArgs};

/// Prefill a prompt and save the KV cache to a file.
#[derive(Parser, Debug)]
#[command(allow_negative_numbers = true)]
pub struct Args {
    #[command(flatten)]
    load: crate::common::LoadArgs,
    /// The prompt to cache; `-` reads stdin. With a chat template it becomes the start of the
    /// user's message (as mlx_lm.cache_prompt).
    #[arg(short = 'p', long, required_unless_present = "file")]
    prompt: Option<String>,
    /// Read the prompt from this file instead (as is), as llama.cpp's -f.
    #[arg(short = 'f', long, value_name = "FILE", conflicts_with = "prompt")]
    file: Option<PathBuf>,
    #[command(flatten)]
    threads: ThreadArgs,
    /// Where to save the cache (a .safetensors file). An existing prompt cache is replaced;
    /// any other existing file is refused unless --force.
    #[arg(long)]
    prompt_cache_file: PathBuf,
    /// Replace --prompt-cache-file even if it is not a prompt cache.
    #[arg(long)]
    force: bool,
    /// Prompt tokens processed per forward pass.
    #[arg(long, default_value_t = 2048)]
    prefill_step_size: usize,
    #[command(flatten)]
    kv: KvArgs,
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    args.threads.apply()?;
    let model_name = args.load.name()?;
    let prompt = read_prompt(args.prompt.as_deref().unwrap_or_default(), args.file.as_deref(), false)?;
    // Refuse a target that cannot or must not be written before the prefill, not after it.
    let target = prompt_cache::prepare_save(&args.prompt_cache_file, args.force)?;
    let (model, tokenizer) = args.load.load(&model_name, nuvec::Device::Cpu)?;
    let ids = crate::generate::cached_prompt_ids(&tokenizer, &prompt)?;
    let started = std::time::Instant::now();
    let kv = args.kv.options();
    let mut session = Session::with_cache(&model, &kv)?;
    let bar = crate::progress::Bar::on_terminal();
    session.prefill_reporting(&model, &ids, args.prefill_step_size, &kv, &|done, total| {
        if let Some(bar) = &bar {
            bar.report("Prefill", "tokens", done, total);
        }
    })?;
    let secs = started.elapsed().as_secs_f64();
    eprintln!("Processed {} tokens ({:.2} tok/s)", ids.len(), ids.len() as f64 / secs.max(1e-9));
    target.save(&model, &model_name, &session, &kv, &prompt)?;
    eprintln!("Saved {}", args.prompt_cache_file.display());
    Ok(())
}
