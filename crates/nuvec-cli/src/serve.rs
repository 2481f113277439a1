//! `nuvec serve`: an OpenAI-compatible server over the continuous-batching Batcher (as
//! mlx_lm.server, with its flags where they exist).

use clap::Parser;
use nuvec_lm::{default_prefill_step, load_on, BatcherOptions, GenerateOptions, Sampler};
use nuvec_server::{Server, ServerConfig, DEFAULT_BODY_LIMIT, DEFAULT_MAX_QUEUE};

use crate::common::model_or_default;

/// Serve a model over HTTP with OpenAI's API (as mlx_lm.server).
#[derive(Parser, Debug)]
#[command(allow_negative_numbers = true)]
pub struct Args {
    /// Model directory, Hugging Face repo id in the local cache, or .gguf file
    /// (default: SmolLM2-135M-Instruct, see scripts/get-default-model.sh).
    #[arg(long)]
    model: Option<String>,
    /// The model's id in the API (what /v1/models lists and requests may name); default the
    /// repo id, or the file or directory name of a path.
    #[arg(long)]
    served_model_name: Option<String>,
    /// Where the model runs: cpu, cuda or cuda:N (cuda needs a build with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Worker threads for the CPU kernels (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 takes a free one; the address is printed to stderr).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Most tokens an answer gets when the request does not say (max_tokens).
    #[arg(short = 'm', long, default_value_t = 512)]
    max_tokens: usize,
    /// Default sampling temperature (0 is greedy).
    #[arg(long, default_value_t = 0.0)]
    temp: f32,
    /// Default nucleus sampling mass (filters only inside (0, 1)).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Default top-k (0 is off).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Default min-p (0 is off).
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Most requests decoded together; more wait their turn.
    #[arg(long, default_value_t = 32)]
    max_batch: usize,
    /// Require this key as `Authorization: Bearer <key>` on /v1 (not on /health).
    #[arg(long)]
    api_key: Option<String>,
    /// Origins allowed by CORS, e.g. http://localhost:3000 or * (repeatable or comma-separated;
    /// CORS is off unless given).
    #[arg(long, num_args = 1.., value_delimiter = ',')]
    allowed_origins: Vec<String>,
    /// Extra keyword arguments for the chat template, as a JSON object (e.g. '{"enable_thinking": false}').
    #[arg(long)]
    chat_template_args: Option<String>,
    /// Prompt tokens processed per forward pass (default 2048 on the CPU, 4096 on CUDA).
    #[arg(long)]
    prefill_step_size: Option<usize>,
    /// Give every request exactly the tokens it gets alone, at a cost in speed (each sequence
    /// runs as a pass of its own).
    #[arg(long)]
    batch_invariant: bool,
    /// Largest request body in bytes (413 above).
    #[arg(long, default_value_t = DEFAULT_BODY_LIMIT)]
    max_body_bytes: usize,
    /// Most requests waiting for a place in the batch; more get 429 (rate_limit_exceeded,
    /// with Retry-After) until the queue drains.
    #[arg(long, default_value_t = DEFAULT_MAX_QUEUE)]
    max_queue: usize,
}

/// The id a model is served as: a repo id as given, a path's file (without `.gguf`) or
/// directory name.
fn model_id(model: &str) -> String {
    let path = std::path::Path::new(model);
    if !path.exists() {
        return model.to_string();
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| model.to_string());
    name.strip_suffix(".gguf").map(str::to_string).unwrap_or(name)
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let model_path = model_or_default(&args.model)?;
    let sampler = crate::common::checked_sampler(
        Sampler {
            temperature: args.temp,
            top_p: args.top_p,
            top_k: args.top_k,
            min_p: args.min_p,
            ..Default::default()
        },
        " (for requests that do not set it)",
    )?;
    if args.max_tokens == 0 {
        return Err("--max-tokens 0: give at least 1".into());
    }
    let template_args = match &args.chat_template_args {
        None => Default::default(),
        Some(text) => match serde_json::from_str(text) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => return Err(format!("--chat-template-args must be a JSON object, got {text:?}").into()),
        },
    };
    if args.max_queue == 0 {
        return Err("--max-queue 0: every request would get 429; give at least 1".into());
    }
    if args.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        return Err("--api-key is empty: give a key, or leave --api-key out to serve without one".into());
    }
    let batcher =
        BatcherOptions { max_batch: args.max_batch, batch_invariant: args.batch_invariant, ..Default::default() };
    batcher.validate()?;

    if let Some(threads) = args.threads {
        nuvec::backends::cpu::set_num_threads(threads)?;
    }
    let device = crate::common::parse_device(&args.device)?;
    let (model, tokenizer) = load_on(&model_path, device)?;
    sampler.validate_for(model.vocab_size())?;
    let id = args.served_model_name.clone().unwrap_or_else(|| model_id(&model_path));
    let mut config = ServerConfig::new(&id, &tokenizer);
    config.defaults = GenerateOptions {
        max_tokens: args.max_tokens,
        sampler,
        prefill_step_size: args.prefill_step_size.unwrap_or_else(|| default_prefill_step(model.device())),
        ..config.defaults
    };
    config.template_args = template_args;
    config.api_key = args.api_key.clone();
    config.allowed_origins =
        args.allowed_origins.iter().map(|o| o.trim().to_string()).filter(|o| !o.is_empty()).collect();
    config.body_limit = args.max_body_bytes;
    config.max_queue = args.max_queue;
    let server = Server::start(model, tokenizer, batcher, config)?;
    eprintln!("[INFO] serving {model_path} as {id:?} on {}", args.device);
    server.run(&args.host, args.port)?;
    Ok(())
}
