//! The public [`Batcher`]: many requests decoded together over one [`PagedCache`].

use std::collections::{BTreeMap, HashMap, HashSet};

use nuvec::{Array, Device, PendingRead, QuantSpec};

use super::drafter::Drafter;
use super::executor::{self, Outcome};
use super::mtp_drafter::{MtpDrafter, MtpProposal};
use super::request::{commit_constraints, Request, MASKED};
use super::scheduler::{BlockView, Key, Scheduler, Work};
use super::speculation::{self, BatchSpeculation};
use crate::cache::paged::{window_blocks_for, PagedCache, PrefixScope, SeqId, DEFAULT_BLOCK_SIZE};
use crate::cache::{kv_spec, CacheOptions};
use crate::generate::{FinishReason, GenerateOptions, TokenLogprobs};
use crate::models::Model;
use crate::{Error, Result};

/// Most positions per sequence the default cache size allows for (with [`BatcherOptions::max_batch`]).
pub const DEFAULT_MAX_POSITIONS: usize = 131_072;

/// Bytes of KV cache a CPU Batcher takes by default at most (vLLM's `VLLM_CPU_KVCACHE_SPACE`
/// default): host memory is shared with everything else, so it is not sized to what is free.
pub const DEFAULT_CPU_KV_BYTES: usize = 4 << 30;

/// A request of a [`Batcher`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// What a [`Batcher::step`] reports.
#[derive(Debug)]
pub enum Event {
    /// Request `id` was admitted for the first time; `cached_tokens` of its prompt came from
    /// the prefix cache instead of being computed (OpenAI's `cached_tokens`).
    Started {
        /// The request.
        id: RequestId,
        /// Prompt tokens whose keys and values were shared from earlier requests.
        cached_tokens: usize,
    },
    /// Request `id` produced `token`.
    Token {
        /// The request.
        id: RequestId,
        /// The token.
        token: u32,
    },
    /// The log-probabilities of the token reported next for `id`, when its options asked for them.
    Logprobs {
        /// The request.
        id: RequestId,
        /// The token's log-probability and the most likely alternatives.
        logprobs: TokenLogprobs,
    },
    /// Request `id`'s step failed with `error`; a [`Event::Finished`] with
    /// [`FinishReason::Error`] follows. Other requests go on.
    Failed {
        /// The request.
        id: RequestId,
        /// What failed ([`Error::is_oom`] tells out-of-memory apart).
        error: Error,
    },
    /// Request `id` ended; it reports nothing more.
    Finished {
        /// The request.
        id: RequestId,
        /// Why, with `generate`'s reasons.
        reason: FinishReason,
    },
}

/// Settings of a [`Batcher`]; each is checked by [`BatcherOptions::validate`].
#[derive(Debug, Clone, PartialEq)]
pub struct BatcherOptions {
    /// Most requests decoded together (default 32, mlx-lm's `BatchGenerator`).
    pub max_batch: usize,
    /// Positions per cache block (default 16).
    pub block_size: usize,
    /// Blocks of the cache; `None` sizes it from memory: `memory_fraction` of what the device
    /// has free once the weights are loaded (on the CPU at most [`DEFAULT_CPU_KV_BYTES`]), and
    /// at most room for `max_batch` sequences of `max_positions` positions (or `cache_bytes`
    /// of it, when set).
    pub blocks: Option<usize>,
    /// Share of free device memory the default cache takes (default 0.9).
    pub memory_fraction: f64,
    /// The cache's size in bytes instead of a share of memory (mlx_lm.server's
    /// `--prompt-cache-bytes`): as many blocks as fit, still at most room for `max_batch`
    /// sequences of `max_positions`. Set it or `blocks`, not both.
    pub cache_bytes: Option<usize>,
    /// Positions per sequence the default cache size is bounded by (default 131,072).
    pub max_positions: usize,
    /// Most tokens one step computes, decodes and prefill chunks together (vLLM's
    /// `max_num_batched_tokens`); `None` takes 8192 on a GPU and 4096 on the CPU.
    pub token_budget: Option<usize>,
    /// Serve every request exactly the tokens (and logits) it gets alone, at a cost in speed:
    /// each sequence's rows run as a pass of their own (default false; requests then match
    /// their solo runs to rounding, and in greedy tokens on every model tested).
    pub batch_invariant: bool,
    /// Micro-batches for a pipelined model; only `None` or `Some(1)`, as no model here is
    /// pipelined.
    pub micro_batches: Option<usize>,
    /// Share the cache blocks of prompt prefixes across requests (vLLM's automatic prefix
    /// caching): `None` (the default) and `Some(true)` turn it on (on hybrids a hit ends where
    /// a prefill pass kept the recurrent state, see `PagedCache::set_prefix_caching`),
    /// `Some(false)` turns it off. With
    /// `batch_invariant`, a hit is cut to whole chunks of the request's `prefill_step_size` that
    /// passes of that size computed, so it is exact too (see `PagedCache`'s docs).
    pub prefix_cache: Option<bool>,
    /// Quantize the cache's keys and values to this many bits (4 or 8, or any MLX affine
    /// width; `None`, the default, keeps the model's type): every request is then computed as
    /// `generate` with these `kv_bits` and `quantized_kv_start` 0 computes it. On a GPU too (its rows quantized and read there).
    pub kv_bits: Option<usize>,
    /// Values per quantization group along the head dimension (default 64), with `kv_bits`.
    pub kv_group_size: usize,
    /// On a hybrid model (recurrent layers) with the prefix cache on: prefill passes end at
    /// most this many positions apart (default [`DEFAULT_CHECKPOINT_INTERVAL`]; a multiple of
    /// `block_size`; 0 leaves the passes at the request's `prefill_step_size`), so that every
    /// pass keeps the recurrent states where it ends and a later request sharing the prompt's
    /// start (a system prompt) gets a hit there. Not in `batch_invariant` mode, whose passes are
    /// the request's `prefill_step_size` as `generate`'s are.
    pub checkpoint_interval: usize,
    /// Prompt-lookup speculation (vLLM's `ngram` method; `None`, the default, off): in steps
    /// that only decode, for at most `max_decodes` requests, each request feeds guesses of its
    /// next tokens from its own prompt and output, verified in the same pass (see
    /// `engine/speculation.rs`). Requests hand out what they would without it; not with a
    /// constraint (they decode plainly); refused with `kv_bits`. Hybrids' recurrent layers keep
    /// their states before each guessed row and sliding-window layers `num_draft` positions
    /// behind the window, so that a wrong guess is taken back from every layer kind.
    pub speculation: Option<BatchSpeculation>,
    /// Pipelined steps: a step whose sampling requests all pick greedily is followed by the next
    /// one, enqueued before its tokens are read (they are fed to the next step on the device),
    /// so the device does not wait for the host between steps. A request's tokens are the same
    /// either way: a token the host then picks otherwise (a near tie the device's pick cannot
    /// settle) takes its row of the next step back. `None` (the default): `NUVEC_BATCH_PIPELINE`,
    /// else off (on a GPU it has not measured faster yet; on the CPU, whose steps compute as
    /// they are enqueued, there is nothing to overlap). Not with speculation, `batch_invariant`, `kv_bits` or a hybrid model (recurrent
    /// layers), whose rows cannot be taken back so: `Some(true)` with those is refused, `None`
    /// turns it off.
    pub pipeline: Option<bool>,
    /// Draws sampled requests' tokens where the logits are (`nuvec::Array::sample_rows`): a
    /// request sampled at a temperature alone (no top-p, min-p, XTC or top-k that applies, no
    /// processors, log-probabilities, `min_tokens` bans or constraint) then has three words of
    /// its step read instead of its row of logits. Each draw takes the uniform the host's would
    /// and is used only where it is certainly the host's token (else the host draws it, with the
    /// same uniform), so the tokens are the same either way. `None` (the default):
    /// `NUVEC_DEVICE_SAMPLING`, else on where the logits are on a GPU and off on the CPU (whose
    /// rows are in memory already).
    pub device_sampling: Option<bool>,
}

/// Positions between the recurrent-state checkpoints of a hybrid model's prefill
/// ([`BatcherOptions::checkpoint_interval`]): passes of 512 rows still run the products as
/// matrix products, and a shared system prompt of a few thousand tokens gets a hit within 512
/// positions of its end.
pub const DEFAULT_CHECKPOINT_INTERVAL: usize = 512;

