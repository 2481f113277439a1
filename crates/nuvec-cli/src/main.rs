//! `nuvec`: the command line, shaped like mlx-lm's (`nuvec generate` ~ `mlx_lm.generate`).

mod bench;
mod bench_report;
mod cache_prompt;
mod chat;
mod common;
mod constraint;
mod convert;
mod default_model;
mod fuse;
mod generate;
mod manage;
mod perplexity;
mod progress;
mod serve;
mod version;
mod workload;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "nuvec",
    version,
    about = "Run open-weight language models: mlx-lm's semantics, on CPUs and NVIDIA GPUs (build with --features cuda)",
    after_help = "`nuvec --help-env` lists the environment knobs (NUVEC_*)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once; boxing would only add noise
enum Command {
    /// Generate text from a prompt (as mlx_lm.generate).
    Generate(generate::Args),
    /// Measure prompt and generation speed on random tokens (as mlx_lm.benchmark).
    Bench(bench::Args),
    /// Chat with a model, one persistent cache across turns (as mlx_lm.chat).
    Chat(chat::Args),
    /// Prefill a prompt and save its KV cache to a file (as mlx_lm.cache_prompt).
    CachePrompt(cache_prompt::Args),
    /// Convert a Hugging Face, MLX or GGUF checkpoint to MLX format (as mlx_lm.convert).
    Convert(convert::Args),
    /// Add an adapter's LoRA / DoRA terms into a model's weights (as mlx_lm.fuse).
    Fuse(fuse::Args),
    /// Serve a model with OpenAI's HTTP API, requests batched continuously (as mlx_lm.server).
    Serve(serve::Args),
    /// List or delete models in the Hugging Face cache (as mlx_lm.manage).
    Manage(manage::Args),
    /// Evaluate a model's perplexity on a dataset (as mlx_lm.perplexity).
    Perplexity(perplexity::Args),
}

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("--help-env") => {
            print!("{}", nuvec::tuning::help());
            return;
        }
        Some("--version" | "-V") => {
            print!("{}", version::text());
            return;
        }
        _ => {}
    }
    let cli = Cli::parse();
    // A knob set to a value its reader would take for the default is refused before any work.
    if let Err(why) = nuvec::tuning::check_env() {
        eprintln!("error: {why}");
        std::process::exit(1);
    }
    let result = match cli.command {
        Command::Generate(args) => generate::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Convert(args) => convert::run(args),
        Command::Fuse(args) => fuse::run(args),
        Command::Chat(args) => chat::run(args),
        Command::CachePrompt(args) => cache_prompt::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Manage(args) => manage::run(args),
        Command::Perplexity(args) => perplexity::run(args),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    /// clap's own checks of the definitions (no short flag twice in a command, every
    /// `conflicts_with` and `requires` naming an argument that exists, ...).
    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
