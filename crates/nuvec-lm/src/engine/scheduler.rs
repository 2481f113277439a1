//! What each step computes: bookkeeping only (token counts and blocks), no tensors, so it is
//! tested without a model.
//!
//! Every step first gives each running request, in the order they were admitted, its next
//! rows: a prefill chunk of the tokens it has not computed, or its one last token, whose logits
//! give the next token. Then, while slots, blocks and the token budget allow, it admits waiting
//! requests in order. Chunks are cut on a grid of the request's own (`chunk` tokens, then the
//! last token alone, as `generate` does), so what a request computes in which pass never depends
//! on what it is batched with; a chunk that does not fit the step's remaining budget waits for
//! the next step instead of being split. When the blocks run out, the most recently admitted
//! request is preempted: its blocks are freed and it waits again at the front of the queue, to
//! be prefilled afresh with the tokens it has produced (vLLM's recompute preemption).
//!
//! With speculation on, a step that only decodes, for few enough requests, also gives each
//! decode room for guessed rows after its last token, where the budget and the free blocks
//! allow (`engine/speculation.rs`); the guesses that turn out wrong are trimmed after the step.
//!
//! Blocks are counted through a [`BlockView`] of the cache: what is free, what a preempted
//! request would free (blocks it shares with others stay), and how much of a waiting request's
//! tokens a prefix hit would give it.

use std::collections::VecDeque;

/// A request as the scheduler sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Key(pub u64);

#[derive(Debug, Clone)]
struct Tracked {
    key: Key,
    /// Tokens known: the prompt and every sampled token.
    known: usize,
    /// Tokens in the cache.
    computed: usize,
    /// Prefill rows per pass.
    chunk: usize,
}

/// Rows of one request in a step: its tokens `start..end`; the step's logits for it sample
/// the next token when `end` is every token it knows. A decode may add up to `draft` guessed
/// rows after them (speculation; 0 otherwise), for which the step holds budget and blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Work {
    pub key: Key,
    pub start: usize,
    pub end: usize,
    pub samples: bool,
    pub draft: usize,
}

/// One step's decisions, in the order the caller applies them: preempted requests lose their
/// cache, requests that can never fit end with `CacheFull`, admitted ones get a cache, then
/// `work` runs.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    pub preempted: Vec<Key>,
    pub cache_full: Vec<Key>,
    pub admitted: Vec<Key>,
    pub work: Vec<Work>,
}

/// What the scheduler asks of the cache's blocks.
pub(crate) trait BlockView {
    /// Blocks no request holds.
    fn free(&self) -> usize;
    /// Blocks that dropping request `key`'s cache would free.
    fn exclusive(&self, key: Key) -> usize;
    /// For waiting request `key`: the positions a prefix hit gives it (whole blocks), and how
    /// many of those blocks are free now (the hit takes them out of the free count).
    fn prefix(&self, key: Key) -> (usize, usize);
    /// Whether waiting request `key`, whose prefix hit gives it `cached` positions now, would
    /// get a longer one once one of the `running` requests (each with the positions it has
    /// computed) has computed blocks they share: it then waits for them instead of computing the
    /// same blocks beside it.
    fn shares_pending(&self, key: Key, cached: usize, running: &[(Key, usize)]) -> bool;
}

/// The queues and the block count.
#[derive(Debug)]
pub(crate) struct Scheduler {
    block_size: usize,
    total_blocks: usize,
    max_running: usize,
    token_budget: usize,
    /// Guessed rows per decode and the most decodes a speculating step has (`None`: off).
    speculation: Option<(usize, usize)>,
    waiting: VecDeque<Tracked>,
    /// In admission order.
    running: Vec<Tracked>,
}

impl Scheduler {
    pub(crate) fn new(block_size: usize, total_blocks: usize, max_running: usize, token_budget: usize) -> Self {
        let (waiting, running) = (VecDeque::new(), vec![]);
        Scheduler { block_size, total_blocks, max_running, token_budget, speculation: None, waiting, running }
    }

