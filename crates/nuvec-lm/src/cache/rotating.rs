//! The rotating cache behind `max_kv_size` (mlx-lm's `RotatingKVCache`): at most `max_size`
//! positions, the first `keep` of them pinned, the rest a ring. Its semantics — which keys a
//! prefill chunk sees, how a chunk longer than the window is trimmed — follow mlx-lm's exactly,
//! so that generation crosses the wrap with mlx-lm's tokens. Unlike mlx-lm's, `trim` never
//! silently trims less: once the ring has wrapped the old positions are gone and it says so.

use nuvec::{Array, DType};

use super::ops::{attend_causal, attend_pinned_window, attend_windowed, on_device_of, Sinks};
use super::store::Store;
use crate::{Error, Result};

/// Positions added at a time while the ring grows to its size (mlx-lm's step).
const STEP: usize = 256;

/// A bounded cache of keys and values, held as `S` (f32 arrays, or quantized rows: the
/// quantized rotating cache mlx-lm refuses to build).
#[derive(Debug, Clone)]
pub struct RotatingKvCache<S: Store = Array> {
    keys: Option<S>,
    values: Option<S>,
    context: S::Context,
    /// Positions seen in total.
    offset: usize,
    /// Next write position in the buffer.
    idx: usize,
    max_size: usize,
    keep: usize,
    /// Rows of a pass that speculative decoding may take back (0: none); see
    /// [`RotatingKvCache::keep_rewind`].
    rewind: usize,
    /// One-position steps that can be taken back (0: none); see [`RotatingKvCache::keep_steps`].
    steps: usize,
    /// What the last one-position steps (at most `steps`) overwrote, newest last.
    undo: Vec<Undo<S>>,
}

/// What one one-position step changed, to put back when speculative decoding takes its
/// position back (a draft model's rejected guess, decoded into the ring in place).
#[derive(Debug, Clone)]
enum Undo<S> {
    /// It wrote slot `at`: the keys and values it held, and the counters before.
    Slot { at: usize, keys: S, values: S, counters: (usize, usize) },
    /// It first grew the buffers or cut them to the window: the buffers as they were.
    Whole { keys: Option<S>, values: Option<S>, counters: (usize, usize) },
}

impl RotatingKvCache<Array> {
    /// An empty cache of at most `max_size` positions, the first `keep` never evicted, in f32.
    pub fn new(max_size: usize, keep: usize) -> Result<Self> {
        RotatingKvCache::with_context(max_size, keep, DType::F32)
    }
}

impl<S: Store> RotatingKvCache<S> {
    /// The most positions it holds and how many of the first it pins.
    pub fn window(&self) -> (usize, usize) {
        (self.max_size, self.keep)
    }

    /// An empty cache storing positions as `S` made with `context`.
    pub fn with_context(max_size: usize, keep: usize, context: S::Context) -> Result<Self> {
        if max_size == 0 || keep >= max_size {
            return Err(Error::Invalid(format!("max_kv_size = {max_size} must exceed the {keep} kept positions")));
        }
        Ok(RotatingKvCache {
            keys: None,
            values: None,
            context,
            offset: 0,
            idx: 0,
            max_size,
            keep,
            rewind: 0,
            steps: 0,
            undo: vec![],
        })
    }

    /// The same ring with its positions converted to another store (quantized, say).
    pub fn convert<T: Store>(&self, context: T::Context) -> Result<RotatingKvCache<T>> {
        let to = |s: &Option<S>| -> Result<Option<T>> {
            s.as_ref().map(|s| T::ingest(&s.to_array()?, &context)).transpose()
        };
        Ok(RotatingKvCache {
            keys: to(&self.keys)?,
            values: to(&self.values)?,
            context: context.clone(),
            offset: self.offset,
            idx: self.idx,
            max_size: self.max_size,
            keep: self.keep,
            rewind: self.rewind,
            steps: self.steps,
            undo: vec![],
        })
    }