impl Default for BatcherOptions {
    fn default() -> Self {
        BatcherOptions {
            max_batch: 32,
            block_size: DEFAULT_BLOCK_SIZE,
            blocks: None,
            memory_fraction: 0.9,
            cache_bytes: None,
            max_positions: DEFAULT_MAX_POSITIONS,
            token_budget: None,
            batch_invariant: false,
            micro_batches: None,
            prefix_cache: None,
            kv_bits: None,
            kv_group_size: 64,
            checkpoint_interval: DEFAULT_CHECKPOINT_INTERVAL,
            speculation: None,
            pipeline: None,
            device_sampling: None,
        }
    }
}

impl BatcherOptions {
    /// Checks every setting, naming the bad one.
    pub fn validate(&self) -> Result<()> {
        let at_least_one =
            [("max_batch", self.max_batch), ("block_size", self.block_size), ("max_positions", self.max_positions)];
        for (name, v) in at_least_one {
            if v == 0 {
                return Err(Error::Invalid(format!("BatcherOptions::{name} = 0: give at least 1")));
            }
        }
        if self.blocks == Some(0) {
            return Err(Error::Invalid(
                "BatcherOptions::blocks = 0: give at least 1 (or None to size from memory)".into(),
            ));
        }
        match (self.blocks, self.cache_bytes) {
            (_, Some(0)) => {
                return Err(Error::Invalid(
                    "BatcherOptions::cache_bytes = 0: give the cache's size in bytes (or None to size it from memory)"
                        .into(),
                ))
            }
            (Some(_), Some(_)) => return Err(Error::Invalid(
                "BatcherOptions::blocks and BatcherOptions::cache_bytes are both set: size the cache by one of them"
                    .into(),
            )),
            _ => {}
        }
        if !(self.memory_fraction > 0.0 && self.memory_fraction <= 1.0) {
            return Err(Error::Invalid(format!(
                "BatcherOptions::memory_fraction = {}: give a share in (0, 1]",
                self.memory_fraction
            )));
        }
        if let Some(b) = self.token_budget.filter(|&b| b < self.max_batch) {
            return Err(Error::Invalid(format!(
                "BatcherOptions::token_budget = {b} is below max_batch = {}: a step must hold one token of each \
                 running request",
                self.max_batch
            )));
        }
        if let Some(s) = &self.speculation {
            s.validate()?;
            if self.batch_invariant {
                return Err(Error::Invalid(
                    "BatcherOptions::speculation with BatcherOptions::batch_invariant: guessed rows run in passes of several rows, \
                     where batch invariance promises each request its solo passes; drop one"
                        .into(),
                ));
            }
            if self.kv_bits.is_some() {
                return Err(Error::Unsupported(
                    "BatcherOptions::speculation with BatcherOptions::kv_bits: a quantized cache's guessed rows cannot be taken back \
                     yet; drop one"
                        .into(),
                ));
            }
        }
        if let Some(bits) = self.kv_bits {
            kv_spec(bits, self.kv_group_size).map_err(|e| {
                Error::Invalid(format!("BatcherOptions::kv_bits = {bits}, kv_group_size = {}: {e}", self.kv_group_size))
            })?;
        }
        if !self.checkpoint_interval.is_multiple_of(self.block_size) {
            return Err(Error::Invalid(format!(
                "BatcherOptions::checkpoint_interval = {} is not a multiple of block_size = {}: checkpoints sit on \
                 block boundaries (0 turns them off between passes)",
                self.checkpoint_interval, self.block_size
            )));
        }
        match self.micro_batches {
            None | Some(1) => Ok(()),
            Some(0) => Err(Error::Invalid("BatcherOptions::micro_batches = 0: give at least 1".into())),
            Some(n) => Err(Error::Unsupported(format!(
                "BatcherOptions::micro_batches = {n}: micro-batches apply to pipelined models, which this build \
                 does not run; leave it None"
            ))),
        }
    }

    /// The token budget on `device`.
    pub fn token_budget_on(&self, device: Device) -> usize {
        self.token_budget.unwrap_or(match device {
            Device::Cpu => 4096,
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => 8192,
        })
    }
}

/// The longest prefill pass [`BatcherOptions::checkpoint_interval`] allows on `paged`: the
/// interval on a hybrid model with prefix caching on, outside batch-invariant mode; no bound
/// otherwise.
fn checkpoint_step(paged: &PagedCache, options: &BatcherOptions) -> usize {
    let applies = paged.has_recurrent_layers() && paged.prefix_caching() && !options.batch_invariant;
    if applies && options.checkpoint_interval > 0 {
        options.checkpoint_interval
    } else {
        usize::MAX
    }
}

/// Counts for monitoring a [`Batcher`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatcherStats {
    /// Requests queued, not yet admitted (or preempted).
    pub waiting: usize,
    /// Requests admitted, holding cache.
    pub running: usize,
    /// Cache blocks held by requests.
    pub blocks_used: usize,
    /// Cache blocks in all.
    pub blocks_total: usize,
    /// Requests preempted so far (each re-prefilled later).
    pub preemptions: u64,
    /// Prompt (and re-prefilled) tokens computed so far.
    pub prefill_tokens: u64,
    /// Tokens sampled so far.
    pub generated_tokens: u64,
    /// Guessed tokens fed to steps so far ([`BatcherOptions::speculation`]).
    pub drafted_tokens: u64,
    /// Of those, the guesses that were right (each a token handed out without a step of its own).
    pub accepted_tokens: u64,
    /// Time steps waited, after their forward pass, for the masks of greedy rows under a
    /// constraint ([`GenerateOptions::constraint`](crate::GenerateOptions)) still being
    /// computed: the masks' cost that the pass did not hide. (Sampled rows wait for theirs on
    /// the sampling threads, not counted here.)
    pub mask_wait: std::time::Duration,
    /// Steps enqueued before the step before them was read ([`BatcherOptions::pipeline`]).
    pub pipelined_steps: u64,
    /// Tokens fed to a pipelined step on the device and taken back, because the request took
    /// another token (a near tie its greedy pick goes to the host for).
    pub taken_back: u64,
    /// Sampled tokens drawn where the logits are ([`BatcherOptions::device_sampling`]).
    pub drawn_on_device: u64,
    /// Draws made there that were not certain, drawn again on the host.
    pub drawn_again: u64,
}

/// One request in flight.
struct Live {
    request: Request,
    seq: Option<SeqId>,
    cancelled: bool,
    /// Prompt tokens a prefix hit gave it at its first admission.
    cached: Option<usize>,
    /// Prefill rows per pass.
    chunk: usize,
    /// Its recent guesses ([`BatcherOptions::speculation`]).
    guesses: speculation::Record,
    /// Its served adapter and cache salt ([`GenerateOptions::adapter`],
    /// [`GenerateOptions::cache_salt`]): which requests' prompt blocks it may share.
    scope: PrefixScope,
}

/// Continuous batching: requests are queued, admitted while cache and slots allow, prefilled in
/// chunks inside a per-step token budget alongside the others' decoding, and each ends exactly
/// as it would alone (see `docs/batching.md`).
pub struct Batcher<'m> {
    model: &'m Model,
    paged: PagedCache,
    scheduler: Scheduler,
    live: BTreeMap<u64, Live>,
    next_id: u64,
    /// Prefill rows per pass: at most the budget less one token of every other running request.
    max_chunk: usize,
    /// Prefill rows per pass at most, so that passes end where recurrent states are kept
    /// ([`BatcherOptions::checkpoint_interval`]; `usize::MAX` where that does not apply).
    checkpoint_step: usize,
    faults: HashSet<u64>,
    stats: BatcherStats,
    speculation: Option<BatchSpeculation>,
    /// Where guesses come from when a draft model makes them (else the prompt lookup).
    drafter: Option<Drafter<'m>>,
    /// Where guesses come from when the model's multi-token-prediction head makes them.
    mtp: Option<MtpDrafter<'m>>,
    /// Whether steps are pipelined ([`BatcherOptions::pipeline`]).
    pipeline: bool,
    /// Whether sampled tokens are drawn where the logits are ([`BatcherOptions::device_sampling`]).
    device_sampling: bool,
    /// The step enqueued last, whose tokens are not read yet (pipelined steps).
    in_flight: Option<Launched>,
    /// Requests whose fed tokens are taken back as if the host had picked another token (the
    /// tests of that path).
    distrusted: HashSet<u64>,
    /// Requests whose draws where the logits are count as uncertain ([`Batcher::redraw_on_host`]).
    redrawn: HashSet<u64>,
}

