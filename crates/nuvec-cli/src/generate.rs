//! `nuvec generate`: mlx_lm.generate's flags and output.

use std::io::{Read, Write};

use clap::Parser;
use nuvec_lm::{generate, load, GenerateOptions, Message, Sampler, StreamDecoder};

use crate::default_model;

/// Generate text from a prompt, as `mlx_lm.generate` does.
#[derive(Parser, Debug)]
pub struct Args {
    /// Model directory, Hugging Face repo id in the local cache, or .gguf file
    /// (default: SmolLM2-135M-Instruct, see scripts/get-default-model.sh).
    #[arg(long)]
    model: Option<String>,
    /// Message to the model; `-` reads stdin. `\n` and `\t` are expanded.
    #[arg(short = 'p', long, default_value = "hello")]
    prompt: String,
    /// System prompt for the chat template.
    #[arg(long)]
    system_prompt: Option<String>,
    /// Maximum number of tokens to generate.
    #[arg(short = 'm', long, default_value_t = 100)]
    max_tokens: usize,
    /// Sampling temperature (0 is greedy).
    #[arg(long, default_value_t = 0.0)]
    temp: f32,
    /// Nucleus sampling mass (1.0 is off).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Min-p sampling threshold (0 is off).
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Tokens min-p always keeps.
    #[arg(long, default_value_t = 1)]
    min_tokens_to_keep: usize,
    /// Top-k sampling (0 is off).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Seed of the sampler's random stream.
    #[arg(long)]
    seed: Option<u64>,
    /// Use the raw prompt without the tokenizer's chat template.
    #[arg(long)]
    ignore_chat_template: bool,
    /// Extra keyword arguments for the chat template, as a JSON object (e.g. '{"enable_thinking": false}').
    #[arg(long)]
    chat_template_config: Option<String>,
    /// Tokens (as text) that also end generation; repeatable.
    #[arg(long, num_args = 1..)]
    extra_eos_token: Vec<String>,
    /// Prompt tokens processed per forward pass.
    #[arg(long, default_value_t = 2048)]
    prefill_step_size: usize,
    /// Print the statistics block (to stderr) after the text: true or false.
    #[arg(long, default_value = "true", value_parser = parse_bool, action = clap::ArgAction::Set)]
    verbose: bool,
}

fn parse_bool(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "t" | "1" | "yes" => Ok(true),
        "false" | "f" | "0" | "no" => Ok(false),
        _ => Err(format!("{s:?} is not true or false")),
    }
}

/// Peak resident memory of this process, in bytes (Linux; 0 elsewhere).
fn peak_memory() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let model_path = match &args.model {
        Some(m) => m.clone(),
        None => default_model::resolve()?,
    };
    let sampler = Sampler {
        temperature: args.temp,
        top_p: args.top_p,
        min_p: args.min_p,
        min_tokens_to_keep: args.min_tokens_to_keep,
        top_k: args.top_k,
    };
    sampler.validate()?;
    for ignored in sampler.ignored_settings() {
        eprintln!("warning: {ignored} has no effect");
    }
    let template_kwargs: serde_json::Map<String, serde_json::Value> = match &args.chat_template_config {
        None => Default::default(),
        Some(text) => match serde_json::from_str(text) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => return Err(format!("--chat-template-config must be a JSON object, got {text:?}").into()),
        },
    };
    let mut prompt = args.prompt.replace("\\n", "\n").replace("\\t", "\t");
    if prompt == "-" {
        prompt.clear();
        std::io::stdin().read_to_string(&mut prompt)?;
    }

    let (model, mut tokenizer) = load(&model_path)?;
    for token in &args.extra_eos_token {
        tokenizer.add_eos_token(token)?;
    }
    let ids = match tokenizer.chat_template().filter(|_| !args.ignore_chat_template) {
        Some(template) => {
            let mut messages = vec![];
            if let Some(system) = &args.system_prompt {
                messages.push(Message::new("system", system));
            }
            messages.push(Message::new("user", &prompt));
            let mut ctx = template_kwargs;
            for (key, value) in [("bos_token", tokenizer.bos_token()), ("eos_token", tokenizer.eos_token())] {
                if let Some(v) = value {
                    ctx.entry(key.to_string()).or_insert(v.into());
                }
            }
            let text = template.render(&messages, true, &ctx)?;
            // The template already wrote the special tokens (as mlx_lm.generate).
            tokenizer.encode(&text, false)?
        }
        None => tokenizer.encode(&prompt, true)?,
    };

    let options = GenerateOptions {
        max_tokens: args.max_tokens,
        sampler,
        seed: args.seed,
        prefill_step_size: args.prefill_step_size,
        extra_eos_token_ids: tokenizer.eos_token_ids().to_vec(),
    };
    let mut generation = generate(&model, &ids, options)?;
    let mut decoder = StreamDecoder::default();
    let mut out = std::io::stdout().lock();
    let mut wrote = false;
    for id in generation.by_ref() {
        let text = decoder.push(&tokenizer, id?)?;
        wrote |= !text.is_empty();
        out.write_all(text.as_bytes())?;
        out.flush()?;
    }
    let rest = decoder.finish(&tokenizer)?;
    out.write_all(rest.as_bytes())?;
    writeln!(out)?;
    out.flush()?;
    if args.verbose {
        let stats = generation.stats();
        if !wrote && rest.is_empty() {
            eprintln!("No text generated for this prompt");
        }
        eprintln!("==========");
        eprintln!("Prompt: {} tokens, {:.3} tokens-per-sec", stats.prompt_tokens, stats.prompt_tps());
        eprintln!("Generation: {} tokens, {:.3} tokens-per-sec", stats.generation_tokens, stats.generation_tps());
        eprintln!("Peak memory: {:.3} GB", peak_memory() as f64 / 1e9);
    }
    Ok(())
}
