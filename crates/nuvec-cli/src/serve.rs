//! `nuvec serve`: an OpenAI-compatible server over the continuous-batching Batcher (as
//! mlx_lm.server, with its flags where they exist).

use std::time::Duration;

use clap::Parser;
use nuvec_lm::{default_prefill_step, BatcherOptions, GenerateOptions, Sampler};
use nuvec_server::{Server, ServerConfig, DEFAULT_BODY_LIMIT, DEFAULT_MAX_QUEUE, DEFAULT_SHUTDOWN_GRACE};

use crate::common::ContextArgs;

/// Serve a model over HTTP with OpenAI's API (as mlx_lm.server).
#[derive(Parser, Debug)]
#[command(allow_negative_numbers = true)]
pub struct Args {
    #[command(flatten)]
    load: crate::common::LoadArgs,
    /// The model's id in the API (what /v1/models lists and requests may name); default the
    /// repo id, or the file or directory name of a path.
    #[arg(long)]
    served_model_name: Option<String>,
    /// An adapter a request can choose, as NAME=PATH (an mlx-lm adapter folder; repeat the
    /// flag for more, vLLM's --lora-modules): a request whose `model` is NAME runs with it, the
    /// others with the base model, in the same batches.
    #[arg(long = "lora-modules", value_name = "NAME=PATH", value_parser = parse_lora_module, num_args = 1..)]
    lora_modules: Vec<(String, std::path::PathBuf)>,
    /// Where the model runs: cpu, cuda or cuda:N (cuda needs a build with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    device: String,
    #[command(flatten)]
    threads: crate::common::ThreadArgs,
    #[command(flatten)]
    split: crate::common::SplitArgs,
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
    /// Most requests decoded together; more wait their turn (mlx_lm.server's
    /// --decode-concurrency).
    #[arg(long, visible_alias = "decode-concurrency", default_value_t = 32)]
    max_batch: usize,
    #[command(flatten)]
    context: ContextArgs,
    /// Prompt-lookup speculation (vLLM's ngram method): in steps that only decode, for at most
    /// --speculation-max-batch requests, each guesses its next tokens from where its last few
    /// tokens occurred earlier in its prompt or answer, verified in the same pass. Answers are
    /// the same; they come faster where they repeat their input.
    #[arg(long)]
    prompt_lookup: bool,
    /// Speculation with a draft model (as mlx_lm.server's --draft-model; vLLM's draft-model
    /// method): a smaller model of the same tokenizer guesses the next tokens of every decoding
    /// request at once, in steps that only decode, for at most --speculation-max-batch requests,
    /// verified in the same pass. Answers are the same; they come faster where the draft agrees.
    /// Its cache takes a share of --prompt-cache-bytes in proportion to its size per position.
    #[arg(long, value_name = "PATH", conflicts_with = "prompt_lookup")]
    draft_model: Option<String>,
    /// Speculation with the checkpoint's own multi-token-prediction head (Qwen3.5's mtp.*;
    /// vLLM's mtp method, llama.cpp's draft-mtp): each request's head guesses its next tokens
    /// from the model's hidden states, in steps that only decode, for at most
    /// --speculation-max-batch requests, verified in the same pass. Answers are the same. Needs a
    /// checkpoint that ships the head (the Hugging Face original, or a GGUF that keeps it).
    #[arg(long, conflicts_with_all = ["prompt_lookup", "draft_model"])]
    mtp: bool,
    /// With --prompt-lookup, --draft-model or --mtp: tokens guessed per request and step (default 3).
    #[arg(long)]
    num_draft_tokens: Option<usize>,
    /// With --prompt-lookup: the longest n-gram matched (shorter ones down to
    /// --prompt-lookup-min are tried when it is not found).
    #[arg(long, default_value_t = 4, requires = "prompt_lookup")]
    prompt_lookup_max: usize,
    /// With --prompt-lookup: the shortest n-gram matched.
    #[arg(long, default_value_t = 1, requires = "prompt_lookup")]
    prompt_lookup_min: usize,
    /// With --prompt-lookup, --draft-model or --mtp: most decoding requests in a step that speculates
    /// (more are bound by arithmetic, where guessed rows would slow everyone); default 2 on the
    /// CPU, 8 on a GPU.
    #[arg(long)]
    speculation_max_batch: Option<usize>,
    /// The KV cache's size in bytes (suffixes K, M, G: 4G), as mlx_lm.server's flag sizes its
    /// caches; it holds the running requests and the cached prompt prefixes. Default: 90 % of
    /// free memory on a GPU, at most 4 GiB on the CPU (see --memory-fraction).
    #[arg(long, value_parser = parse_bytes)]
    prompt_cache_bytes: Option<usize>,
    /// Share of free device memory the KV cache takes when --prompt-cache-bytes is not given
    /// (vLLM's --gpu-memory-utilization).
    #[arg(long, visible_alias = "gpu-memory-utilization", default_value_t = 0.9)]
    memory_fraction: f64,
    /// Do not share the cache of common prompt prefixes across requests (prefix caching is on
    /// by default).
    #[arg(long)]
    no_prefix_cache: bool,
    /// On hybrid models (Qwen3.5): prompt passes end at most this many positions apart, each
    /// keeping the recurrent state where it ends, so that requests sharing a system prompt get
    /// prefix hits (a multiple of 16; 0: passes of --prefill-step-size only).
    #[arg(long, default_value_t = nuvec_lm::engine::DEFAULT_CHECKPOINT_INTERVAL)]
    checkpoint_interval: usize,
    /// Most tokens one engine step computes, decodes and prompt chunks together (vLLM's
    /// --max-num-batched-tokens; default 4096 on the CPU, 8192 on CUDA).
    #[arg(long, visible_alias = "max-num-batched-tokens")]
    token_budget: Option<usize>,
    /// Quantize the KV cache's keys and values to this many bits (4 or 8; MLX's affine format,
    /// as `nuvec generate --kv-bits N --quantized-kv-start 0` computes: each request's first pass
    /// attends its own rows in full precision, later ones read them quantized). On a GPU the rows
    /// are quantized and read there.
    #[arg(long)]
    kv_bits: Option<usize>,
    /// Values per quantization group of the KV cache, with --kv-bits (32, 64 or 128).
    #[arg(long, default_value_t = 64)]
    kv_group_size: usize,
    /// Seconds the requests in flight may take to finish after ctrl-c or SIGTERM; those still
    /// running then end with an error (a second signal ends them at once).
    #[arg(long, default_value_t = DEFAULT_SHUTDOWN_GRACE.as_secs_f64())]
    shutdown_grace: f64,
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
    /// Most requests waiting for a place in the batch (a request of n choices counts n); more
    /// get 429 (rate_limit_exceeded, with Retry-After) until the queue drains.
    #[arg(long, default_value_t = DEFAULT_MAX_QUEUE)]
    max_queue: usize,
}