/// How a step's rows are taken ([`Batcher::take_rows`]).
struct Taking<'a> {
    /// The rows' greedy picks, read already (`argmax_gap`'s three words a row).
    known: Option<&'a [u32]>,
    /// The scheduler was told of the rows before they were read ([`Batcher::chain`]).
    told: bool,
    /// The step enqueued since, fed the rows' greedy picks on the device.
    next: Option<&'a mut Launched>,
}

/// A step enqueued and not read yet.
struct Launched {
    work: Vec<Work>,
    drafts: Vec<Vec<u32>>,
    outcome: Outcome,
    /// Every row's greedy pick on the device (`argmax_gap`, `[rows, 3]`) and its copy on the way
    /// to the host, in pipelined steps.
    picks: Option<(Array, PendingRead)>,
    /// The requests whose token was fed from the step before on the device (by key).
    fed: HashSet<u64>,
    /// The scheduler was told of this step's rows before it was read ([`Batcher::chain`]).
    told: bool,
    /// Requests whose rows here are void: the token fed to them was not the one they took.
    void: HashSet<u64>,
}

impl<'m> Batcher<'m> {
    /// A batcher for `model` with `options` (checked; the cache is sized now).
    pub fn new(model: &'m Model, options: BatcherOptions) -> Result<Self> {
        Batcher::build(model, None, options)
    }

    /// A batcher whose speculating requests take their guesses from `draft`, a smaller model of
    /// the same tokenizer (vLLM's draft-model speculation, mlx_lm.server's `--draft-model`),
    /// instead of the prompt lookup: `options.speculation` must be set (its `num_draft`,
    /// `max_decodes` and `min_acceptance` apply; its `lookup` does not). The draft keeps a paged
    /// cache of its own as large as the model's, sized from memory with it; it picks its guesses
    /// greedily, so every request hands out the tokens it gets alone (see `engine/drafter.rs`).
    pub fn with_draft(model: &'m Model, draft: &'m Model, options: BatcherOptions) -> Result<Self> {
        if options.speculation.is_none() {
            return Err(Error::Invalid(
                "Batcher::with_draft needs BatcherOptions::speculation (its num_draft and max_decodes)".into(),
            ));
        }
        if draft.vocab_size() != model.vocab_size() {
            return Err(Error::Invalid(format!(
                "a draft model of {} tokens for a model of {}: a draft must share the whole vocabulary",
                draft.vocab_size(),
                model.vocab_size()
            )));
        }
        if draft.device() != model.device() {
            return Err(Error::Invalid(format!(
                "a draft model on {} for a model on {}: load both on one device",
                draft.device(),
                model.device()
            )));
        }
        Batcher::build(model, Some(draft), options)
    }

    /// A batcher whose speculating requests take their guesses from the model's own
    /// multi-token-prediction head ([`crate::LoadOptions::mtp`]; vLLM's `mtp` method) instead
    /// of the prompt lookup: `options.speculation` must be set (its `num_draft`, `max_decodes`
    /// and `min_acceptance` apply; its `lookup` does not). Each request's head has a small cache
    /// of its own (one layer), shown the model's hidden states of every position the request
    /// computes; it picks its guesses greedily, so every request hands out the tokens it gets
    /// alone (see `engine/mtp_drafter.rs`).
    pub fn with_mtp(model: &'m Model, options: BatcherOptions) -> Result<Self> {
        if options.speculation.is_none() {
            return Err(Error::Invalid(
                "Batcher::with_mtp needs BatcherOptions::speculation (its num_draft and max_decodes)".into(),
            ));
        }
        if !model.has_mtp() {
            return Err(crate::models::no_mtp());
        }
        let mut batcher = Batcher::build(model, None, options)?;
        batcher.mtp = Some(MtpDrafter::new(model));
        Ok(batcher)
    }

    /// Keeps every proposal of the multi-token-prediction head from now on (a test compares
    /// them with a fresh head's).
    #[doc(hidden)]
    pub fn record_mtp_proposals(&mut self) {
        if let Some(m) = &mut self.mtp {
            m.record();
        }
    }

    /// The proposals [`Batcher::record_mtp_proposals`] kept: each request's history, the first
    /// position its head was shown, the guesses.
    #[doc(hidden)]
    pub fn mtp_proposals(&self) -> &[MtpProposal] {
        self.mtp.as_ref().map_or(&[], |m| m.recorded())
    }

    fn build(model: &'m Model, draft: Option<&'m Model>, options: BatcherOptions) -> Result<Self> {
        options.validate()?;
        let ranks = model.ranks();
        if let Some(group) = ranks {
            refuse_split(group, draft.is_some() || options.speculation.is_some(), &options)?;
        }
        let blocks = match options.blocks {
            Some(b) => b,
            None => default_blocks(model, draft, &options)?,
        };
        let mut paged = match options.kv_bits {
            Some(bits) => PagedCache::new_quantized(
                model,
                blocks,
                options.block_size,
                options.max_batch,
                bits,
                options.kv_group_size,
            )?,
            None => PagedCache::new(model, blocks, options.block_size, options.max_batch)?,
        };
        paged.set_batch_invariant(options.batch_invariant);
        paged
            .set_prefix_caching(options.prefix_cache.unwrap_or(true) && !split_hybrid(model, options.prefix_cache)?)?;
        let budget = options.token_budget_on(model.device());
        let pipeline = pipelined(model, &paged, draft.is_some(), &options)?;
        let device_sampling = match options.device_sampling {
            Some(on) => on,
            None => device_sampling_default(model.device())?,
        };
        if let Some(s) = &options.speculation {
            // Wrong guesses are taken back from every layer kind (`PagedCache::trim`).
            paged.set_rewind(s.num_draft)?;
        } else if pipeline {
            // A fed token the host does not take is taken back, from sliding-window layers too.
            paged.set_rewind(1)?;
        }
        paged.set_step_tokens(budget)?;
        let checkpoint_step = checkpoint_step(&paged, &options);
        let mut scheduler = Scheduler::new(options.block_size, blocks, options.max_batch, budget);
        if let Some(s) = &options.speculation {
            let most = s.max_decodes.unwrap_or(match model.device() {
                Device::Cpu => speculation::DEFAULT_MAX_DECODES_CPU,
                #[cfg(feature = "cuda")]
                Device::Cuda(_) => speculation::DEFAULT_MAX_DECODES_GPU,
            });
            scheduler.set_speculation(s.num_draft, most);
        }
        if let Some(group) = ranks {
            paged.lead(group)?;
        }
        let drafter = match (draft, &options.speculation) {
            (Some(d), Some(s)) => {
                Some(Drafter::new(d, (blocks, options.block_size, options.max_batch), s.num_draft, budget)?)
            }
            _ => None,
        };
        Ok(Batcher {
            model,
            drafter,
            mtp: None,
            scheduler,
            paged,
            live: BTreeMap::new(),
            next_id: 0,
            max_chunk: budget - (options.max_batch - 1),
            checkpoint_step,
            faults: HashSet::new(),
            stats: BatcherStats { blocks_total: blocks, ..BatcherStats::default() },
            speculation: options.speculation,
            pipeline,
            device_sampling,
            in_flight: None,
            distrusted: HashSet::new(),
            redrawn: HashSet::new(),
        })
    }

    /// On every rank but 0 of a model split across ranks ([`Model::ranks`]): runs this rank's
    /// part of every step of the Batcher that rank 0 makes over its part, from its making until
    /// it is dropped (call it again for rank 0's next Batcher). Rank 0 alone takes requests and
    /// samples; here only the cache is kept, alike. Waits as long as rank 0 sends nothing; fails
    /// when the group does (a rank that stopped answering within a step's timeout).
    pub fn follow(model: &Model) -> Result<()> {
        match model.ranks() {
            Some(group) if group.rank() != 0 => crate::cache::paged::follow(model, group),
            Some(_) => {
                Err(Error::Invalid("Batcher::follow on rank 0, which makes the Batcher the others follow".into()))
            }
            None => Err(Error::Invalid("Batcher::follow on a model not split across ranks".into())),
        }
    }

