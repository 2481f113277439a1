//! Stops: tokens and strings that end generation, as vLLM's `stop_token_ids` and `stop`.
//!
//! Stop strings are matched on the bytes of the generated text as the tokenizer decodes it, so a
//! string still matches when it spans tokens or splits a character. [`TextStream`] turns tokens
//! into text that never shows a stop string, even in part.

use std::sync::Arc;

use crate::generate::GenerateOptions;
use crate::stream::take_utf8;
use crate::token_bytes::TokenBytes;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// Most stop strings per request.
pub const MAX_STOP_STRINGS: usize = 64;
/// Longest stop string, in bytes.
pub const MAX_STOP_BYTES: usize = 1024;

/// What ends generation besides end-of-sequence and `max_tokens`.
#[derive(Debug, Clone, Default)]
pub struct Stop {
    /// Token ids that end generation (not yielded, like end-of-sequence).
    pub tokens: Vec<u32>,
    strings: Vec<Vec<u8>>,
    bytes: Option<Arc<TokenBytes>>,
}

/// Which stop ended generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// A stop token (not yielded).
    Token(u32),
    /// Stop string `index` completed at the last yielded token; `cut` bytes at the end of the
    /// decoded output (the match and anything after it) are not part of the answer.
    String {
        /// Index into the stop strings as given.
        index: usize,
        /// Bytes to cut from the end of the decoded output.
        cut: usize,
    },
}

impl Stop {
    /// Stop strings for `tokenizer` (at most 64, each 1 to 1024 bytes). Reads every token's bytes
    /// once; build it once and clone it for each request.
    pub fn strings<S: AsRef<str>>(tokenizer: &Tokenizer, strings: impl IntoIterator<Item = S>) -> Result<Self> {
        let strings: Vec<Vec<u8>> = strings.into_iter().map(|s| s.as_ref().as_bytes().to_vec()).collect();
        if strings.len() > MAX_STOP_STRINGS {
            return Err(Error::Invalid(format!(
                "{} stop strings; at most {MAX_STOP_STRINGS} are allowed",
                strings.len()
            )));
        }
        for (i, s) in strings.iter().enumerate() {
            if s.is_empty() || s.len() > MAX_STOP_BYTES {
                return Err(Error::Invalid(format!(
                    "stop string {i} is {} bytes; each must be 1 to {MAX_STOP_BYTES} bytes",
                    s.len()
                )));
            }
        }
        let bytes = (!strings.is_empty()).then(|| tokenizer.token_bytes());
        Ok(Stop { tokens: vec![], strings, bytes })
    }

    /// Stop tokens only.
    pub fn tokens(tokens: impl IntoIterator<Item = u32>) -> Self {
        Stop { tokens: tokens.into_iter().collect(), ..Default::default() }
    }

    /// Adds stop tokens (an `Option<u32>` works too, e.g. `tokenizer.token_id("<|im_end|>")`).
    pub fn with_tokens(mut self, tokens: impl IntoIterator<Item = u32>) -> Self {
        self.tokens.extend(tokens);
        self
    }

    /// The stop strings' bytes, in the order given.
    pub fn string_bytes(&self) -> &[Vec<u8>] {
        &self.strings
    }

    /// True when nothing is set.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty() && self.strings.is_empty()
    }

    fn longest(&self) -> usize {
        self.strings.iter().map(Vec::len).max().unwrap_or(0)
    }
}

/// Watches generated tokens for stop strings.
#[derive(Debug, Clone, Default)]
pub(crate) struct StopMatcher {
    /// The last bytes generated: enough to hold any stop string ending in the next token.
    tail: Vec<u8>,
}

impl StopMatcher {
    /// Adds token `id`'s bytes; when a stop string completes in them, returns the earliest
    /// completed match (lowest end, then lowest index) as `(index, cut)`. With `armed` false
    /// (before min_tokens) the bytes are recorded but nothing matches.
    pub(crate) fn push(&mut self, stop: &Stop, id: u32, armed: bool) -> Option<(usize, usize)> {
        let table = stop.bytes.as_ref()?;
        let before = self.tail.len();
        self.tail.extend_from_slice(table.get(id));
        let mut best: Option<(usize, usize, usize)> = None; // (end, index, start)
        if armed {
            for (index, s) in stop.strings.iter().enumerate() {
                let first_start = (before + 1).saturating_sub(s.len());
                let Some(last_start) = self.tail.len().checked_sub(s.len()) else {
                    continue;
                };
                if let Some(start) = (first_start..=last_start).find(|&i| self.tail[i..i + s.len()] == s[..]) {
                    let end = start + s.len();
                    if best.is_none_or(|(e, _, _)| end < e) {
                        best = Some((end, index, start));
                    }
                }
            }
        }
        let found = best.map(|(_, index, start)| (index, self.tail.len() - start));
        let keep = stop.longest().saturating_sub(1);
        if self.tail.len() > keep {
            self.tail.drain(..self.tail.len() - keep);
        }
        found
    }
}