    /// Has passes of at most `n + 1` rows (speculative verifications, up to `n` of whose
    /// positions may be taken back) attend as that many one-token steps would: each row sees the
    /// pinned positions and the newest `max_size - keep`. mlx-lm's mask for a pass of several
    /// rows, which prefill chunks keep, slides its window over the pinned positions too; without
    /// pinned positions the two are the same.
    pub fn keep_rewind(&mut self, n: usize) {
        self.rewind = n;
    }

    /// Makes the last `n` one-position steps (a draft model's guesses, decoded into the ring in
    /// place) possible to take back: each keeps what it overwrote. Off by default, so a cache
    /// that never takes a step back (a verifying target's) copies nothing per step.
    pub fn keep_steps(&mut self, n: usize) {
        self.steps = n;
        let extra = self.undo.len().saturating_sub(n);
        self.undo.drain(..extra);
    }

    /// Positions seen in total (not all of them are still held once the ring wraps).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Removes exactly the last `n` positions, or errors leaving the cache unchanged. Before the
    /// ring fills every position is still held. Past that, the positions of the last pass of
    /// several rows can be taken back (the window those rows saw is still there, in order, as
    /// speculative decoding needs), unless the ring has been written in place since; older ones
    /// are gone.
    pub fn trim(&mut self, n: usize) -> Result<()> {
        if let Some(why) = self.cannot_trim(n) {
            return Err(Error::Invalid(why));
        }
        if n > 0 && n <= self.undo.len() {
            for _ in 0..n {
                let counters = match self.undo.pop().expect("counted") {
                    Undo::Slot { at, keys, values, counters } => {
                        self.keys.as_mut().expect("a step wrote it").write(&keys, at)?;
                        self.values.as_mut().expect("a step wrote it").write(&values, at)?;
                        counters
                    }
                    Undo::Whole { keys, values, counters } => {
                        (self.keys, self.values) = (keys, values);
                        counters
                    }
                };
                (self.offset, self.idx) = counters;
            }
            return Ok(());
        }
        self.undo.clear();
        if self.offset >= self.max_size && n > 0 {
            let len = self.buffer_len() - n;
            for buffer in [&mut self.keys, &mut self.values] {
                let held = buffer.take().expect("a cache past its window holds positions");
                *buffer = Some(held.slice(0, len)?);
            }
        }
        self.offset -= n;
        self.idx -= n;
        Ok(())
    }

    /// Whether `trim(n)` would succeed.
    pub fn can_trim(&self, n: usize) -> bool {
        self.cannot_trim(n).is_none()
    }

    /// Why `trim(n)` would fail, if it would.
    fn cannot_trim(&self, n: usize) -> Option<String> {
        if n > self.offset {
            return Some(format!("cannot trim {n} positions from a cache holding {}", self.offset));
        }
        if n == 0 || self.offset < self.max_size || n <= self.undo.len() {
            return None;
        }
        // In temporal order (idx at the end) and still holding a full window after the cut —
        // what the positions before the cut left, exactly.
        let len = self.buffer_len();
        let left = self.offset - n;
        if self.idx == len && len >= n + left.min(self.max_size) {
            return None;
        }
        Some(format!(
            "cannot trim {n} positions from a rotating cache of {} positions after it wrapped (it has seen {}): \
             only a multi-row pass's last positions, or the last one-position steps kept by keep_steps, can be \
             taken back",
            self.max_size, self.offset
        ))
    }

    fn buffer_len(&self) -> usize {
        self.keys.as_ref().map_or(0, |k| k.len())
    }

    /// mlx-lm's `_temporal_order`: the ring unrolled oldest first, unused tail cut.
    fn temporal(&self, v: &S) -> Result<S> {
        let len = v.len();
        if self.idx == len {
            Ok(v.clone())
        } else if self.idx < self.offset {
            S::concat(&[v.slice(0, self.keep)?, v.slice(self.idx, len)?, v.slice(self.keep, self.idx)?])
        } else {
            v.slice(0, self.idx)
        }
    }