    /// Queues `prompt` (token ids) with `options`; it starts at a later [`Batcher::step`].
    /// Refuses an empty prompt, one that could never fit the cache, invalid options, and cache
    /// options the paged cache does not have (a rotating or quantized cache).
    pub fn submit(&mut self, prompt: Vec<u32>, options: GenerateOptions) -> Result<RequestId> {
        check_cache_options(self.model, &options.cache, self.paged.kv_quantization())?;
        let chunk = options.prefill_step_size.min(self.max_chunk).min(self.checkpoint_step);
        let adapter = options.adapter.as_deref().map(|name| self.model.adapter_id(name)).transpose()?;
        let scope = PrefixScope { adapter, salt: options.cache_salt.clone() };
        let request = Request::here(self.model, &prompt, options)?;
        let need = self.scheduler.blocks_for(prompt.len());
        if need > self.paged.total_blocks() {
            return Err(Error::Invalid(format!(
                "a prompt of {} tokens needs {need} cache blocks of {}, and the cache has {} in all; shorten it or \
                 give the Batcher more blocks (BatcherOptions::blocks)",
                prompt.len(),
                self.paged.block_size(),
                self.paged.total_blocks()
            )));
        }
        let id = self.next_id;
        self.next_id += 1;
        self.scheduler.add(Key(id), prompt.len(), chunk);
        self.live.insert(
            id,
            Live { request, seq: None, cancelled: false, cached: None, chunk, scope, guesses: Default::default() },
        );
        Ok(RequestId(id))
    }

    /// Whether any request is waiting or running.
    pub fn is_busy(&self) -> bool {
        !self.live.is_empty()
    }

    /// Ends request `id` with [`FinishReason::Cancelled`] at the next step, whether it waits or
    /// runs. Returns false for a request that already ended (or never was).
    pub fn cancel(&mut self, id: RequestId) -> bool {
        match self.live.get_mut(&id.0) {
            Some(live) => {
                live.cancelled = true;
                true
            }
            None => false,
        }
    }

    /// Counts for monitoring.
    pub fn stats(&self) -> BatcherStats {
        let (waiting, running) = self.scheduler.counts();
        let blocks_used = self.paged.total_blocks() - self.paged.free_blocks();
        BatcherStats { waiting, running, blocks_used, ..self.stats.clone() }
    }

    /// Whether requests share prompt-prefix blocks ([`BatcherOptions::prefix_cache`]).
    pub fn prefix_caching(&self) -> bool {
        self.paged.prefix_caching()
    }

    /// Log-probabilities of the tokens request `id` has reported so far, if it is in flight.
    pub fn logprobs(&self, id: RequestId) -> Option<&[TokenLogprobs]> {
        self.live.get(&id.0).map(|l| l.request.logprobs())
    }

    /// Takes back every token fed to request `id` on the device in pipelined steps as if the
    /// host had picked another one, to test that path: its tokens stay the same, a step later.
    #[doc(hidden)]
    pub fn distrust_fed_tokens(&mut self, id: RequestId) {
        self.distrusted.insert(id.0);
    }

    /// Takes every draw made for request `id` where the logits are as uncertain, so that the host
    /// draws it again, to test that path: its tokens stay the same.
    #[doc(hidden)]
    pub fn redraw_on_host(&mut self, id: RequestId) {
        self.redrawn.insert(id.0);
    }

    /// Whether steps are pipelined ([`BatcherOptions::pipeline`]).
    pub fn pipelined(&self) -> bool {
        self.pipeline
    }

    /// Makes every step request `id` takes part in fail before the model runs, to test that a
    /// failure stays with its request.
    #[doc(hidden)]
    pub fn inject_failure(&mut self, id: RequestId) {
        self.faults.insert(id.0);
    }

    /// Runs one step: ends cancelled and finished requests, admits, preempts, then one forward
    /// pass over every scheduled request. The events of this step, in order; in pipelined steps
    /// ([`BatcherOptions::pipeline`]) the tokens are those of the step enqueued by the call
    /// before, read while this one runs. An error here means the batcher itself could not go on
    /// (a device that failed reading results); a failed forward pass only fails its requests
    /// ([`Event::Failed`]).
    pub fn step(&mut self) -> Result<Vec<Event>> {
        let mut events = vec![];
        if let Some(mut prev) = self.in_flight.take() {
            if self.chainable(&prev) {
                self.chain(&prev);
                prev.told = true;
                self.stats.pipelined_steps += 1;
                let mut next = self.launch(Some(&prev), &mut events)?;
                self.land(prev, next.as_mut(), &mut events)?;
                self.in_flight = next;
                return Ok(events);
            }
            self.land(prev, None, &mut events)?;
        }
        match self.launch(None, &mut events)? {
            Some(launched) if self.pipeline => self.in_flight = Some(launched),
            Some(launched) => self.land(launched, None, &mut events)?,
            None => {}
        }
        Ok(events)
    }

    /// Whether the step after `prev` can be enqueued before `prev` is read: its pass ran whole,
    /// and each request it samples for picks greedily on the device or ends with that token by
    /// its limits (no cancellation waits either).
    fn chainable(&self, prev: &Launched) -> bool {
        let Outcome::Together((logits, _)) = &prev.outcome else { return false };
        if prev.picks.is_none() || logits.dim(1) > self.model.vocab_size() || self.live.values().any(|l| l.cancelled) {
            return false;
        }
        // A request whose next position outgrows the whole cache ends there (CacheFull) after
        // this token: it is read first.
        let fits = |w: &Work| self.scheduler.blocks_for(w.end + 1) <= self.paged.total_blocks();
        prev.work.iter().filter(|w| w.samples && !prev.void.contains(&w.key.0)).all(|w| {
            self.live
                .get(&w.key.0)
                .is_none_or(|l| l.request.last_before_limit() || (l.request.plain_greedy() && fits(w)))
        })
    }

    /// Tells the scheduler of `prev`'s rows before they are read, as if each sampling request
    /// had its token: a request that ends with it by its limits leaves the scheduler instead.
    fn chain(&mut self, prev: &Launched) {
        for w in &prev.work {
            let Some(live) = self.live.get(&w.key.0).filter(|_| !prev.void.contains(&w.key.0)) else { continue };
            if w.samples && live.request.last_before_limit() {
                self.scheduler.remove(w.key);
            } else {
                self.scheduler.ran(w, usize::from(w.samples));
            }
        }
    }

    /// Ends cancelled and finished requests, admits, preempts, and enqueues one forward pass
    /// over every scheduled request (`None`: none is). With `prev` (not read yet; the scheduler
    /// told of it), the requests whose next token `prev` samples are fed its greedy pick on the
    /// device.
    fn launch(&mut self, prev: Option<&Launched>, events: &mut Vec<Event>) -> Result<Option<Launched>> {
        let ended: Vec<(u64, FinishReason)> = self
            .live
            .iter_mut()
            .filter_map(|(&k, l)| {
                if l.cancelled {
                    Some((k, FinishReason::Cancelled))
                } else if l.request.reached_limit() {
                    l.request.finish_reason().map(|r| (k, r.clone()))
                } else {
                    None
                }
            })
            .collect();
        for (k, reason) in ended {
            self.finish(k, reason, events);
        }
        let plan = self.scheduler.plan(&View { paged: &self.paged, live: &self.live });
        for k in &plan.preempted {
            self.stats.preemptions += 1;
            self.release(*k);
        }
        for k in plan.cache_full {
            self.finish(k.0, FinishReason::CacheFull, events);
        }
        let mut work: Vec<Work> = Vec::with_capacity(plan.work.len());
        for w in plan.work {
            let live = self.live.get_mut(&w.key.0).expect("scheduled requests are live");
            if live.seq.is_none() {
                let added = self
                    .paged
                    .add_with_prefix_in(&live.request.history, live.chunk, live.scope.clone())
                    .and_then(|(seq, held)| {
                        live.seq = Some(seq);
                        match held == w.start {
                            true => Ok(held),
                            false => Err(Error::Invalid(format!(
                                "internal: a prefix hit of {held} positions where the scheduler planned {}",
                                w.start
                            ))),
                        }
                    });
                match added {
                    Ok(held) => {
                        if live.cached.is_none() {
                            live.cached = Some(held);
                            events.push(Event::Started { id: RequestId(w.key.0), cached_tokens: held });
                        }
                    }
                    Err(error) => {
                        self.fail(w.key.0, error, events);
                        continue;
                    }
                }
            }
            work.push(w);
        }
        if work.is_empty() {
            return Ok(None);
        }
        let faults: HashSet<SeqId> = self.faults.iter().filter_map(|k| self.live.get(k).and_then(|l| l.seq)).collect();
        let drafts = self.drafts(&work);
        // A speculating decode's rows: its last token, then the guesses.
        let fed_rows: Vec<Vec<u32>> = work
            .iter()
            .zip(&drafts)
            .map(|(w, d)| match d.is_empty() {
                true => vec![],
                false => [&self.live[&w.key.0].request.history[w.start..w.end], &d[..]].concat(),
            })
            .collect();
        // The decodes whose token `prev` picks, still on the device: (item, row of `prev`).
        let mut picked: Vec<(usize, usize)> = vec![];
        if let Some(prev) = prev {
            for (i, w) in work.iter().enumerate() {
                if w.start == self.live[&w.key.0].request.history.len() {
                    let row = prev.work.iter().position(|p| p.key == w.key && p.samples);
                    picked.push((i, row.expect("a request's unread token is sampled by the step before")));
                }
            }
        }
        let items: Vec<(SeqId, &[u32], usize)> = work
            .iter()
            .zip(&fed_rows)
            .map(|(w, fed)| {
                let live = &self.live[&w.key.0];
                let tokens = match (fed.is_empty(), w.start == live.request.history.len()) {
                    // A placeholder for the picked token.
                    (_, true) => &[0u32][..],
                    (true, false) => &live.request.history[w.start..w.end],
                    (false, false) => &fed[..],
                };
                (live.seq.expect("given a sequence above"), tokens, w.start)
            })
            .collect();
        let counts: Vec<usize> = drafts.iter().map(|d| 1 + d.len()).collect();
        let from = match (prev.and_then(|p| p.picks.as_ref()), picked.is_empty()) {
            (Some((picks, _)), false) => Some((picks, &picked[..])),
            _ => None,
        };
        let outcome = executor::run(self.model, &mut self.paged, &items, &counts, &faults, self.mtp.is_some(), from);
        drop(items);
        let picks = match &outcome {
            Outcome::Together((logits, _)) if self.pipeline && work.iter().any(|w| w.samples) => {
                let picks = logits.argmax_gap()?;
                let read = picks.read_later()?;
                Some((picks, read))
            }
            _ => None,
        };
        let fed = picked.iter().map(|&(i, _)| work[i].key.0).collect();
        Ok(Some(Launched { work, drafts, outcome, picks, fed, told: false, void: HashSet::new() }))
    }