    /// Gives decodes room for `rows` guessed rows in steps of at most `max_decodes` decodes and
    /// nothing else.
    pub(crate) fn set_speculation(&mut self, rows: usize, max_decodes: usize) {
        self.speculation = Some((rows, max_decodes));
    }

    /// Blocks that `positions` positions occupy.
    pub(crate) fn blocks_for(&self, positions: usize) -> usize {
        positions.div_ceil(self.block_size)
    }

    /// Queues a request knowing `known` tokens, prefilled `chunk` rows per pass.
    pub(crate) fn add(&mut self, key: Key, known: usize, chunk: usize) {
        self.waiting.push_back(Tracked { key, known, computed: 0, chunk: chunk.max(1) });
    }

    /// Forgets a request (finished or cancelled); its blocks count as free at once.
    pub(crate) fn remove(&mut self, key: Key) {
        self.waiting.retain(|t| t.key != key);
        self.running.retain(|t| t.key != key);
    }

    /// Whether any request is waiting or running.
    #[cfg(test)]
    pub(crate) fn is_busy(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Requests waiting and running.
    pub(crate) fn counts(&self) -> (usize, usize) {
        (self.waiting.len(), self.running.len())
    }

    /// Records a step that ran `work` and sampled `sampled` tokens for it (0 for a prefill
    /// chunk, 1 for a decode, 1 + the right guesses for a speculating decode, whose cache keeps
    /// those guesses): its rows are in the cache, and it knows the tokens sampled (a request that
    /// ended is removed instead).
    pub(crate) fn ran(&mut self, work: &Work, sampled: usize) {
        if let Some(t) = self.running.iter_mut().find(|t| t.key == work.key) {
            t.computed = work.end + sampled.saturating_sub(1);
            t.known += sampled;
        }
    }

    /// The rows `t` computes next: a chunk of its uncomputed tokens but the last, or the last.
    fn next_rows(t: &Tracked) -> (usize, usize) {
        let last = t.known - 1;
        if t.computed < last {
            (t.computed, (t.computed + t.chunk).min(last))
        } else {
            (t.computed, t.known)
        }
    }

    /// Decides the next step.
    pub(crate) fn plan(&mut self, blocks: &dyn BlockView) -> Plan {
        let mut plan = Plan::default();
        let mut budget = self.token_budget;
        let mut free = blocks.free();
        let mut i = 0;
        while i < self.running.len() {
            let t = self.running[i].clone();
            let (start, end) = Self::next_rows(&t);
            let rows = end - start;
            if rows > budget {
                i += 1;
                continue;
            }
            let need = self.blocks_for(end) - self.blocks_for(start);
            if self.blocks_for(end) > self.total_blocks {
                let t = self.running.remove(i);
                free += blocks.exclusive(t.key);
                plan.cache_full.push(t.key);
                continue;
            }
            // Preempt from the most recently admitted until `t` fits (possibly `t` itself).
            while need > free {
                let victim = self.running.pop().expect("t itself is running");
                free += blocks.exclusive(victim.key);
                plan.preempted.push(victim.key);
                let is_t = self.running.len() == i;
                self.waiting.push_front(Tracked { computed: 0, ..victim });
                if is_t {
                    break;
                }
            }
            if i >= self.running.len() {
                break;
            }
            free -= need;
            budget -= rows;
            plan.work.push(Work { key: t.key, start, end, samples: end == t.known, draft: 0 });
            i += 1;
        }
        // No admission in a step that had to preempt: the freed blocks go to the running. In
        // order, but a request waiting for a prefix that a running one is computing lets the
        // ones behind it go first.
        let mut at = 0;
        let mut running: Vec<(Key, usize)> = self.running.iter().map(|r| (r.key, r.computed)).collect();
        while plan.preempted.is_empty() && self.running.len() < self.max_running {
            let Some(t) = self.waiting.get(at) else { break };
            if self.blocks_for(t.known) > self.total_blocks {
                let t = self.waiting.remove(at).expect("just seen");
                plan.cache_full.push(t.key);
                continue;
            }
            let (cached, revived) = blocks.prefix(t.key);
            if blocks.shares_pending(t.key, cached, &running) {
                at += 1;
                continue;
            }
            let (start, end) = Self::next_rows(&Tracked { computed: cached, ..t.clone() });
            let need = self.blocks_for(end) - self.blocks_for(start) + revived;
            if end - start > budget || need > free {
                break;
            }
            let mut t = self.waiting.remove(at).expect("just seen");
            t.computed = cached;
            free -= need;
            budget -= end - start;
            plan.admitted.push(t.key);
            plan.work.push(Work { key: t.key, start, end, samples: end == t.known, draft: 0 });
            running.push((t.key, t.computed));
            self.running.push(t);
        }
        self.give_draft_room(&mut plan, budget, free);
        plan
    }

    /// With speculation on, in a step of only decodes (none preempted, at most the set number):
    /// each decode, in order, gets room for the guessed rows where the remaining `budget` and
    /// `free` blocks hold them (and the whole cache does).
    fn give_draft_room(&self, plan: &mut Plan, mut budget: usize, mut free: usize) {
        let Some((rows, most)) = self.speculation else { return };
        let decodes_only = plan.work.iter().all(|w| w.samples && w.end - w.start == 1);
        if !decodes_only || !plan.preempted.is_empty() || plan.work.len() > most {
            return;
        }
        for w in &mut plan.work {
            let need = self.blocks_for(w.end + rows) - self.blocks_for(w.end);
            if rows <= budget && need <= free && self.blocks_for(w.end + rows) <= self.total_blocks {
                w.draft = rows;
                budget -= rows;
                free -= need;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks as a cache without sharing holds them: each running request its own.
    struct Own(Vec<(Key, usize)>, usize);

    impl Own {
        fn of(s: &Scheduler) -> Self {
            let held: Vec<(Key, usize)> = s.running.iter().map(|t| (t.key, s.blocks_for(t.computed))).collect();
            let used: usize = held.iter().map(|h| h.1).sum();
            Own(held, s.total_blocks - used)
        }
    }

    impl BlockView for Own {
        fn free(&self) -> usize {
            self.1
        }
        fn exclusive(&self, key: Key) -> usize {
            self.0.iter().find(|h| h.0 == key).map_or(0, |h| h.1)
        }
        fn prefix(&self, _: Key) -> (usize, usize) {
            (0, 0)
        }
        fn shares_pending(&self, _: Key, _: usize, _: &[(Key, usize)]) -> bool {
            false
        }
    }

    fn plan(s: &mut Scheduler) -> Plan {
        let view = Own::of(s);
        s.plan(&view)
    }

    /// Runs plans until every request has `max` tokens, as the Batcher would with requests that
    /// never end early; returns every plan.
    fn drive(s: &mut Scheduler, max: &[(Key, usize)], steps: usize) -> Vec<Plan> {
        let mut plans = vec![];
        for _ in 0..steps {
            if !s.is_busy() {
                break;
            }
            let p = plan(s);
            for w in &p.work {
                let known = s.running.iter().find(|t| t.key == w.key).unwrap().known;
                let limit = max.iter().find(|(k, _)| *k == w.key).unwrap().1;
                if w.samples && known + 1 > limit {
                    s.remove(w.key);
                } else {
                    s.ran(w, usize::from(w.samples));
                }
            }
            for k in &p.cache_full {
                s.remove(*k);
            }
            plans.push(p);
        }
        plans
    }

    #[test]
    fn prompts_are_chunked_on_their_own_grid_with_the_last_token_alone() {
        let mut s = Scheduler::new(16, 100, 4, 64);
        s.add(Key(1), 70, 32);
        let first = plan(&mut s);
        assert_eq!(first.admitted, vec![Key(1)]);
        assert_eq!(first.work, vec![Work { key: Key(1), start: 0, end: 32, samples: false, draft: 0 }]);
        s.ran(&first.work[0], 0);
        let w: Vec<_> = (0..3)
            .map(|_| {
                let p = plan(&mut s);
                s.ran(&p.work[0], usize::from(p.work[0].samples));
                (p.work[0].start, p.work[0].end, p.work[0].samples)
            })
            .collect();
        assert_eq!(w, vec![(32, 64, false), (64, 69, false), (69, 70, true)]);
        let p = plan(&mut s);
        assert_eq!(p.work, vec![Work { key: Key(1), start: 70, end: 71, samples: true, draft: 0 }]);
    }

    #[test]
    fn a_chunk_that_does_not_fit_the_budget_waits_whole() {
        // Budget 40: two decodes (2 rows) leave 38, so a 39-row chunk waits; alone it runs.
        let mut s = Scheduler::new(16, 100, 4, 40);
        s.add(Key(1), 1, 39);
        s.add(Key(2), 1, 39);
        let p = plan(&mut s);
        assert_eq!(p.admitted, vec![Key(1), Key(2)]);
        for w in &p.work {
            s.ran(w, 1);
        }
        s.add(Key(3), 40, 39);
        let p = plan(&mut s);
        assert_eq!(p.admitted, Vec::<Key>::new());
        assert_eq!(p.work.len(), 2);
        s.remove(Key(1));
        s.remove(Key(2));
        let p = plan(&mut s);
        assert_eq!(p.work, vec![Work { key: Key(3), start: 0, end: 39, samples: false, draft: 0 }]);
    }

    #[test]
    fn blocks_running_out_preempt_the_most_recently_admitted() {
        // 4 blocks of 4 positions; two requests of 7 prompt tokens take 2 blocks each.
        let mut s = Scheduler::new(4, 4, 4, 64);
        s.add(Key(1), 7, 64);
        s.add(Key(2), 7, 64);
        let plans = drive(&mut s, &[(Key(1), 12), (Key(2), 12)], 40);
        let preempted: Vec<Key> = plans.iter().flat_map(|p| p.preempted.clone()).collect();
        assert!(!preempted.is_empty(), "the pool is too small for both to finish together");
        assert!(preempted.iter().all(|&k| k == Key(2)), "the later request goes: {preempted:?}");
        assert!(plans.iter().all(|p| p.cache_full.is_empty()));
        assert!(!s.is_busy(), "both finished");
        // Blocks never overcommitted: every plan's rows fit the pool.
        assert!(plans.iter().all(|p| p.work.iter().all(|w| w.end <= 16)));
    }

    #[test]
    fn a_request_outgrowing_the_whole_cache_ends_cache_full() {
        let mut s = Scheduler::new(4, 2, 2, 64);
        s.add(Key(1), 3, 64);
        let plans = drive(&mut s, &[(Key(1), 100)], 40);
        let full: Vec<Key> = plans.iter().flat_map(|p| p.cache_full.clone()).collect();
        assert_eq!(full, vec![Key(1)]);
        // It got to 8 positions (the whole cache) before.
        let last = plans.iter().flat_map(|p| p.work.clone()).last().unwrap();
        assert_eq!(last.end, 8);
    }

    /// Blocks as [`Own`] counts them, where request 2 shares request 1's prefix until request 1
    /// has computed 32 positions.
    struct Sharing(Own);

    impl BlockView for Sharing {
        fn free(&self) -> usize {
            self.0.free()
        }
        fn exclusive(&self, key: Key) -> usize {
            self.0.exclusive(key)
        }
        fn prefix(&self, _: Key) -> (usize, usize) {
            (0, 0)
        }
        fn shares_pending(&self, key: Key, _: usize, running: &[(Key, usize)]) -> bool {
            key == Key(2) && running.iter().any(|&(k, computed)| k == Key(1) && computed < 32)
        }
    }

    #[test]
    fn a_request_waits_for_a_shared_prefix_being_computed_and_lets_others_pass() {
        let mut s = Scheduler::new(16, 100, 4, 1000);
        for k in 1..=3 {
            s.add(Key(k), 40, 16);
        }
        let p = s.plan(&Sharing(Own::of(&s)));
        assert_eq!(p.admitted, vec![Key(1), Key(3)], "2 waits for 1's blocks; 3 goes past it");
        for w in &p.work {
            s.ran(w, 0);
        }
        let p = s.plan(&Sharing(Own::of(&s)));
        assert_eq!(p.admitted, Vec::<Key>::new(), "1 has computed 16 of the 32");
        for w in &p.work {
            s.ran(w, 0);
        }
        let p = s.plan(&Sharing(Own::of(&s)));
        assert_eq!(p.admitted, vec![Key(2)]);
    }

    #[test]
    fn only_steps_of_few_decodes_get_room_for_guesses() {
        let mut s = Scheduler::new(4, 100, 4, 64);
        s.set_speculation(3, 2);
        s.add(Key(1), 5, 64);
        let p = plan(&mut s);
        assert_eq!(p.work[0].draft, 0, "a prefill chunk: no guesses");
        s.ran(&p.work[0], 0);
        let p = plan(&mut s);
        assert_eq!(p.work, vec![Work { key: Key(1), start: 4, end: 5, samples: true, draft: 3 }]);
        // Two guesses right: three tokens known more, the last token and both guesses cached.
        s.ran(&p.work[0], 3);
        let p = plan(&mut s);
        assert_eq!((p.work[0].start, p.work[0].end), (7, 8));
        s.ran(&p.work[0], 1);
        // A waiting prompt is admitted with a prefill chunk: that step guesses nothing.
        s.add(Key(2), 5, 64);
        let p = plan(&mut s);
        assert!(p.work.iter().all(|w| w.draft == 0), "{p:?}");
        for w in &p.work {
            s.ran(w, usize::from(w.samples));
        }
        // Three decodes are more than the two a speculating step takes.
        s.add(Key(3), 1, 64);
        let p = plan(&mut s);
        assert_eq!(p.work.len(), 3);
        assert!(p.work.iter().all(|w| w.draft == 0), "{p:?}");
    }

    #[test]
    fn guesses_take_only_the_blocks_that_are_free() {
        // Blocks of 4: the decode of position 7 fills 2 blocks; 3 guesses (positions 8 to 10)
        // need a third, which a pool of 3 has free and a pool of 2 has not.
        let mut s = Scheduler::new(4, 3, 4, 64);
        s.set_speculation(3, 8);
        s.add(Key(1), 8, 64);
        let p = plan(&mut s);
        s.ran(&p.work[0], 0);
        assert_eq!(plan(&mut s).work[0].draft, 3);
        let mut s = Scheduler::new(4, 2, 4, 64);
        s.set_speculation(3, 8);
        s.add(Key(1), 8, 64);
        let p = plan(&mut s);
        s.ran(&p.work[0], 0);
        assert_eq!(plan(&mut s).work[0].draft, 0);
    }

    #[test]
    fn slots_bound_the_running_set_and_admission_is_in_order() {
        let mut s = Scheduler::new(16, 100, 2, 1000);
        for k in 1..=4 {
            s.add(Key(k), 5, 64);
        }
        let p = plan(&mut s);
        assert_eq!(p.admitted, vec![Key(1), Key(2)]);
        s.remove(Key(1));
        let p = plan(&mut s);
        assert_eq!(p.admitted, vec![Key(3)]);
        assert_eq!(s.counts(), (1, 2));
    }
}