    /// mlx-lm's `_trim`: drops `n` positions after the kept ones, then appends `append`.
    fn trimmed(&self, v: &S, n: usize, append: Option<&S>) -> Result<S> {
        let mut parts =
            if n > 0 { vec![v.slice(0, self.keep)?, v.slice(n + self.keep, v.len())?] } else { vec![v.clone()] };
        parts.extend(append.cloned());
        S::concat(&parts)
    }

    /// Adds `keys, values [kv_heads, L, head_dim]` and attends `q [L, heads, head_dim]` over what
    /// the cache holds, with mlx-lm's mask for this cache: a causal window of `max_size` over a
    /// chunk, everything held for a single token.
    pub fn attend(&mut self, q: &Array, keys: &Array, values: &Array, scale: f32) -> Result<Array> {
        self.attend_with_sinks(q, keys, values, scale, None)
    }

    /// [`RotatingKvCache::attend`] with a sink logit per query head joining each softmax.
    pub fn attend_with_sinks(
        &mut self,
        q: &Array,
        keys: &Array,
        values: &Array,
        scale: f32,
        sinks: Sinks,
    ) -> Result<Array> {
        let l = keys.dim(1);
        let (keys, values) = (S::ingest(keys, &self.context)?, S::ingest(values, &self.context)?);
        if l > 1 {
            self.update_concat(&keys, &values)?;
        } else {
            self.update_in_place(&keys, &values)?;
        }
        self.attend_held_with_sinks(q, scale, sinks)
    }

    /// Attends `q [L, heads, head_dim]`, the queries of the last `L` positions added, over what
    /// the cache holds, with the mask [`RotatingKvCache::attend`] gave them when it added them.
    /// ([`RotatingKvCache::attend`] is the update followed by this; Gemma 4's KV-shared layers
    /// call it alone, attending over an earlier layer's keys and values.)
    pub fn attend_held(&self, q: &Array, scale: f32) -> Result<Array> {
        self.attend_held_with_sinks(q, scale, None)
    }

    /// [`RotatingKvCache::attend_held`] with a sink logit per query head joining each softmax.
    pub fn attend_held_with_sinks(&self, q: &Array, scale: f32, sinks: Sinks) -> Result<Array> {
        let l = q.dim(0);
        let (Some(k), Some(v)) = (&self.keys, &self.values) else {
            return Err(Error::Invalid("attending over an empty rotating cache".into()));
        };
        if l == 0 || l > self.offset {
            return Err(Error::Invalid(format!("{l} queries for a rotating cache that has seen {}", self.offset)));
        }
        let (k, v) = (k.to_array()?, v.to_array()?);
        if l > 1 {
            // mlx-lm builds the mask before the update, from the positions held then.
            let held_before = (self.offset - l).min(self.max_size - 1);
            if held_before + l > self.max_size && self.keep > 0 && l <= self.rewind + 1 {
                attend_pinned_window(q, &k, &v, held_before, (self.keep, self.max_size - self.keep), scale, sinks)
            } else if held_before + l > self.max_size {
                attend_windowed(q, &k, &v, held_before, self.max_size, scale, sinks)
            } else {
                attend_causal(q, &k, &v, scale, sinks)
            }
        } else {
            // One query over every slot held, in ring order (a softmax over keys whose order
            // does not matter), as a ring (a CUDA graph of the step replays it).
            let n = self.offset.min(k.dim(1));
            let (k, v) = on_device_of(q, &k, &v)?;
            Ok(nuvec::attention_ring(q, &k, &v, n, scale, sinks)?)
        }
    }

    fn update_concat(&mut self, keys: &S, values: &S) -> Result<()> {
        self.undo.clear();
        match (self.keys.take(), self.values.take()) {
            (Some(k), Some(v)) => {
                let (k, v) = (self.temporal(&k)?, self.temporal(&v)?);
                self.idx = k.len();
                // At most max_size - 1 old positions stay, so every new one sees max_size.
                let trim = (self.idx + 1).saturating_sub(self.max_size);
                self.keys = Some(self.trimmed(&k, trim, Some(keys))?);
                self.values = Some(self.trimmed(&v, trim, Some(values))?);
            }
            _ => {
                self.keys = Some(keys.clone());
                self.values = Some(values.clone());
            }
        }
        self.offset += keys.len();
        self.idx = self.buffer_len();
        Ok(())
    }

