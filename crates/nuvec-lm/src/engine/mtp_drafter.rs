//! The checkpoint's multi-token-prediction head as the Batcher's proposer
//! ([`crate::Batcher::with_mtp`]): each request has the head's cache of its own
//! ([`crate::speculative::MtpHead`]'s state), shown the target's hidden states of the positions
//! each step keeps (a prefill chunk's rows, a decode's row, a verified pass's pending token and
//! accepted guesses), and run over them right after the step, for every request in one pass of
//! the head. A speculating request's guesses are then chained from there, all requests' next
//! guess in one pass each. The head picks greedily, so every request hands out the tokens it gets
//! alone.
//!
//! A request whose prompt began in cached blocks (a prefix hit) was never computed there: its
//! head starts at the first position the target computed for it (see `speculative/mtp.rs`), as
//! does a preempted request's when it is prefilled again. The head never fails a request: where
//! its pass fails, the requests it serves start their heads afresh at their next positions.

use std::collections::HashMap;

use nuvec::Array;

use super::drafter::Ask;
use crate::cache::LayerCache;
use crate::models::Model;
use crate::speculative::mtp::{self, MtpState};
use crate::Result;

/// What [`crate::Batcher::record_mtp_proposals`] keeps of each proposal: the request's history,
/// the first position its head was shown, and the guesses.
pub type MtpProposal = (Vec<u32>, usize, Vec<u32>);

/// The head's state per request (by key).
pub(crate) struct MtpDrafter<'m> {
    model: &'m Model,
    states: HashMap<u64, MtpState>,
    /// Every proposal, when a test asks for them.
    recorded: Option<Vec<MtpProposal>>,
}

impl<'m> MtpDrafter<'m> {
    pub(crate) fn new(model: &'m Model) -> Self {
        MtpDrafter { model, states: HashMap::new(), recorded: None }
    }

    /// Request `key`'s kept positions `first..first + rows` after a step: the target's hidden
    /// states there. A request shown positions after a gap starts its head afresh there.
    pub(crate) fn observe(&mut self, key: u64, first: usize, hidden: &Array) {
        let model = self.model;
        let Some(state) = self.state(key) else { return };
        if state.observe(first, hidden).is_err() {
            match MtpState::new(model) {
                Ok(mut fresh) => {
                    let _ = fresh.observe(first, hidden);
                    *state = fresh;
                }
                Err(_) => self.forget(key),
            }
        }
    }

    /// Runs the head over what each of `requests` (key, history) was shown since it last ran, in
    /// one pass.
    pub(crate) fn catch_up(&mut self, requests: &[(u64, &[u32])]) {
        let histories: HashMap<u64, &[u32]> = requests.iter().copied().collect();
        let mut inputs: HashMap<u64, (Vec<u32>, Array)> = HashMap::new();
        let mut dropped = vec![];
        for (&key, state) in self.states.iter_mut() {
            let Some(history) = histories.get(&key) else { continue };
            match state.catch_up_input(history) {
                Ok(Some(input)) => {
                    inputs.insert(key, input);
                }
                Ok(None) => {}
                Err(_) => dropped.push(key),
            }
        }
        dropped.into_iter().for_each(|k| self.forget(k));
        if inputs.is_empty() {
            return;
        }
        // Run in key order: the heads' rows stacked the same way.
        let mut order: Vec<u64> = inputs.keys().copied().collect();
        order.sort_unstable();
        let tokens: Vec<&[u32]> = order.iter().map(|k| inputs[k].0.as_slice()).collect();
        let targets: Vec<Array> = order.iter().map(|k| inputs[k].1.clone()).collect();
        let result = crate::step::concat_rows(&targets).and_then(|t| self.run_heads(&order, &tokens, &t));
        let Ok(out) = result else {
            order.into_iter().for_each(|k| self.forget(k));
            return;
        };
        let mut at = 0;
        for key in order {
            let n = inputs[&key].0.len();
            let rows = out.slice_rows(at, at + n);
            at += n;
            let state = self.states.get_mut(&key).expect("ran above");
            if rows.map_err(Into::into).and_then(|r| state.caught_up(&r, histories[&key])).is_err() {
                self.forget(key);
            }
        }
    }