    /// Reads step `l`'s results: each request's tokens and events. `next`, enqueued since, is fed
    /// the tokens of `l` that were picked on the device: each is recorded in the cache, or, where
    /// the request took another token, taken back with the request's row of `next`.
    fn land(&mut self, l: Launched, next: Option<&mut Launched>, events: &mut Vec<Event>) -> Result<()> {
        let Launched { work, drafts, outcome, picks, told, void, .. } = l;
        let known = match &picks {
            Some((_, read)) => Some(read.wait::<u32>()?),
            None => None,
        };
        // The rows still wanted: their requests go on (a cancelled one gets nothing more), and
        // their rows stand.
        let wanted = |i: usize| {
            let key = work[i].key.0;
            self.live.get(&key).is_some_and(|l| !l.cancelled) && !void.contains(&key)
        };
        let kept: Vec<usize> = (0..work.len()).filter(|&i| wanted(i)).collect();
        let from = Taking { known: known.as_deref(), told, next };
        // The right guesses of each speculating request whose cache kept them (by key).
        let mut accepted: HashMap<u64, usize> = HashMap::new();
        // Each work item's hidden states (all its rows), for the head.
        let mut hidden: Vec<Option<Array>> = vec![None; work.len()];
        match outcome {
            Outcome::Together((logits, h)) if kept.len() == work.len() => {
                accepted = self.take_logits(&work, &drafts, &logits, from, events)?;
                if let Some(h) = h {
                    let mut at = 0;
                    for (i, (w, d)) in work.iter().zip(&drafts).enumerate() {
                        let n = w.end - w.start + d.len();
                        hidden[i] = Some(h.slice_rows(at, at + n)?);
                        at += n;
                    }
                }
            }
            Outcome::Together((logits, _)) => {
                // Pipelined steps (one row each, no guesses): the kept rows alone.
                let rows = kept.iter().map(|&i| logits.slice_rows(i, i + 1)).collect::<nuvec::Result<Vec<_>>>()?;
                let picks: Option<Vec<u32>> =
                    known.as_ref().map(|k| kept.iter().flat_map(|&i| k[3 * i..3 * i + 3].to_vec()).collect());
                let from = Taking { known: picks.as_deref(), ..from };
                let work: Vec<Work> = kept.iter().map(|&i| work[i]).collect();
                if !rows.is_empty() {
                    self.take_rows(&work, &crate::step::concat_rows(&rows)?, from, events)?;
                }
                return Ok(());
            }
            Outcome::Apart(results) => {
                let mut from = from;
                for (i, ((w, d), result)) in work.iter().zip(&drafts).zip(results).enumerate() {
                    if !kept.contains(&i) {
                        continue;
                    }
                    match result {
                        Ok((logits, h)) => {
                            let one = std::slice::from_ref(w);
                            let step = Taking { known: None, told: from.told, next: from.next.as_deref_mut() };
                            accepted.extend(self.take_logits(one, std::slice::from_ref(d), &logits, step, events)?);
                            hidden[i] = h;
                        }
                        Err(error) => self.fail(w.key.0, error, events),
                    }
                }
            }
        }
        self.show_head(&work, &drafts, &hidden, &accepted);
        Ok(())
    }

    /// Records the token `token` that request `key` took where `next` was fed `device` (the
    /// device's greedy pick): the cache learns it, or, when the request took another one, its
    /// row of `next` is taken back from the cache and from `next`.
    fn settle_fed(&mut self, key: u64, token: u32, device: u32, next: &mut Launched) -> Result<()> {
        let live = &self.live[&key];
        let Some(seq) = live.seq else { return Ok(()) };
        // A failed pass of `next` put the cache back: nothing to settle (its failure is
        // reported when `next` is read).
        if self.paged.positions(seq)? != live.request.history.len() + 1 {
            return Ok(());
        }
        if token == device && !self.distrusted.contains(&key) {
            return self.paged.commit_fed(seq, token);
        }
        next.void.insert(key);
        self.stats.taken_back += 1;
        self.paged.trim(seq, 1)
    }

    /// Shows the multi-token-prediction head (when guesses come from it) each running request's
    /// positions this step kept (a plain item's rows, a speculating one's last token and right
    /// guesses), and runs it over them.
    fn show_head(
        &mut self,
        work: &[Work],
        drafts: &[Vec<u32>],
        hidden: &[Option<Array>],
        accepted: &HashMap<u64, usize>,
    ) {
        let Some(mtp) = &mut self.mtp else { return };
        let mut shown = vec![];
        for ((w, d), h) in work.iter().zip(drafts).zip(hidden) {
            let (Some(h), Some(live)) = (h, self.live.get(&w.key.0)) else { continue };
            let kept = match d.is_empty() {
                true => Some(w.end - w.start),
                false => accepted.get(&w.key.0).map(|a| w.end - w.start + a),
            };
            let Some(rows) = kept.and_then(|n| h.slice_rows(0, n).ok()) else {
                mtp.forget(w.key.0);
                continue;
            };
            mtp.observe(w.key.0, w.start, &rows);
            shown.push((w.key.0, live.request.history.as_slice()));
        }
        mtp.catch_up(&shown);
    }

    /// The guesses each work item feeds after its last token this step: from the draft model
    /// for every speculating request at once, or each request's prompt lookup.
    fn drafts(&mut self, work: &[Work]) -> Vec<Vec<u32>> {
        // Its settings are plain numbers: copied, so that the rooms can be asked of `self`.
        let Some(s) = self.speculation.clone() else { return vec![vec![]; work.len()] };
        let rooms: Vec<usize> = work.iter().map(|w| self.draft_room(w)).collect();
        let live = &self.live;
        if let Some(mtp) = &mut self.mtp {
            let asks: Vec<_> = work
                .iter()
                .zip(&rooms)
                .map(|(w, &room)| (w.key.0, live[&w.key.0].request.history.as_slice(), room))
                .collect();
            return mtp.propose(&asks);
        }
        match &mut self.drafter {
            Some(drafter) => {
                drafter.retain(|k| live.contains_key(&k));
                let asks: Vec<_> = work
                    .iter()
                    .zip(&rooms)
                    .map(|(w, &room)| (w.key.0, live[&w.key.0].request.history.as_slice(), room))
                    .collect();
                drafter.propose(&asks)
            }
            // The lookup only reads the history: it cannot fail, and a failure would only mean
            // no guess.
            None => work
                .iter()
                .zip(&rooms)
                .map(|(w, &room)| match room {
                    0 => vec![],
                    _ => s.propose(&live[&w.key.0].request.history, room).unwrap_or_default(),
                })
                .collect(),
        }
    }

