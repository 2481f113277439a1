//! `nuvec chat`: a REPL over one persistent cache (as mlx_lm.chat). Each turn renders the whole
//! conversation through the chat template and computes only the tokens the cache does not
//! already hold, so turn N costs its own tokens, not the conversation's.

use std::io::{BufRead, IsTerminal, Write};

use clap::Parser;
use nuvec_lm::{default_prefill_step, generate_in, FinishReason, GenerateOptions, Sampler, Session, TextStream};
use serde_json::{json, Value};

use crate::common::{describe_finish, ContextArgs, ThreadArgs};

/// Chat with a model in the terminal (or over a pipe: one message per line).
#[derive(Parser, Debug)]
#[command(allow_negative_numbers = true)]
pub struct Args {
    #[command(flatten)]
    load: crate::common::LoadArgs,
    #[command(flatten)]
    threads: ThreadArgs,
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
    /// Prompt tokens processed per forward pass (default 2048 on the CPU, as mlx-lm; 4096 on
    /// CUDA, where each pass decodes the quantized weights for the tensor cores).
    #[arg(long)]
    prefill_step_size: Option<usize>,
    /// Where the model runs: cpu, cuda or cuda:N (cuda needs a build with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    device: String,
    #[command(flatten)]
    context: ContextArgs,
    #[command(flatten)]
    split: crate::common::SplitArgs,
}

const HELP: &str =
    "Type a message and press Enter. Commands: 'q' quits, 'r' resets the conversation, 'h' shows this help.";

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    args.threads.apply()?;
    let model_path = args.load.name()?;
    let sampler = crate::common::checked_sampler(
        Sampler {
            temperature: args.temp,
            top_p: args.top_p,
            xtc_probability: args.xtc_probability,
            xtc_threshold: args.xtc_threshold,
            ..Default::default()
        },
        "",
    )?;
    let pipeline = args.split.pipeline()?;
    let device = crate::common::parse_device(&args.device)?;
    let (mut model, tokenizer) = args.load.load_as(&model_path, device, vec![], false, pipeline)?;
    args.split.shard(&mut model)?;
    let model = model;
    // Rank 0 of a split model reads the messages and tells them to the other ranks, which
    // answer alike and print nothing.
    let ranks = model.ranks().filter(|g| g.size() > 1).cloned();
    let quiet = ranks.as_ref().is_some_and(|g| g.rank() != 0);
    let template = tokenizer
        .chat_template()
        .ok_or_else(|| format!("{model_path} has no chat template: use `nuvec generate` for a base model"))?;
    let context = tokenizer.template_context(Default::default());
    let fresh =
        || -> Vec<Value> { args.system_prompt.iter().map(|s| json!({"role": "system", "content": s})).collect() };
    let interactive = std::io::stdin().is_terminal() && !quiet;
    let mut messages = fresh();
    let cache = nuvec_lm::cache::CacheOptions { max_kv_size: args.max_kv_size, ..Default::default() };
    let mut session = Session::with_cache(&model, &cache)?;
    let stdin = std::io::stdin();
    let mut out: Box<dyn Write> = match quiet {
        true => Box::new(std::io::sink()),
        false => Box::new(std::io::stdout()),
    };
    if interactive {
        eprintln!("[INFO] Chatting with {model_path}. {HELP}");
    }
    loop {
        if interactive {
            write!(out, ">> ")?;
            out.flush()?;
        }
        let Some(line) = next_line(&stdin, ranks.as_ref())? else {
            break; // end of input
        };
        let query = line.trim_end_matches(['\n', '\r']);
        match query {
            "q" => break,
            "r" => {
                messages = fresh();
                session = Session::with_cache(&model, &cache)?;
                if !quiet {
                    eprintln!("[INFO] The conversation was reset.");
                }
                continue;
            }
            "h" => {
                if !quiet {
                    eprintln!("{HELP}");
                }
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
            prefill_step_size: args.prefill_step_size.unwrap_or_else(|| default_prefill_step(model.device())),
            cache: cache.clone(),
            context_length: args.context.ctx_size,
            allow_past_context: args.context.allow_past_context,
            ..Default::default()
        };
        let mut text = TextStream::new(&tokenizer, &options).with_mlx_lm_spacing();
        let mut generation = match generate_in(&model, &mut session, &ids, options) {
            Ok(generation) => generation,
            Err(e) => {
                // A message the model cannot take (past its context) must not end the session.
                messages.pop();
                if !quiet {
                    eprintln!("error: {e}\n[INFO] The message was not sent; 'r' resets the conversation.");
                }
                continue;
            }
        };
        let mut reply = Vec::new();
        for id in generation.by_ref() {
            let id = id?;
            reply.push(id);
            write!(out, "{}", text.push(id))?;
            out.flush()?;
        }
        writeln!(out, "{}", text.finish())?;
        out.flush()?;
        if let Some(reason @ FinishReason::ContextLength(_)) = generation.finish_reason().filter(|_| !quiet) {
            eprintln!("[INFO] Finish: {}; 'r' resets the conversation.", describe_finish(reason));
        }
        messages.push(json!({"role": "assistant", "content": tokenizer.decode(&reply)?}));
    }
    Ok(())
}

/// The next line of input (`None` at its end). Over the ranks of a split model, rank 0 reads it
/// from stdin (mpirun gives stdin to rank 0 alone) and sends it to every other rank, which waits
/// for it as long as the user takes to type.
fn next_line(
    stdin: &std::io::Stdin,
    ranks: Option<&nuvec::distributed::Group>,
) -> Result<Option<String>, Box<dyn std::error::Error>> {
    let Some(group) = ranks else { return read_line(stdin) };
    let waiting = group.clone().with_timeout(std::time::Duration::MAX);
    if group.rank() != 0 {
        let bytes = waiting.recv(0)?;
        return match bytes.split_first() {
            Some((1, text)) => Ok(Some(String::from_utf8(text.to_vec())?)),
            _ => Ok(None),
        };
    }
    let line = read_line(stdin)?;
    let bytes = match &line {
        Some(text) => [&[1u8][..], text.as_bytes()].concat(),
        None => vec![0],
    };
    for rank in 1..group.size() {
        waiting.send(rank, &bytes)?;
    }
    Ok(line)
}

fn read_line(stdin: &std::io::Stdin) -> Result<Option<String>, Box<dyn std::error::Error>> {
    let mut line = String::new();
    Ok((stdin.lock().read_line(&mut line)? > 0).then_some(line))
}
