//! `nuvec generate`: mlx_lm.generate's flags and output, plus stops, penalties and log-probs.

use std::io::Write;

use clap::Parser;
use nuvec_lm::{
    default_prefill_step, generate_in, load_on, prompt_cache, GenerateOptions, LogitsProcessors, Sampler, Session,
    Stop, TextStream, Tokenizer,
};

use nuvec_lm::speculative::{speculative_generate, DraftModel, MtpHead, PromptLookup, Proposer, Speculative};

use crate::common::{peak_memory, read_prompt, ContextArgs, KvArgs, ThreadArgs};

/// Generate text from a prompt, as `mlx_lm.generate` does.
#[derive(Parser, Debug)]
#[command(allow_negative_numbers = true)]
pub struct Args {
    #[command(flatten)]
    load: crate::common::LoadArgs,
    /// Where the model runs: cpu, cuda or cuda:N (cuda needs a build with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Message to the model; `-` reads stdin. `\n` and `\t` are expanded.
    #[arg(short = 'p', long, default_value = "hello")]
    prompt: String,
    /// Read the message from this file instead (as is), as llama.cpp's -f.
    #[arg(short = 'f', long, value_name = "FILE", conflicts_with = "prompt")]
    file: Option<std::path::PathBuf>,
    #[command(flatten)]
    threads: ThreadArgs,
    /// System prompt for the chat template.
    #[arg(long)]
    system_prompt: Option<String>,
    /// Start the assistant's answer with this text (continues the final message).
    #[arg(long)]
    prefill_response: Option<String>,
    /// Maximum number of tokens to generate.
    #[arg(short = 'm', long, default_value_t = 100)]
    max_tokens: usize,
    /// Sampling temperature (0 is greedy, and turns every filter off).
    #[arg(long, default_value_t = 0.0)]
    temp: f32,
    /// Nucleus sampling mass (filters only inside (0, 1)).
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
    /// Probability of applying XTC at each step (0 is off).
    #[arg(long, default_value_t = 0.0)]
    xtc_probability: f32,
    /// XTC's probability threshold, in [0, 0.5].
    #[arg(long, default_value_t = 0.1)]
    xtc_threshold: f32,
    /// Multiplicative penalty on recently seen tokens (1 is neutral).
    #[arg(long)]
    repetition_penalty: Option<f32>,
    /// Tokens the repetition penalty looks back at.
    #[arg(long, default_value_t = 20)]
    repetition_context_size: usize,
    /// Subtracted once from every recently seen token's logit.
    #[arg(long)]
    presence_penalty: Option<f32>,
    /// Tokens the presence penalty looks back at.
    #[arg(long, default_value_t = 20)]
    presence_context_size: usize,
    /// Subtracted from a token's logit for each recent occurrence.
    #[arg(long)]
    frequency_penalty: Option<f32>,
    /// Tokens the frequency penalty looks back at.
    #[arg(long, default_value_t = 20)]
    frequency_context_size: usize,
    /// Logit biases as a JSON object of token id to bias, e.g. '{"13": -100}'.
    #[arg(long)]
    logit_bias: Option<String>,
    /// A string that ends generation (repeatable; never shown in the output).
    #[arg(long)]
    stop: Vec<String>,
    /// Tokens to generate before end-of-sequence, stop tokens or stop strings may end it.
    #[arg(long, default_value_t = 0)]
    min_tokens: usize,
    /// Keep generating through end-of-sequence tokens (until max tokens or a stop).
    #[arg(long)]
    ignore_eos: bool,
    /// Print each token's log-probability and its N most likely alternatives (N <= 20) to stderr.
    #[arg(long)]
    logprobs: Option<usize>,
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
    /// Prompt tokens processed per forward pass (default 2048 on the CPU, as mlx-lm; 4096 on
    /// CUDA, where each pass decodes the quantized weights for the tensor cores).
    #[arg(long)]
    prefill_step_size: Option<usize>,
    #[command(flatten)]
    kv: KvArgs,
    #[command(flatten)]
    context: ContextArgs,
    #[command(flatten)]
    constraint: crate::constraint::ConstraintArgs,
    /// Continue from a cache saved by `nuvec cache-prompt`: the prompt is appended to the cached
    /// one, and only what the cache does not hold is computed. Without --model, the model the
    /// file was made with.
    #[arg(long)]
    prompt_cache_file: Option<std::path::PathBuf>,
    /// Speculative decoding with prompt lookup: each step guesses the next tokens from where the
    /// last few tokens occurred earlier in the prompt or the output, and the model verifies the
    /// guesses in one pass. The output is the same (greedy, or seeded sampling); it comes faster
    /// where the answer repeats its input (copies, edits, extraction).
    #[arg(long, conflicts_with_all = ["draft_model", "mtp"])]
    prompt_lookup: bool,
    /// Speculative decoding with the checkpoint's own multi-token-prediction head (Qwen3.5's
    /// mtp.* tensors, as vLLM's and llama.cpp's MTP speculation): the head guesses the next
    /// tokens from the model's hidden state, and the model verifies them in one pass. The output
    /// is the same. Needs a checkpoint that ships the head (the Hugging Face original: mlx-lm's
    /// conversions drop it).
    #[arg(long, conflicts_with = "draft_model")]
    mtp: bool,
    #[command(flatten)]
    split: crate::common::SplitArgs,
    /// Speculative decoding with a draft model (as mlx_lm.generate's --draft-model): a smaller
    /// model of the same tokenizer guesses the next tokens greedily, and the model verifies them
    /// in one pass. The output is the same; it comes faster where the draft agrees often.
    #[arg(long, value_name = "PATH")]
    draft_model: Option<String>,
    /// With --draft-model or --mtp and sampling (--temp above 0): the draft (or the head) draws
    /// its guesses with the same sampler instead of picking them greedily, and each goes through
    /// the rejection rule (taken with probability min(1, p/q), else replaced by a draw from what
    /// the model gives beyond the draft). More guesses are taken; the output follows the same
    /// distribution, but a seed no longer gives the very tokens it gives without a draft.
    #[arg(long)]
    draft_sampling: bool,
    /// With --prompt-lookup, --draft-model or --mtp: tokens guessed per step (as mlx_lm.generate's).
    #[arg(long, default_value_t = 3)]
    num_draft_tokens: usize,
    /// With --prompt-lookup: the longest n-gram matched (shorter ones down to
    /// --prompt-lookup-min are tried when it is not found).
    #[arg(long, default_value_t = 4, requires = "prompt_lookup")]
    prompt_lookup_max: usize,
    /// With --prompt-lookup: the shortest n-gram matched.
    #[arg(long, default_value_t = 1, requires = "prompt_lookup")]
    prompt_lookup_min: usize,
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

fn json_object(flag: &str, text: &Option<String>) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match text {
        None => Ok(Default::default()),
        Some(text) => match serde_json::from_str(text) {
            Ok(serde_json::Value::Object(map)) => Ok(map),
            _ => Err(format!("{flag} must be a JSON object, got {text:?}")),
        },
    }
}