    /// How many guesses request `w` may feed this step: none unless the plan gave it room and
    /// the request may speculate.
    fn draft_room(&mut self, w: &Work) -> usize {
        let (Some(s), true) = (&self.speculation, w.draft > 0) else { return 0 };
        let live = self.live.get_mut(&w.key.0).expect("scheduled requests are live");
        if !live.guesses.guesses() {
            return 0;
        }
        w.draft.min(live.request.draft_room()).min(s.num_draft)
    }

    /// Takes a step's `logits` (each work item's rows: one, or one more than its `drafts`): the
    /// plain rows as [`Batcher::take_rows`] does, each speculating request's rows verified.
    /// Returns how many guesses each speculating request's cache kept (by key).
    fn take_logits(
        &mut self,
        work: &[Work],
        drafts: &[Vec<u32>],
        logits: &Array,
        from: Taking,
        events: &mut Vec<Event>,
    ) -> Result<HashMap<u64, usize>> {
        let mut kept = HashMap::new();
        if drafts.iter().all(Vec::is_empty) {
            self.take_rows(work, logits, from, events)?;
            return Ok(kept);
        }
        let mut plain: (Vec<Work>, Vec<Array>) = (vec![], vec![]);
        let mut speculating = vec![];
        let mut at = 0;
        for (w, d) in work.iter().zip(drafts) {
            let rows = logits.slice_rows(at, at + 1 + d.len())?;
            at += 1 + d.len();
            match d.is_empty() {
                true => {
                    plain.0.push(*w);
                    plain.1.push(rows);
                }
                false => speculating.push((*w, d, rows)),
            }
        }
        if !plain.0.is_empty() {
            let plainly = Taking { known: None, told: false, next: None };
            self.take_rows(&plain.0, &crate::step::concat_rows(&plain.1)?, plainly, events)?;
        }
        for (w, d, rows) in speculating {
            if let Some(accepted) = self.take_guesses(&w, d, &rows, events)? {
                kept.insert(w.key.0, accepted);
            }
        }
        Ok(kept)
    }

    /// Verifies request `w`'s guesses `drafts` on its `rows` of logits (its last token's, then
    /// each guess's): the tokens it samples are handed out, the cache keeps the right guesses.
    /// Returns how many it kept (`None`: the request failed).
    fn take_guesses(
        &mut self,
        w: &Work,
        drafts: &[u32],
        rows: &Array,
        events: &mut Vec<Event>,
    ) -> Result<Option<usize>> {
        let vocab = rows.dim(1);
        let host = rows.to_vec::<f32>()?;
        let id = RequestId(w.key.0);
        let live = self.live.get_mut(&w.key.0).expect("scheduled requests are live");
        let verified = speculation::verify(drafts, &host, vocab, |row| {
            if live.request.reached_limit() {
                return Ok(None);
            }
            let token = live.request.sample_on_host(row)?;
            if let Some(token) = live.request.accept(token) {
                if live.request.options.logprobs.is_some() {
                    if let Some(lp) = live.request.logprobs().last() {
                        events.push(Event::Logprobs { id, logprobs: lp.clone() });
                    }
                }
                events.push(Event::Token { id, token });
            }
            Ok(Some((token, live.request.finish_reason().is_none())))
        });
        let verified = match verified {
            Ok(v) => v,
            Err(error) => {
                self.scheduler.ran(w, 0);
                self.fail(w.key.0, error, events);
                return Ok(None);
            }
        };
        self.stats.generated_tokens += verified.sampled as u64;
        self.stats.drafted_tokens += drafts.len() as u64;
        self.stats.accepted_tokens += verified.accepted as u64;
        let min = self.speculation.as_ref().map_or(0.0, |s| s.min_acceptance);
        live.guesses.record(drafts.len(), verified.accepted, min);
        // The cache holds the last token and every guess; the wrong ones go.
        let seq = live.seq.expect("given a sequence above");
        let reason = live.request.finish_reason().cloned();
        if let Err(error) = self.paged.trim(seq, drafts.len() - verified.accepted) {
            self.fail(w.key.0, error, events);
            return Ok(None);
        }
        self.scheduler.ran(w, verified.sampled);
        if let Some(reason) = reason {
            self.finish(w.key.0, reason, events);
        }
        Ok(Some(verified.accepted))
    }

    /// Commits `work`'s rows and samples the next token of each request whose logits row (in
    /// `logits [work, vocab]`, in order) ends its known tokens. Rows whose token is not the plain
    /// greedy pick are sampled on the host, several requests at once on threads of their own
    /// (each request's processors, mask and generator are its own, so the tokens are those of
    /// sampling them one after another); events then follow in row order. `from` says what is
    /// known of the rows already, and which step was fed their greedy picks since.
    fn take_rows(&mut self, work: &[Work], logits: &Array, from: Taking, events: &mut Vec<Event>) -> Result<()> {
        let Taking { known, told, mut next } = from;
        let vocab = logits.dim(1);
        let masked: Vec<usize> =
            (0..work.len()).filter(|&r| work[r].samples && self.live[&work[r].key.0].request.masked_greedy()).collect();
        let any_greedy = work.iter().any(|w| w.samples && self.live[&w.key.0].request.plain_greedy());
        // Sampled rows' draws, enqueued before anything is read.
        let drawable: Vec<usize> = (0..work.len())
            .filter(|&r| {
                self.device_sampling && work[r].samples && self.live[&work[r].key.0].request.plain_sampled(vocab)
            })
            .collect();
        let drawn = if drawable.is_empty() {
            None
        } else {
            let (mut scales, mut uniforms) = (vec![0f32; work.len()], vec![0f64; work.len()]);
            for &row in &drawable {
                let live = self.live.get_mut(&work[row].key.0).expect("scheduled requests are live");
                (scales[row], uniforms[row]) = live.request.predraw();
            }
            Some(logits.sample_rows(&scales, &uniforms)?)
        };
        let gaps = match (known, any_greedy || !masked.is_empty()) {
            (Some(known), _) => Some(known.to_vec()),
            (None, true) => Some(logits.argmax_gap()?.to_vec::<u32>()?),
            (None, false) => None,
        };
        // Each sampling row's greedy token where the device's pick is certain, else None.
        let mut picks: Vec<Option<u32>> = vec![None; work.len()];
        for (row, w) in work.iter().enumerate() {
            let request = &self.live[&w.key.0].request;
            if let (true, Some(g), true) = (w.samples, &gaps, request.plain_greedy()) {
                picks[row] = request.greedy_from_gap(&g[3 * row..3 * row + 3], vocab)?;
            }
        }
        // Constrained greedy rows: every row's mask (all tokens for the others) applied where
        // the logits are, then the same pick.
        if let (false, Some(g)) = (masked.is_empty(), &gaps) {
            let words = vocab.div_ceil(32);
            let mut bits = vec![u32::MAX; work.len() * words];
            let mut ready = vec![false; work.len()];
            let waiting = std::time::Instant::now();
            for &row in &masked {
                let live = self.live.get_mut(&work[row].key.0).expect("scheduled requests are live");
                ready[row] = live.request.write_mask_bits(&mut bits[row * words..][..words]);
            }
            self.stats.mask_wait += waiting.elapsed();
            let m = logits.masked_argmax_gap(&bits, MASKED)?.to_vec::<u32>()?;
            for &row in masked.iter().filter(|&&r| ready[r]) {
                let (mine, raw) = (&m[3 * row..3 * row + 3], &g[3 * row..3 * row + 3]);
                picks[row] = self.live[&work[row].key.0].request.greedy_from_masked_gap(mine, raw, vocab)?;
            }
        }
        if let Some(drawn) = drawn {
            let words = drawn.to_vec::<u32>()?;
            for &row in &drawable {
                let live = self.live.get_mut(&work[row].key.0).expect("scheduled requests are live");
                let mut mine = [words[3 * row], words[3 * row + 1], words[3 * row + 2]];
                if self.redrawn.contains(&work[row].key.0) {
                    mine[1] = 0;
                }
                picks[row] = live.request.drawn_on_device(&mine)?;
                match picks[row] {
                    Some(_) => self.stats.drawn_on_device += 1,
                    None => self.stats.drawn_again += 1,
                }
            }
        }
        let host_rows: Vec<usize> = (0..work.len()).filter(|&r| work[r].samples && picks[r].is_none()).collect();
        let mut sampled: Vec<Option<Result<u32>>> = (0..work.len()).map(|_| None).collect();
        if !host_rows.is_empty() {
            let mut host: HashMap<usize, Vec<f32>> =
                host_rows.iter().copied().zip(read_rows(logits, &host_rows)?).collect();
            let wanted: HashMap<u64, usize> = host_rows.iter().map(|&r| (work[r].key.0, r)).collect();
            let mut jobs: Vec<(usize, Vec<f32>, &mut Request)> = self
                .live
                .iter_mut()
                .filter_map(|(k, live)| {
                    wanted.get(k).map(|&r| (r, host.remove(&r).unwrap_or_default(), &mut live.request))
                })
                .collect();
            let results = sample_rows(&mut jobs);
            for (row, result) in results {
                sampled[row] = Some(result);
            }
        }
        // The constrained rows' tokens into their grammars, all at once.
        let tokens: HashMap<u64, u32> = work
            .iter()
            .enumerate()
            .filter(|(_, w)| w.samples && self.live[&w.key.0].request.constrained())
            .filter_map(|(row, w)| {
                let sampled = match &sampled[row] {
                    Some(Ok(t)) => Some(*t),
                    _ => None,
                };
                picks[row].or(sampled).map(|t| (w.key.0, t))
            })
            .collect();
        if tokens.len() > 1 {
            let mut constrained: Vec<(&mut Request, u32)> =
                self.live.iter_mut().filter_map(|(k, l)| tokens.get(k).map(|&t| (&mut l.request, t))).collect();
            commit_constraints(&mut constrained);
        }
        for (row, w) in work.iter().enumerate() {
            self.stats.prefill_tokens += (w.end - w.start - usize::from(w.samples)) as u64;
            if !w.samples {
                if !told {
                    self.scheduler.ran(w, 0);
                }
                continue;
            }
            let token = match (picks[row], sampled[row].take()) {
                (Some(t), _) | (None, Some(Ok(t))) => t,
                (None, Some(Err(error))) => {
                    // Its constraint failed: this request alone ends.
                    if !told {
                        self.scheduler.ran(w, 0);
                    }
                    self.fail(w.key.0, error, events);
                    continue;
                }
                (None, None) => unreachable!("every sampling row without a greedy pick was sampled"),
            };
            if let (Some(next), Some(g)) = (next.as_deref_mut(), &gaps) {
                if next.fed.contains(&w.key.0) {
                    if let Err(error) = self.settle_fed(w.key.0, token, g[3 * row], next) {
                        self.fail(w.key.0, error, events);
                        continue;
                    }
                }
            }
            let live = self.live.get_mut(&w.key.0).expect("scheduled requests are live");
            self.stats.generated_tokens += 1;
            if !told {
                self.scheduler.ran(w, 1);
            }
            let id = RequestId(w.key.0);
            let handed_out = live.request.accept(token);
            if let Some(token) = handed_out {
                if live.request.options.logprobs.is_some() {
                    if let Some(lp) = live.request.logprobs().last() {
                        events.push(Event::Logprobs { id, logprobs: lp.clone() });
                    }
                }
                events.push(Event::Token { id, token });
            }
            if let Some(reason) = live.request.finish_reason().cloned() {
                self.finish(w.key.0, reason, events);
            }
        }
        Ok(())
    }