    fn update_in_place(&mut self, keys: &S, values: &S) -> Result<()> {
        let prev = self.offset;
        let len = self.buffer_len();
        let grows = self.keys.is_none() || (prev >= len && len < self.max_size);
        // A step that may be taken back keeps what it changes: the buffers when it replaces
        // them (growing, or cutting a multi-row pass's to the window), else the slot it writes.
        let before = (self.offset, self.idx);
        let mut undo = (self.steps > 0 && (grows || len > self.max_size)).then(|| Undo::Whole {
            keys: self.keys.clone(),
            values: self.values.clone(),
            counters: before,
        });
        if grows {
            let grow = STEP.min(self.max_size - prev);
            let zeros = |like: &S| -> Result<S> {
                let a = like.to_array()?;
                S::ingest(&Array::zeros_on(&[a.dim(0), grow, a.dim(2)], a.dtype(), a.device())?, &self.context)
            };
            let (fresh_k, fresh_v) = (zeros(keys)?, zeros(values)?);
            for (buffer, fresh) in [(&mut self.keys, fresh_k), (&mut self.values, fresh_v)] {
                *buffer = Some(match buffer.take() {
                    Some(old) => S::concat(&[old, fresh])?,
                    None => fresh,
                });
            }
            self.idx = prev;
        }
        let len = self.buffer_len();
        if len > self.max_size {
            let trim = len - self.max_size;
            let (k, v) = (self.keys.take().expect("set"), self.values.take().expect("set"));
            self.keys = Some(self.trimmed(&k, trim, None)?);
            self.values = Some(self.trimmed(&v, trim, None)?);
            self.idx = self.max_size;
        }
        let at = self.next_slot();
        if self.steps > 0 && undo.is_none() {
            let (k, v) = (self.keys.as_ref().expect("set"), self.values.as_ref().expect("set"));
            undo = Some(Undo::Slot { at, keys: k.position(at)?, values: v.position(at)?, counters: before });
        }
        self.keys.as_mut().expect("set").write_ring(keys, at, self.keep)?;
        self.values.as_mut().expect("set").write_ring(values, at, self.keep)?;
        self.offset += 1;
        self.idx += 1;
        if let Some(u) = undo {
            if self.undo.len() == self.steps {
                self.undo.remove(0);
            }
            self.undo.push(u);
        }
        Ok(())
    }

    /// The slot a one-position step writes: the next, or back to the first unpinned one at the
    /// ring's end.
    fn next_slot(&mut self) -> usize {
        if self.idx == self.max_size {
            self.idx = self.keep;
        }
        self.idx
    }

    /// Whether a one-position step writes in place without reshaping the buffers: they hold
    /// `max_size` positions (a CUDA graph of the step then replays it, see
    /// [`RotatingKvCache::advance_one`]).
    pub fn steps_in_place(&self) -> bool {
        self.keys.is_some() && self.buffer_len() == self.max_size
    }

    /// The counters a one-position step moves, `(offset, idx)`, to put back after a step that
    /// did not run ([`RotatingKvCache::set_counters`]).
    pub fn counters(&self) -> (usize, usize) {
        (self.offset, self.idx)
    }

    /// Puts back counters read by [`RotatingKvCache::counters`] (a step captured as a CUDA graph
    /// that failed: nothing of it ran on the device).
    pub fn set_counters(&mut self, (offset, idx): (usize, usize)) {
        (self.offset, self.idx) = (offset, idx);
        self.undo.clear();
    }

    /// Moves the cache on by one position whose keys and values were written elsewhere (a CUDA
    /// graph's replay of a one-position step wrote them where this step would): the counters of
    /// [`RotatingKvCache::attend`]'s in-place update. Refused (nothing changed) unless the step
    /// writes in place ([`RotatingKvCache::steps_in_place`]).
    pub fn advance_one(&mut self) -> Result<()> {
        if !self.steps_in_place() {
            return Err(Error::Invalid("advancing a rotating cache whose buffers are not a whole ring".into()));
        }
        self.next_slot();
        self.offset += 1;
        self.idx += 1;
        // The replay wrote the slot without keeping what it held.
        self.undo.clear();
        Ok(())
    }

