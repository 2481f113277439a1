//! `nuvec chat`: a REPL over one persistent cache (as mlx_lm.chat). Each turn renders the whole
//! conversation through the chat template and computes only the tokens the cache does not
//! already hold, so turn N costs its own tokens, not the conversation's.

use std::io::{BufRead, IsTerminal, Write};

use clap::Parser;
use nuvec_lm::{generate_in, load, GenerateOptions, Sampler, Session, TextStream};
use serde_json::{json, Value};

use crate::default_model;

/// Chat with a model in the terminal (or over a pipe: one message per line).
#[derive(Parser, Debug)]
pub struct Args {
    /// Model directory, Hugging Face repo id in the local cache, or .gguf file (default: SmolLM2).
    #[arg(long)]
    model: Option<String>,
    /// System prompt for the conversation.
    #[arg(long)]
    system_prompt: Option<String>,
    /// Maximum tokens per answer.
    #[arg(short = 'm', long, default_value_t = 256)]
    max_tokens: usize,
    /// Sampling temperature (0 is greedy).
    #[arg(long, default_value_t = 0.0)]
    temp: f32,
    /// Nucleus sampling mass (filters only inside (0, 1)).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Probability of applying XTC at each step.
    #[arg(long, default_value_t = 0.0)]
    xtc_probability: f32,
    /// XTC's probability threshold.
    #[arg(long, default_value_t = 0.1)]
    xtc_threshold: f32,
    /// Seed of the sampler's random stream.
    #[arg(long)]
    seed: Option<u64>,
    /// Bound the KV cache to this many positions (a rotating cache).
    #[arg(long)]
    max_kv_size: Option<usize>,
    /// Prompt tokens processed per forward pass.
    #[arg(long, default_value_t = 2048)]
    prefill_step_size: usize,
}

const HELP: &str =
    "Type a message and press Enter. Commands: 'q' quits, 'r' resets the conversation, 'h' shows this help.";

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    if args.max_kv_size.is_some() {
        return Err("--max-kv-size needs the rotating KV cache, which is not built yet".into());
    }
    let model_path = match &args.model {
        Some(m) => m.clone(),
        None => default_model::resolve()?,
    };
    let sampler = Sampler {
        temperature: args.temp,
        top_p: args.top_p,
        xtc_probability: args.xtc_probability,
        xtc_threshold: args.xtc_threshold,
        ..Default::default()
    };
    sampler.validate()?;
    for note in sampler.ignored_settings() {
        eprintln!("warning: {note}");
    }
    let (model, tokenizer) = load(&model_path)?;
    let template = tokenizer
        .chat_template()
        .ok_or_else(|| format!("{model_path} has no chat template: use `nuvec generate` for a base model"))?;
    let mut context = serde_json::Map::new();
    for (key, value) in [("bos_token", tokenizer.bos_token()), ("eos_token", tokenizer.eos_token())] {
        if let Some(v) = value {
            context.insert(key.to_string(), v.into());
        }
    }
    let fresh =
        || -> Vec<Value> { args.system_prompt.iter().map(|s| json!({"role": "system", "content": s})).collect() };
    let interactive = std::io::stdin().is_terminal();
    let mut messages = fresh();
    let mut session = Session::new(&model);
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    if interactive {
        eprintln!("[INFO] Chatting with {model_path}. {HELP}");
    }
    loop {
        if interactive {
            write!(out, ">> ")?;
            out.flush()?;
        }
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break; // end of input
        }
        let query = line.trim_end_matches(['\n', '\r']);
        match query {
            "q" => break,
            "r" => {
                messages = fresh();
                session = Session::new(&model);
                eprintln!("[INFO] The conversation was reset.");
                continue;
            }
            "h" => {
                eprintln!("{HELP}");
                continue;
            }
            "" => continue,
            _ => {}
        }
        messages.push(json!({"role": "user", "content": query}));
        let rendered = template.render_values(&Value::Array(messages.clone()), true, false, &context)?;
        let ids = tokenizer.encode(&rendered, false)?;
        let options = GenerateOptions {
            max_tokens: args.max_tokens,
            sampler: sampler.clone(),
            seed: args.seed,
            prefill_step_size: args.prefill_step_size,
            ..Default::default()
        };
        let mut text = TextStream::new(&tokenizer, &options);
        let mut generation = generate_in(&model, &mut session, &ids, options)?;
        let mut reply = Vec::new();
        for id in generation.by_ref() {
            let id = id?;
            reply.push(id);
            write!(out, "{}", text.push(id))?;
            out.flush()?;
        }
        writeln!(out, "{}", text.finish())?;
        out.flush()?;
        messages.push(json!({"role": "assistant", "content": tokenizer.decode(&reply)?}));
    }
    Ok(())
}