    /// Frees request `k`'s cache (it stays queued: preempted).
    fn release(&mut self, k: Key) {
        if let Some(mtp) = &mut self.mtp {
            mtp.forget(k.0);
        }
        if let Some(seq) = self.live.get_mut(&k.0).and_then(|l| l.seq.take()) {
            // The id came from this cache and was not removed since.
            let _ = self.paged.remove(seq);
        }
    }

    fn fail(&mut self, k: u64, error: Error, events: &mut Vec<Event>) {
        if let Some(live) = self.live.get_mut(&k) {
            live.request.fail();
        }
        events.push(Event::Failed { id: RequestId(k), error });
        self.finish(k, FinishReason::Error, events);
    }

    /// Ends request `k`: reported, forgotten, its blocks free.
    fn finish(&mut self, k: u64, reason: FinishReason, events: &mut Vec<Event>) {
        self.release(Key(k));
        self.scheduler.remove(Key(k));
        if self.live.remove(&k).is_some() {
            events.push(Event::Finished { id: RequestId(k), reason });
        }
    }
}

/// The scheduler's view of the cache's blocks.
struct View<'a> {
    paged: &'a PagedCache,
    live: &'a BTreeMap<u64, Live>,
}

impl BlockView for View<'_> {
    fn free(&self) -> usize {
        self.paged.free_blocks()
    }

    fn exclusive(&self, key: Key) -> usize {
        let seq = self.live.get(&key.0).and_then(|l| l.seq);
        seq.and_then(|s| self.paged.exclusive_blocks(s).ok()).unwrap_or(0)
    }

    fn prefix(&self, key: Key) -> (usize, usize) {
        self.live.get(&key.0).map_or((0, 0), |l| self.paged.probe_prefix_in(&l.request.history, l.chunk, &l.scope))
    }

    fn shares_pending(&self, key: Key, cached: usize, running: &[(Key, usize)]) -> bool {
        let Some(waiting) = self.live.get(&key.0) else { return false };
        if !self.paged.prefix_caching() {
            return false;
        }
        let tokens = &waiting.request.history;
        let bs = self.paged.block_size();
        // Whole blocks a hit can give it (never its last token), beyond what the cache holds.
        let usable = tokens.len().saturating_sub(1) / bs * bs;
        running.iter().any(|&(r, computed)| {
            let Some(other) = self.live.get(&r.0).filter(|o| o.scope == waiting.scope) else { return false };
            let common = tokens[..usable].iter().zip(&other.request.history).take_while(|(a, b)| a == b).count();
            let shared = common / bs * bs;
            shared > cached && computed < shared
        })
    }
}

/// Refuses cache options the paged cache does not have (yet), naming them: a request may ask
/// for the quantization the cache has (`quantized` from [`BatcherOptions::kv_bits`]) or none.
fn check_cache_options(model: &Model, cache: &CacheOptions, quantized: Option<QuantSpec>) -> Result<()> {
    if let Some(bits) = cache.kv_bits {
        let Some(spec) = quantized else {
            return Err(Error::Unsupported(format!(
                "kv_bits = {bits}: this Batcher's cache is not quantized; make it with BatcherOptions::kv_bits \
                 (nuvec serve --kv-bits), or submit without kv_bits"
            )));
        };
        if (bits, cache.kv_group_size) != (spec.bits, spec.group_size) {
            return Err(Error::Invalid(format!(
                "kv_bits = {bits}, kv_group_size = {}: this Batcher's cache is quantized to {} bits in groups of {}; \
                 submit with those or without kv_bits",
                cache.kv_group_size, spec.bits, spec.group_size
            )));
        }
        if cache.quantized_kv_start != 0 {
            return Err(Error::Unsupported(format!(
                "quantized_kv_start = {}: the Batcher's quantized cache quantizes every sequence after its first \
                 pass (quantized_kv_start 0); submit with 0 or without kv_bits",
                cache.quantized_kv_start
            )));
        }
    }
    let asked = model.cache_options(cache).kv_dtype;
    let unsupported = if cache.max_kv_size.is_some() {
        Some("max_kv_size (a rotating cache)")
    } else if asked != Some(model.kv_dtype()) {
        Some("kv_dtype other than the model's")
    } else {
        None
    };
    match unsupported {
        Some(what) => Err(Error::Unsupported(format!(
            "the Batcher's paged cache has no {what} yet; submit the request with the default cache options"
        ))),
        None => Ok(()),
    }
}

/// Whether `model` is a hybrid (recurrent layers) split across ranks, whose prefix cache stays off:
/// a hit there needs each rank's recurrent states where it ends, which each rank keeps within its
/// own budget, so the ranks could find different hits. Asking for the prefix cache is refused.
fn split_hybrid(model: &Model, prefix_cache: Option<bool>) -> Result<bool> {
    // The family, not this rank's layers: a stage may hold no recurrent layer while others do.
    let hybrid = model.ranks().is_some() && model.model_type().starts_with("qwen3_5");
    if hybrid && prefix_cache == Some(true) {
        return Err(Error::Unsupported(format!(
            "BatcherOptions::prefix_cache = Some(true) over a {} model split across ranks: each rank keeps its own \
             recurrent states, and their hits could differ; leave it None (off there)",
            model.model_type()
        )));
    }
    Ok(hybrid)
}