fn logit_bias(text: &Option<String>) -> Result<Vec<(u32, f32)>, String> {
    json_object("--logit-bias", text)?
        .into_iter()
        .map(|(k, v)| match (k.parse::<u32>(), v.as_f64()) {
            (Ok(id), Some(b)) => Ok((id, b as f32)),
            _ => Err(format!("--logit-bias: {k:?}: {v} is not a token id mapped to a number")),
        })
        .collect()
}

/// The ids `nuvec cache-prompt` caches for `prompt`: with a chat template, an open user message
/// (continue_final_message, as mlx_lm.cache_prompt), else the raw text.
pub fn cached_prompt_ids(tokenizer: &Tokenizer, prompt: &str) -> Result<Vec<u32>, Box<dyn std::error::Error>> {
    let Some(template) = tokenizer.chat_template() else {
        return Ok(tokenizer.encode(prompt, true)?);
    };
    let ctx = tokenizer.template_context(Default::default());
    let messages = serde_json::json!([{"role": "user", "content": prompt}]);
    Ok(tokenizer.encode(&template.render_values(&messages, false, true, &ctx)?, false)?)
}

/// The prompt's token ids, through the chat template when there is one (as mlx_lm.generate).
fn prompt_ids(args: &Args, tokenizer: &Tokenizer, prompt: &str) -> Result<Vec<u32>, Box<dyn std::error::Error>> {
    let template_kwargs = json_object("--chat-template-config", &args.chat_template_config)?;
    let Some(template) = tokenizer.chat_template().filter(|_| !args.ignore_chat_template) else {
        // mlx_lm.generate drops these without a word when there is no template; we say so.
        for (flag, set) in [
            ("--system-prompt", args.system_prompt.is_some()),
            ("--prefill-response", args.prefill_response.is_some()),
            ("--chat-template-config", args.chat_template_config.is_some()),
        ] {
            if set {
                let why = if args.ignore_chat_template {
                    "--ignore-chat-template is set"
                } else {
                    "the tokenizer has no chat template"
                };
                eprintln!("warning: {flag} is ignored: {why}");
            }
        }
        return Ok(tokenizer.encode(prompt, true)?);
    };
    let mut messages = vec![];
    if let Some(system) = &args.system_prompt {
        messages.push(serde_json::json!({"role": "system", "content": system}));
    }
    messages.push(serde_json::json!({"role": "user", "content": prompt}));
    if let Some(prefill) = &args.prefill_response {
        messages.push(serde_json::json!({"role": "assistant", "content": prefill}));
    }
    let ctx = tokenizer.template_context(template_kwargs);
    let prefill = args.prefill_response.is_some();
    let text = template.render_values(&serde_json::Value::Array(messages), !prefill, prefill, &ctx)?;
    // The template already wrote the special tokens (as mlx_lm.generate).
    Ok(tokenizer.encode(&text, false)?)
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    args.threads.apply()?;
    // A prompt cache names the model it was made with, as mlx_lm.generate reads it from there.
    let cached = match &args.prompt_cache_file {
        Some(file) => Some(prompt_cache::read_info(file)?),
        None => None,
    };
    let model_path = match (&args.load.model, &cached) {
        (None, Some(info)) => info.model.clone(),
        _ => args.load.name()?,
    };
    let sampler = crate::common::checked_sampler(
        Sampler {
            temperature: args.temp,
            top_p: args.top_p,
            min_p: args.min_p,
            min_tokens_to_keep: args.min_tokens_to_keep,
            xtc_probability: args.xtc_probability,
            xtc_threshold: args.xtc_threshold,
            top_k: args.top_k,
        },
        "",
    )?;
    let processors = LogitsProcessors {
        repetition_penalty: args.repetition_penalty,
        repetition_context_size: args.repetition_context_size,
        presence_penalty: args.presence_penalty,
        presence_context_size: args.presence_context_size,
        frequency_penalty: args.frequency_penalty,
        frequency_context_size: args.frequency_context_size,
        logit_bias: logit_bias(&args.logit_bias)?,
    };
    let mut prompt = read_prompt(&args.prompt, args.file.as_deref(), true)?;

    let device = crate::common::parse_device(&args.device)?;
    if args.split.any() && args.prompt_cache_file.is_some() {
        return Err("--prompt-cache-file with a model split across ranks is not supported: drop one".into());
    }
    let pipeline = args.split.pipeline()?;
    let (mut model, mut tokenizer) = args.load.load_as(&model_path, device, vec![], args.mtp, pipeline)?;
    args.split.shard(&mut model)?;
    // Every rank of a split model generates the same tokens; rank 0 prints them.
    let quiet = model.ranks().is_some_and(|group| group.rank() != 0);
    for token in &args.extra_eos_token {
        tokenizer.add_eos_token(token)?;
    }
    // A cached prompt is the start of this one: its text comes first, and the cache's tokens are
    // reused as far as the full prompt's tokens agree with them (never by slicing strings).
    let cache_options = args.kv.options();
    let mut session = Session::with_cache(&model, &cache_options)?;
    if let Some(file) = &args.prompt_cache_file {
        let (cached, info) = prompt_cache::load(file, &model, &cache_options)?;
        session = cached;
        prompt = info.prompt + &prompt;
    }
    let ids = prompt_ids(&args, &tokenizer, &prompt)?;
    let options = GenerateOptions {
        max_tokens: args.max_tokens,
        sampler,
        processors,
        seed: args.seed,
        prefill_step_size: args.prefill_step_size.unwrap_or_else(|| default_prefill_step(model.device())),
        stop: Stop::strings(&tokenizer, &args.stop)?,
        min_tokens: args.min_tokens,
        ignore_eos: args.ignore_eos,
        logprobs: args.logprobs,
        extra_eos_token_ids: tokenizer.eos_token_ids().to_vec(),
        cache: cache_options.clone(),
        context_length: args.context.ctx_size,
        allow_past_context: args.context.allow_past_context,
        constraint: args.constraint.grammar(&tokenizer)?,
        prompt_progress: crate::progress::Bar::on_terminal().map(|bar| bar.prompt_callback()),
        adapter: None,
        cache_salt: None,
    };
    let mut text = TextStream::new(&tokenizer, &options).with_mlx_lm_spacing();
    if args.draft_sampling && args.draft_model.is_none() && !args.mtp {
        return Err("--draft-sampling needs --draft-model or --mtp: prompt lookup's guesses are not drawn".into());
    }
    if args.prompt_lookup || args.draft_model.is_some() || args.mtp {
        if args.prompt_cache_file.is_some() {
            return Err("speculative decoding with --prompt-cache-file is not supported yet: drop one".into());
        }
        // A drawing draft's (or head's) own generator: from the request's seed, so that a seed
        // still gives one output; unseeded, as random as the request's.
        let draft_seed = options.seed.map(|s| s.wrapping_add(1));
        if let Some(path) = &args.draft_model {
            let (draft, draft_tokenizer) = load_on(path, model.device())?;
            if let Some(why) = tokenizer.differs_from(&draft_tokenizer) {
                return Err(format!(
                    "--draft-model {path}: its tokenizer is not the model's ({why}); a draft must share the whole \
                     vocabulary"
                )
                .into());
            }
            let proposer = if args.draft_sampling {
                DraftModel::sampling(&draft, options.prefill_step_size, options.sampler.clone(), draft_seed)?
            } else {
                DraftModel::new(&draft, options.prefill_step_size)?
            };
            let generation = speculative_generate(&model, &ids, options, proposer, args.num_draft_tokens)?;
            return finish_speculative(&args, &tokenizer, generation, &mut text);
        }
        if args.mtp {
            let head = if args.draft_sampling {
                MtpHead::sampling(&model, options.sampler.clone(), draft_seed)?
            } else {
                MtpHead::new(&model)?
            };
            let generation = speculative_generate(&model, &ids, options, head, args.num_draft_tokens)?;
            return finish_speculative(&args, &tokenizer, generation, &mut text);
        }
        let lookup = PromptLookup { max_ngram: args.prompt_lookup_max, min_ngram: args.prompt_lookup_min };
        lookup.validate()?;
        let generation = speculative_generate(&model, &ids, options, lookup, args.num_draft_tokens)?;
        return finish_speculative(&args, &tokenizer, generation, &mut text);
    }
    let mut generation = generate_in(&model, &mut session, &ids, options)?;
    if quiet {
        for token in generation.by_ref() {
            token?;
        }
        return Ok(());
    }
    let wrote = write_tokens(generation.by_ref(), &mut text)?;
    print_logprobs(&args, &tokenizer, generation.logprobs());
    if args.verbose {
        print_stats(wrote, generation.stats(), generation.reused_tokens(), generation.finish_reason());
        if let Some((vocabulary, grammar)) = args.constraint.timing() {
            eprintln!(
                "Constraint: vocabulary built in {:.1} ms, grammar compiled in {:.1} ms",
                vocabulary.as_secs_f64() * 1e3,
                grammar.as_secs_f64() * 1e3
            );
        }
    }
    Ok(())
}