/// A size in bytes: a number, optionally with K, M, G or T (powers of 1024; a trailing B or iB
/// is allowed).
fn parse_bytes(text: &str) -> Result<usize, String> {
    let upper = text.trim().to_ascii_uppercase();
    let t = upper.strip_suffix("IB").or_else(|| upper.strip_suffix('B')).unwrap_or(&upper);
    let (digits, shift) = match t.char_indices().last() {
        Some((at, c)) if c.is_ascii_alphabetic() => {
            let shift = match c {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("{text:?} is not a size in bytes: the suffix must be K, M, G or T")),
            };
            (&t[..at], shift)
        }
        _ => (t, 0),
    };
    let n: f64 = digits
        .trim()
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite())
        .ok_or_else(|| format!("{text:?} is not a size in bytes (e.g. 4G or 4294967296)"))?;
    let bytes = n * (1u64 << shift) as f64;
    if !(bytes >= 1.0 && bytes < usize::MAX as f64) {
        return Err(format!("{text:?}: give a size of at least one byte"));
    }
    Ok(bytes as usize)
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
    let model_path = args.load.name()?;
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
    if !(args.shutdown_grace.is_finite() && args.shutdown_grace >= 0.0) {
        return Err(format!("--shutdown-grace {}: give a number of seconds, 0 or more", args.shutdown_grace).into());
    }
    if args.context.ctx_size == Some(0) {
        return Err("--ctx-size 0: give at least 1 position".into());
    }
    let speculating = args.prompt_lookup || args.draft_model.is_some() || args.mtp;
    if !speculating && (args.num_draft_tokens.is_some() || args.speculation_max_batch.is_some()) {
        return Err(
            "--num-draft-tokens and --speculation-max-batch need --prompt-lookup, --draft-model or --mtp".into()
        );
    }
    let batcher = BatcherOptions {
        max_batch: args.max_batch,
        batch_invariant: args.batch_invariant,
        cache_bytes: args.prompt_cache_bytes,
        memory_fraction: args.memory_fraction,
        prefix_cache: args.no_prefix_cache.then_some(false),
        token_budget: args.token_budget,
        max_positions: args.context.ctx_size.unwrap_or(nuvec_lm::engine::DEFAULT_MAX_POSITIONS),
        kv_bits: args.kv_bits,
        kv_group_size: args.kv_group_size,
        checkpoint_interval: args.checkpoint_interval,
        speculation: speculating.then_some(nuvec_lm::BatchSpeculation {
            lookup: nuvec_lm::speculative::PromptLookup {
                max_ngram: args.prompt_lookup_max,
                min_ngram: args.prompt_lookup_min,
            },
            num_draft: args.num_draft_tokens.unwrap_or(3),
            max_decodes: args.speculation_max_batch,
            min_acceptance: 0.5,
        }),
        ..Default::default()
    };
    batcher.validate().map_err(|e| flag_names(&e.to_string()))?;

    args.threads.apply()?;
    let device = crate::common::parse_device(&args.device)?;
    let pipeline = args.split.pipeline()?;
    let (mut model, tokenizer) =
        args.load.load_as(&model_path, device, args.lora_modules.clone(), args.mtp, pipeline)?;
    args.split.shard(&mut model)?;
    let model = model;
    sampler.validate_for(model.vocab_size())?;
    let id = args.served_model_name.clone().unwrap_or_else(|| model_id(&model_path));
    let mut config = ServerConfig::new(&id, &tokenizer);
    config.defaults = GenerateOptions {
        max_tokens: args.max_tokens,
        sampler,
        prefill_step_size: args.prefill_step_size.unwrap_or_else(|| default_prefill_step(model.device())),
        context_length: args.context.ctx_size,
        allow_past_context: args.context.allow_past_context,
        ..config.defaults
    };
    config.defaults.validate_for(&model)?;
    // What a first request would pay (a GPU's kernel compiles above all) is paid before the
    // server listens, so that once it answers its first request is as fast as the rest.
    let warming = std::time::Instant::now();
    model.warm_up().map_err(|e| format!("warming the model up: {e}"))?;
    eprintln!("[INFO] warmed up in {:.1} s", warming.elapsed().as_secs_f64());
    if let Some(group) = model.ranks().filter(|g| g.rank() != 0) {
        // Rank 0 alone listens; this rank runs its part of every step rank 0's Batcher takes.
        eprintln!("[INFO] rank {} of {} follows rank 0's server", group.rank(), group.size());
        nuvec_lm::Batcher::follow(&model)?;
        return Ok(());
    }
    config.template_args = template_args;
    config.api_key = args.api_key.clone();
    config.allowed_origins =
        args.allowed_origins.iter().map(|o| o.trim().to_string()).filter(|o| !o.is_empty()).collect();
    config.body_limit = args.max_body_bytes;
    config.max_queue = args.max_queue;
    config.shutdown_grace = Duration::from_secs_f64(args.shutdown_grace);
    let draft = match &args.draft_model {
        Some(path) => {
            let (draft, draft_tokenizer) = nuvec_lm::load_on(path, model.device())?;
            if let Some(why) = tokenizer.differs_from(&draft_tokenizer) {
                return Err(format!(
                    "--draft-model {path}: its tokenizer is not the model's ({why}); a draft must share the whole \
                     vocabulary"
                )
                .into());
            }
            draft.warm_up().map_err(|e| format!("warming the draft model up: {e}"))?;
            Some(draft)
        }
        None => None,
    };
    let server = match draft {
        Some(draft) => Server::start_with_draft(model, draft, tokenizer, batcher, config),
        None if args.mtp => Server::start_with_mtp(model, tokenizer, batcher, config),
        None => Server::start(model, tokenizer, batcher, config),
    }
    .map_err(|e| flag_names(&e.to_string()))?;
    eprintln!("[INFO] serving {model_path} as {id:?} on {}", args.device);
    server.run(&args.host, args.port)?;
    Ok(())
}

