//! nuvec-lm: load mlx-community and Hugging Face checkpoints and generate as mlx-lm does.
//!
//! ```no_run
//! use nuvec_lm::{generate, load, GenerateOptions, StreamDecoder};
//!
//! # fn main() -> nuvec_lm::Result<()> {
//! let (model, tokenizer) = load("mlx-community/Qwen3-0.6B-4bit")?;
//! let prompt = tokenizer.encode("The capital of France is", true)?;
//! let mut text = StreamDecoder::default();
//! for id in generate(&model, &prompt, GenerateOptions { max_tokens: 32, ..Default::default() })? {
//!     print!("{}", text.push(&tokenizer, id?));
//! }
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod adapter;
pub mod cache;
pub mod chat;
pub mod config;
pub mod constrain;
pub mod convert;
mod convert_qwen3_5;
// CUDA graphs: one-token decode steps replayed.
pub mod decode_graph;
pub mod engine;
mod error;
pub mod generate;
pub mod gguf;
mod gguf_gemma4;
mod gguf_qwen35;
mod gguf_rope;
mod gguf_spm;
pub mod gguf_tokenizer;
pub mod hub;
pub mod layers;
mod load;
pub mod models;
pub mod output_dir;
pub mod parallel;
pub mod perplexity;
pub mod processors;
pub mod prompt_cache;
pub mod quantization;
pub mod sample;
pub mod session;
pub mod speculative;
pub mod staged;
pub mod step;
pub mod stop;
pub mod stream;
pub mod token_bytes;
pub mod tokenizer;
mod warm_up;
pub mod weights;

pub use adapter::AdapterId;
pub use cache::paged::{decode_batch, PagedCache, PrefixScope, SeqId};
pub use chat::{ChatTemplate, Message};
pub use engine::{
    device_sampling_default, pipeline_default, BatchSpeculation, Batcher, BatcherOptions, BatcherStats, Event,
    RequestId,
};
pub use error::{Error, Result};
pub use generate::{
    default_prefill_step, generate, generate_in, FinishReason, GenerateOptions, Generation, PromptProgress, Stats,
    TokenLogprobs,
};
pub use load::{
    load, load_dir, load_dir_on, load_model, load_model_on, load_model_with, load_on, load_with, LoadOptions,
    LoadProgress,
};
pub use models::Model;
pub use parallel::{load_model_pipelined, load_model_sharded, Pipeline, Shard, Split, Stage};
pub use processors::LogitsProcessors;
pub use sample::Sampler;
pub use session::Session;
pub use step::StepBatch;
pub use stop::{Stop, Stopped, TextStream};
pub use stream::StreamDecoder;
pub use tokenizer::Tokenizer;