/// Streams a speculative generation's text, then its statistics with what was guessed.
fn finish_speculative<P: Proposer>(
    args: &Args,
    tokenizer: &Tokenizer,
    mut generation: Speculative<'_, P>,
    text: &mut TextStream,
) -> Result<(), Box<dyn std::error::Error>> {
    let wrote = write_tokens(generation.by_ref(), text)?;
    print_logprobs(args, tokenizer, generation.logprobs());
    if args.verbose {
        let spec = generation.stats();
        print_stats(wrote, generation.timing(), 0, generation.finish_reason());
        let share = 100.0 * spec.accepted as f64 / spec.drafted.max(1) as f64;
        eprintln!(
            "Speculative: {} of {} guessed tokens accepted ({share:.1} %), {:.2} tokens per step",
            spec.accepted,
            spec.drafted,
            spec.tokens_per_step()
        );
    }
    Ok(())
}

/// Streams `tokens` as text to stdout, then a newline; whether any text was written.
fn write_tokens(
    tokens: impl Iterator<Item = nuvec_lm::Result<u32>>,
    text: &mut TextStream,
) -> Result<bool, Box<dyn std::error::Error>> {
    let mut out = std::io::stdout().lock();
    let mut wrote = false;
    for id in tokens {
        let piece = text.push(id?);
        wrote |= !piece.is_empty();
        out.write_all(piece.as_bytes())?;
        out.flush()?;
    }
    let rest = text.finish();
    wrote |= !rest.is_empty();
    out.write_all(rest.as_bytes())?;
    writeln!(out)?;
    out.flush()?;
    Ok(wrote)
}