/// What a Batcher over a model split across `group` cannot do: be made on a rank but 0 (which
/// follow it), speculate, quantize its cache, or feed tokens picked on the device.
fn refuse_split(group: &nuvec::distributed::Group, speculates: bool, options: &BatcherOptions) -> Result<()> {
    if group.rank() != 0 {
        return Err(Error::Invalid(format!(
            "a Batcher over a model split across ranks is made on rank 0; rank {} calls Batcher::follow",
            group.rank()
        )));
    }
    if speculates {
        return Err(Error::Unsupported("speculative decoding on a model split across ranks".into()));
    }
    if options.kv_bits.is_some() {
        // Its making probes the model with a pass of rank 0 alone.
        return Err(Error::Unsupported(
            "a quantized paged cache (kv_bits) over a model split across ranks is not built yet; leave kv_bits None"
                .into(),
        ));
    }
    if options.pipeline == Some(true) {
        return Err(Error::Unsupported(
            "BatcherOptions::pipeline = Some(true) over a model split across ranks: a token picked on the device is \
             not on the other ranks; leave it None"
                .into(),
        ));
    }
    Ok(())
}

/// Whether a Batcher of `options` over `model` pipelines its steps ([`BatcherOptions::pipeline`]):
/// as asked, else as `NUVEC_BATCH_PIPELINE` says, else on a GPU; never where a fed token could not
/// be taken back (asking for it there is refused).
fn pipelined(model: &Model, paged: &PagedCache, draft: bool, options: &BatcherOptions) -> Result<bool> {
    let blocker = if options.speculation.is_some() || draft {
        Some("speculation")
    } else if options.batch_invariant {
        Some("batch_invariant")
    } else if options.kv_bits.is_some() {
        Some("kv_bits")
    } else if paged.has_recurrent_layers() {
        Some("a hybrid model (recurrent layers)")
    } else {
        None
    };
    if let (Some(true), Some(what)) = (options.pipeline, blocker) {
        return Err(Error::Unsupported(format!(
            "BatcherOptions::pipeline = Some(true) with {what}: a token fed on the device could not be taken back \
             there; leave pipeline None (off there) or Some(false)"
        )));
    }
    let wanted = match options.pipeline {
        Some(on) => on,
        None => pipeline_default(model.device())?,
    };
    Ok(wanted && blocker.is_none() && model.ranks().is_none())
}

/// Whether batched steps on `device` are pipelined unless told otherwise
/// ([`BatcherOptions::pipeline`] `None`): as the device's `NUVEC_BATCH_PIPELINE` says (its
/// setting, `nuvec::tuning::configure`, else the environment's), else not. (On a GPU
/// they did not measure faster yet: docs/benchmarks.md, 2026-12-06. On the CPU, whose steps
/// compute as they are enqueued, there is nothing to overlap.)
pub fn pipeline_default(device: Device) -> Result<bool> {
    Ok(switch("NUVEC_BATCH_PIPELINE", nuvec::tuning::setting("NUVEC_BATCH_PIPELINE", device))?.unwrap_or(false))
}

/// A `0` / `1` knob's `value` (read at the call, where the registry's test finds the name):
/// `Some(on)`, `None` when unset or empty, an error naming any other value.
fn switch(name: &str, value: std::result::Result<String, std::env::VarError>) -> Result<Option<bool>> {
    match value.as_deref() {
        Ok("0") => Ok(Some(false)),
        Ok("1") => Ok(Some(true)),
        Ok("") | Err(_) => Ok(None),
        Ok(other) => Err(Error::Invalid(format!("{name}={other:?}: use 0 (off) or 1 (on)"))),
    }
}

/// Whether sampled tokens on `device` are drawn where the logits are unless told otherwise
/// ([`BatcherOptions::device_sampling`] `None`, and `generate`): as the device's
/// `NUVEC_DEVICE_SAMPLING` says (its setting, else the environment's),
/// else on a GPU (a row of logits read to the host is half a megabyte at a 128k vocabulary) and
/// not on the CPU (whose rows are in memory already).
pub fn device_sampling_default(device: Device) -> Result<bool> {
    let value = nuvec::tuning::setting("NUVEC_DEVICE_SAMPLING", device);
    Ok(switch("NUVEC_DEVICE_SAMPLING", value)?.unwrap_or(device != Device::Cpu))
}

/// Blocks for `options` on `model`'s device (see [`BatcherOptions::blocks`]); with a `draft`,
/// whose cache takes as many blocks, the memory is shared between the two in proportion.
fn default_blocks(model: &Model, draft: Option<&Model>, options: &BatcherOptions) -> Result<usize> {
    let (mut full, mut window) = crate::cache::paged::kv_bytes_per_position(model)?;
    if let Some(bits) = options.kv_bits {
        // Each value as `bits`, and an f32 scale and bias per group.
        let quantized = |bytes: usize| {
            let values = bytes / model.kv_dtype().dtype().size();
            (values * bits).div_ceil(8) + values.div_ceil(options.kv_group_size) * 8
        };
        (full, window) = (quantized(full), quantized(window));
    }
    let per_block = (full + window) * options.block_size;
    // The sliding-window layers take at most this many blocks (`PagedCache::set_step_tokens`).
    let budget = options.token_budget_on(model.device());
    let slack = options.speculation.as_ref().map_or(0, |s| s.num_draft);
    let window_blocks = window_blocks_for(model, options.block_size, options.max_batch, budget, slack);
    let cap = (options.max_batch * options.max_positions).div_ceil(options.block_size);
    if per_block == 0 {
        return Ok(cap);
    }
    let available = model.device().available_memory()?;
    let bytes = match options.cache_bytes {
        Some(asked) if asked > available => {
            return Err(Error::Invalid(format!(
                "BatcherOptions::cache_bytes = {asked} is more than the {available} bytes free on {}; give less",
                model.device()
            )))
        }
        Some(asked) if asked < per_block => {
            return Err(Error::Invalid(format!(
                "BatcherOptions::cache_bytes = {asked} is less than one cache block ({per_block} bytes: {} positions \
                 of {} bytes); give more",
                options.block_size,
                per_block / options.block_size
            )))
        }
        Some(asked) => asked as f64,
        None if model.device() == Device::Cpu => {
            (available as f64 * options.memory_fraction).min(DEFAULT_CPU_KV_BYTES as f64)
        }
        None => available as f64 * options.memory_fraction,
    };
    let bytes = match draft {
        Some(d) => {
            let (draft_full, draft_window) = d.kv_bytes_per_position_by_kind()?;
            let draft_block = (draft_full + draft_window) * options.block_size;
            bytes * per_block as f64 / (per_block + draft_block) as f64
        }
        None => bytes,
    };
    let blocks = match window_blocks {
        // Past the windows' blocks, a block costs only the full layers' bytes.
        Some(w) if bytes >= (w * per_block) as f64 && full > 0 => {
            w + ((bytes - (w * per_block) as f64) / (full * options.block_size) as f64) as usize
        }
        Some(w) if bytes >= (w * per_block) as f64 => cap,
        _ => (bytes / per_block as f64) as usize,
    }
    .min(cap);
    if blocks == 0 {
        return Err(Error::Invalid(format!(
            "no memory left for one cache block ({per_block} bytes) on {}; set BatcherOptions::blocks",
            model.device()
        )));
    }
    Ok(blocks)
}

/// Rows `rows` of `logits [n, vocab]` on the host: read one by one when they are few (the
/// constrained rows whose device pick is uncertain, among greedy ones), else in one copy.
fn read_rows(logits: &Array, rows: &[usize]) -> Result<Vec<Vec<f32>>> {
    let (n, vocab) = (logits.dim(0), logits.dim(1));
    if rows.len() * 4 <= n {
        return rows.iter().map(|&r| Ok(logits.slice_rows(r, r + 1)?.to_vec::<f32>()?)).collect();
    }
    let all = logits.to_vec::<f32>()?;
    Ok(rows.iter().map(|&r| all[r * vocab..(r + 1) * vocab].to_vec()).collect())
}

/// Samples each job's row (its logits on the host): `(row, token)` for each, on up to the
/// machine's cores when there are several (each request only touches its own state).
fn sample_rows(jobs: &mut [(usize, Vec<f32>, &mut Request)]) -> Vec<(usize, Result<u32>)> {
    let one = |(row, logits, request): &mut (usize, Vec<f32>, &mut Request)| {
        (*row, request.sample_on_host(std::mem::take(logits)))
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(jobs.len());
    if threads <= 1 {
        return jobs.iter_mut().map(one).collect();
    }
    let per = jobs.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = jobs
            .chunks_mut(per)
            .map(|chunk| scope.spawn(move || chunk.iter_mut().map(one).collect::<Vec<_>>()))
            .collect();
        handles.into_iter().flat_map(|h| h.join().expect("a sampling thread panicked")).collect()
    })
}