    /// Up to `room` greedy guesses for each ask, from heads that have caught up with its history.
    pub(crate) fn propose(&mut self, asks: &[Ask]) -> Vec<Vec<u32>> {
        let mut out = vec![vec![]; asks.len()];
        self.catch_up(&asks.iter().map(|&(k, h, _)| (k, h)).collect::<Vec<_>>());
        // (ask, its head's last output) for the heads ready to guess.
        let mut going: Vec<(usize, Array)> = vec![];
        for (i, &(key, history, room)) in asks.iter().enumerate() {
            let ready = self.states.get(&key).filter(|s| room > 0 && s.follows(history)).and_then(|s| s.ready(history));
            if let Some(h) = ready {
                going.push((i, h.clone()));
            }
        }
        let most = going.iter().map(|&(i, _)| asks[i].2).max().unwrap_or(0);
        for n in 0..most {
            going.retain(|&(i, _)| asks[i].2 > n);
            if going.is_empty() {
                break;
            }
            let guessed = match n {
                0 => self.first_guesses(&going),
                _ => self.next_guesses(asks, &going, &out),
            };
            match guessed {
                Ok(rows) => {
                    for ((i, h), (g, row)) in going.iter_mut().zip(rows) {
                        out[*i].push(g);
                        *h = row;
                    }
                }
                // The guesses made so far stand; their heads are trimmed back at the next step.
                Err(_) => break,
            }
        }
        if let Some(recorded) = &mut self.recorded {
            for (i, &(key, history, _)) in asks.iter().enumerate() {
                if let (false, Some(base)) = (out[i].is_empty(), self.states.get(&key).and_then(MtpState::base)) {
                    recorded.push((history.to_vec(), base, out[i].clone()));
                }
            }
        }
        out
    }

    /// The first guess of each going head, from its last output (kept as the row it came from).
    fn first_guesses(&self, going: &[(usize, Array)]) -> Result<Vec<(u32, Array)>> {
        let rows: Vec<Array> = going.iter().map(|(_, h)| h.clone()).collect();
        let guesses = mtp::guesses(self.model, &crate::step::concat_rows(&rows)?)?;
        Ok(guesses.into_iter().zip(rows).collect())
    }

    /// The next guess of each going head: the head run once more on its last guess.
    fn next_guesses(&mut self, asks: &[Ask], going: &[(usize, Array)], out: &[Vec<u32>]) -> Result<Vec<(u32, Array)>> {
        let keys: Vec<u64> = going.iter().map(|&(i, _)| asks[i].0).collect();
        let last: Vec<[u32; 1]> = going.iter().map(|&(i, _)| [*out[i].last().expect("guessed")]).collect();
        let tokens: Vec<&[u32]> = last.iter().map(|t| t.as_slice()).collect();
        let target = crate::step::concat_rows(&going.iter().map(|(_, h)| h.clone()).collect::<Vec<_>>())?;
        let h = self.run_heads(&keys, &tokens, &target)?;
        let guesses = mtp::guesses(self.model, &h)?;
        (0..going.len()).map(|j| Ok((guesses[j], h.slice_rows(j, j + 1)?))).collect()
    }

    /// Runs the heads of `keys` once, in that order, over `tokens[j]` each, `target` holding all
    /// their rows in the same order: every row's output.
    fn run_heads(&mut self, keys: &[u64], tokens: &[&[u32]], target: &Array) -> Result<Array> {
        let at: HashMap<u64, usize> = keys.iter().enumerate().map(|(j, &k)| (k, j)).collect();
        let mut caches: Vec<Option<&mut [LayerCache]>> = (0..keys.len()).map(|_| None).collect();
        for (key, state) in self.states.iter_mut() {
            if let Some(&j) = at.get(key) {
                caches[j] = Some(state.cache());
            }
        }
        let mut work = Vec::with_capacity(keys.len());
        for (t, cache) in tokens.iter().zip(caches) {
            work.push((*t, cache.expect("every key has a head")));
        }
        mtp::run(self.model, &mut work, target)
    }

    /// The state of request `key`, made when it has none.
    fn state(&mut self, key: u64) -> Option<&mut MtpState> {
        if !self.states.contains_key(&key) {
            self.states.insert(key, MtpState::new(self.model).ok()?);
        }
        self.states.get_mut(&key)
    }

    /// Drops request `key`'s head (it ended, or was preempted).
    pub(crate) fn forget(&mut self, key: u64) {
        self.states.remove(&key);
    }

    /// Keeps every proposal from now on ([`crate::Batcher::record_mtp_proposals`]).
    pub(crate) fn record(&mut self) {
        self.recorded.get_or_insert_with(Vec::new);
    }

    pub(crate) fn recorded(&self) -> &[MtpProposal] {
        self.recorded.as_deref().unwrap_or(&[])
    }
}