/// The log-probabilities asked for with --logprobs, one line per token (stderr).
fn print_logprobs(args: &Args, tokenizer: &nuvec_lm::Tokenizer, logprobs: &[nuvec_lm::TokenLogprobs]) {
    if args.logprobs.is_some() {
        for entry in logprobs {
            let alternatives: Vec<String> = entry
                .top
                .iter()
                .map(|(t, lp)| format!("{:?} {lp:.4}", tokenizer.decode(&[*t]).unwrap_or_default()))
                .collect();
            let token = tokenizer.decode(&[entry.token]).unwrap_or_default();
            eprintln!("{} {token:?} {:.4} | {}", entry.token, entry.logprob, alternatives.join(", "));
        }
    }
}

/// The statistics block (stderr), as mlx_lm.generate prints it.
fn print_stats(wrote: bool, stats: &nuvec_lm::Stats, reused: usize, finish: Option<&nuvec_lm::FinishReason>) {
    if !wrote {
        eprintln!("No text generated for this prompt");
    }
    eprintln!("==========");
    let from_cache = if reused > 0 { format!(" ({reused} from the prompt cache)") } else { String::new() };
    eprintln!("Prompt: {} tokens{from_cache}, {:.3} tokens-per-sec", stats.prompt_tokens, stats.prompt_tps());
    eprintln!("Generation: {} tokens, {:.3} tokens-per-sec", stats.generation_tokens, stats.generation_tps());
    eprintln!("Peak memory: {:.3} GB", peak_memory() as f64 / 1e9);
    if let Some(reason) = finish {
        eprintln!("Finish: {}", crate::common::describe_finish(reason));
    }
}