/// Text of a generation as it streams: complete characters only, a stop string's match cut off,
/// and any text that could still begin a stop string held back until it cannot.
#[derive(Debug, Clone)]
pub struct TextStream {
    table: Arc<TokenBytes>,
    stop: Stop,
    min_tokens: usize,
    eos: Vec<u32>,
    ignore_eos: bool,
    matcher: StopMatcher,
    pending: Vec<u8>,
    tokens: usize,
    /// Trim the start as mlx-lm's detokenizer does, not as the tokenizer's decoder does.
    mlx_lm: bool,
    stripped: usize,
    started: bool,
    done: bool,
}

impl TextStream {
    /// The text as mlx-lm prints it: while nothing has been printed, each piece its streaming
    /// detokenizer flushes loses one leading space (`BPEStreamingDetokenizer._maybe_trim_space`,
    /// and `SPMStreamingDetokenizer`'s trim), so the tokens of " EST EST" print "EST EST" for a
    /// byte-level BPE tokenizer. [`TextStream::new`] keeps that space, as the tokenizer's own
    /// decoding does.
    pub fn with_mlx_lm_spacing(mut self) -> Self {
        self.mlx_lm = self.table.mlx_lm_trims_space();
        self
    }

    /// mlx-lm's trim at the start (see [`TextStream::with_mlx_lm_spacing`]): a piece is flushed
    /// once its characters are complete, and byte-level BPE holds a lone space token for the
    /// next. Returns whether the text is still held back.
    fn mlx_lm_start(&mut self, id: u32) -> bool {
        let lone_space = self.table.is_byte_level() && self.table.get(id) == b" ";
        if lone_space || String::from_utf8_lossy(&self.pending).ends_with('\u{FFFD}') {
            return true;
        }
        if self.pending.first() == Some(&b' ') {
            self.pending.remove(0);
        }
        self.started = !self.pending.is_empty();
        !self.started
    }

    /// A stream for a generation run with `options` (its stops and min_tokens): the bytes the
    /// tokens stand for, as the tokenizer decodes them (see [`TextStream::with_mlx_lm_spacing`]).
    pub fn new(tokenizer: &Tokenizer, options: &GenerateOptions) -> Self {
        TextStream {
            table: tokenizer.token_bytes(),
            mlx_lm: false,
            stop: options.stop.clone(),
            min_tokens: options.min_tokens,
            eos: tokenizer.eos_token_ids().to_vec(),
            ignore_eos: options.ignore_eos,
            matcher: StopMatcher::default(),
            pending: vec![],
            tokens: 0,
            stripped: 0,
            started: false,
            done: false,
        }
    }

    /// Adds a yielded token; returns the text that is now final.
    pub fn push(&mut self, id: u32) -> String {
        if self.done {
            return String::new();
        }
        // A generation never yields its stop tokens (or end-of-sequence unless ignore_eos), so
        // when one is pushed anyway it ends the text, as it ends the generation.
        if self.stop.tokens.contains(&id) || (!self.ignore_eos && self.eos.contains(&id)) {
            self.done = true;
            return take_utf8(&mut self.pending);
        }
        self.tokens += 1;
        let armed = self.tokens >= self.min_tokens;
        let matched = self.matcher.push(&self.stop, id, armed);
        self.pending.extend_from_slice(self.table.get(id));
        let mut held = false;
        if !self.started && self.mlx_lm {
            held = self.mlx_lm_start(id);
        } else if !self.started {
            while self.stripped < self.table.strip_start() && self.pending.first() == Some(&b' ') {
                self.pending.remove(0);
                self.stripped += 1;
            }
            self.started = !self.pending.is_empty();
        }
        if let Some((_, cut)) = matched {
            let keep = self.pending.len().saturating_sub(cut);
            self.pending.truncate(keep);
            self.done = true;
            return String::from_utf8_lossy(&std::mem::take(&mut self.pending)).into_owned();
        }
        if held {
            return String::new();
        }
        // Hold back the longest suffix that is a prefix of some stop string.
        let hold = self
            .stop
            .strings
            .iter()
            .map(|s| {
                (1..s.len().min(self.pending.len() + 1))
                    .rev()
                    .find(|&n| self.pending[self.pending.len() - n..] == s[..n])
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        let mut ready: Vec<u8> = self.pending.drain(..self.pending.len() - hold).collect();
        let text = take_utf8(&mut ready);
        // An incomplete character stays pending, in front of the held-back bytes.
        ready.extend_from_slice(&self.pending);
        self.pending = ready;
        text
    }

    /// The rest of the text once generation has ended without a stop string.
    pub fn finish(&mut self) -> String {
        if !self.started && self.mlx_lm && self.pending.first() == Some(&b' ') {
            self.pending.remove(0);
        }
        self.done = true;
        String::from_utf8_lossy(&std::mem::take(&mut self.pending)).into_owned()
    }
}