    /// The keys and values buffers, as they lie.
    pub fn buffers(&self) -> Option<(&S, &S)> {
        Some((self.keys.as_ref()?, self.values.as_ref()?))
    }
}

impl<S: Store> RotatingKvCache<S> {
    /// Everything needed to restore the cache: its buffers as they lie (ring order) and its
    /// counters `(offset, idx, max_size, keep)`.
    pub fn state(&self) -> Option<(S, S, [usize; 4])> {
        let (k, v) = (self.keys.clone()?, self.values.clone()?);
        Some((k, v, [self.offset, self.idx, self.max_size, self.keep]))
    }

    /// A cache restored from [`RotatingKvCache::state`], checked for consistency.
    pub fn from_state(
        keys: S,
        values: S,
        context: S::Context,
        [offset, idx, max_size, keep]: [usize; 4],
    ) -> Result<Self> {
        let len = keys.len();
        if values.len() != len || keep >= max_size || idx > len || len > max_size + offset {
            return Err(Error::Invalid(format!(
                "an inconsistent rotating cache (buffer {len}, idx {idx}, max {max_size})"
            )));
        }
        Ok(RotatingKvCache {
            keys: Some(keys),
            values: Some(values),
            context,
            offset,
            idx,
            max_size,
            keep,
            rewind: 0,
            steps: 0,
            undo: vec![],
        })
    }

    /// What new positions are made with (the quantization, for quantized rows).
    pub fn context(&self) -> &S::Context {
        &self.context
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` positions of 2 heads of width 4, their values numbered from `from`.
    fn positions(from: usize, n: usize) -> Array {
        let values: Vec<f32> = (0..2 * n * 4).map(|i| (from * 100 + i) as f32).collect();
        Array::from_slice(&values, &[2, n, 4]).unwrap()
    }

    fn step(c: &mut RotatingKvCache, i: usize) {
        c.update_in_place(&positions(i, 1), &positions(i + 500, 1)).unwrap();
    }

    fn snapshot(c: &RotatingKvCache) -> (Vec<f32>, Vec<f32>, [usize; 4]) {
        let (k, v, counters) = c.state().unwrap();
        (k.to_vec::<f32>().unwrap(), v.to_vec::<f32>().unwrap(), counters)
    }

    /// One-position steps (a draft model's guesses) under `keep_steps(3)` are taken back
    /// exactly — the buffers and counters of before them, bit for bit — before and after the
    /// ring wraps, right after a multi-row pass (whose buffers the first step cuts to the
    /// window), pinned positions or not; a fourth step back is refused, leaving the cache as it
    /// was.
    #[test]
    fn one_position_steps_are_taken_back_exactly() {
        for keep in [0, 2] {
            let mut c = RotatingKvCache::new(6, keep).unwrap();
            c.keep_steps(3);
            c.update_concat(&positions(1, 5), &positions(2, 5)).unwrap();
            for i in 0..12 {
                let before = snapshot(&c);
                for j in 0..3 {
                    step(&mut c, 10 + 3 * i + j);
                }
                assert!(c.can_trim(3), "keep {keep}, step {i}");
                c.trim(3).unwrap();
                assert_eq!(snapshot(&c), before, "keep {keep}, step {i}: three steps taken back");
                step(&mut c, 90 + i);
                if i % 4 == 3 {
                    // A multi-row pass between: its rows are taken back by the cut, as before.
                    c.update_concat(&positions(200 + i, 2), &positions(300 + i, 2)).unwrap();
                }
            }
            for j in 0..4 {
                step(&mut c, 400 + j);
            }
            let before = snapshot(&c);
            let e = c.trim(4).unwrap_err().to_string();
            assert!(e.contains("keep_steps"), "{e}");
            assert_eq!(snapshot(&c), before);
            c.trim(3).unwrap();
        }
    }
}