/// A Batcher error in the flags' names, for the command line.
fn flag_names(message: &str) -> String {
    [
        ("BatcherOptions::max_batch", "--max-batch"),
        ("BatcherOptions::cache_bytes", "--prompt-cache-bytes"),
        ("BatcherOptions::memory_fraction", "--memory-fraction"),
        ("BatcherOptions::token_budget", "--token-budget"),
        ("BatcherOptions::max_positions", "--ctx-size"),
        ("BatcherOptions::blocks", "--prompt-cache-bytes"),
        ("BatcherOptions::kv_bits = ", "--kv-bits "),
        ("kv_group_size = ", "--kv-group-size "),
        ("BatcherOptions::checkpoint_interval", "--checkpoint-interval"),
        ("BatcherOptions::speculation.num_draft", "--num-draft-tokens"),
        ("BatcherOptions::speculation.max_decodes", "--speculation-max-batch"),
        ("BatcherOptions::speculation", "--prompt-lookup, --draft-model or --mtp"),
        ("BatcherOptions::batch_invariant", "--batch-invariant"),
        ("BatcherOptions::kv_bits", "--kv-bits"),
        ("of block_size = ", "of the cache's block size, "),
    ]
    .iter()
    .fold(message.to_string(), |m, (field, flag)| m.replace(field, flag))
}

/// `--lora-modules NAME=PATH`.
fn parse_lora_module(text: &str) -> Result<(String, std::path::PathBuf), String> {
    match text.split_once('=') {
        Some((name, path)) if !name.trim().is_empty() && !path.is_empty() => {
            Ok((name.trim().to_string(), std::path::PathBuf::from(path)))
        }
        _ => Err(format!("{text:?}: expected NAME=PATH (the name requests give as `model`, the adapter folder)")),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn sizes_in_bytes_take_binary_suffixes() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("4G"), Ok(4 << 30));
        assert_eq!(parse_bytes("1.5M"), Ok(3 << 19));
        assert_eq!(parse_bytes("512KiB"), Ok(512 << 10));
        assert_eq!(parse_bytes("2gb"), Ok(2 << 30));
        for bad in ["", "G", "-1", "0", "4X", "lots", "NaN"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?}");
        }
    }
}
