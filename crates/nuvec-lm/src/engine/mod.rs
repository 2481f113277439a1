//! Serving many requests: one request's state machine (`request`), what each step computes
//! (`scheduler`, bookkeeping only), running a step on the paged cache (`executor`), verifying
//! guessed tokens (`speculation`), a draft model's guesses (`drafter`) and a multi-token-prediction
//! head's (`mtp_drafter`), and the public
//! [`Batcher`] over them (`batcher`).

mod batcher;
mod drafter;
mod executor;
mod mtp_drafter;
pub(crate) mod request;
mod scheduler;
mod speculation;

pub use batcher::{
    device_sampling_default, pipeline_default, Batcher, BatcherOptions, BatcherStats, Event, RequestId,
    DEFAULT_CHECKPOINT_INTERVAL, DEFAULT_CPU_KV_BYTES, DEFAULT_MAX_POSITIONS,
};
pub use mtp_drafter::MtpProposal;
pub use speculation::{BatchSpeculation, DEFAULT_MAX_DECODES_CPU, DEFAULT_MAX_DECODES_GPU, PAUSE_STEPS};
