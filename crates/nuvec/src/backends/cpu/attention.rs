//! Causal scaled-dot-product attention with grouped KV heads.
//!
//! One query (decode): split-K ("flash decoding"): one task per (KV head, chunk of keys) serves
//! every query head of the group, so each key and value row is read from memory once; each task
//! leaves a partial (max, sum of exponentials, weighted sum of values) and the calling thread
//! combines them. A few queries: one task per (query, head) row, SIMD dots over the keys,
//! softmax, then SIMD `axpy` of the values. Many queries (prefill): per (head, block of queries),
//! the scores `Q K^T` and the output `P V` are two `gemm` calls on a thread-local score buffer.

use std::cell::RefCell;

use super::f32s;
use super::kv_dots;
use super::kv_rows::KvRows;
use super::linear::{with_scratch, PAR_MIN_WORK};
use super::pool::{self, SendPtr};
use super::simd::{self, RowElem};
use crate::{Array, DType, Error, Result};

/// Queries per block on the `gemm` path.
const BLOCK: usize = 64;
/// Queries from which the `gemm` path is used.
const GEMM_MIN_QUERIES: usize = 16;

/// Keys per split-K task at least.
const SPLIT_MIN_KEYS: usize = 32;

thread_local! {
    /// The calling thread's split-K partials.
    static PARTIALS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// A task's row starts (where each of its keys' and values' rows begins).
    static STARTS: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// Softmax of `scale * s` over `s` in place (max-subtracted, `scale > 0`); `s` sums to 1, or
/// to less with a `sink` logit (already scaled) joining the denominator.
fn softmax_scaled(s: &mut [f32], scale: f32, sink: Option<f32>) {
    let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // With a sink, shift by the larger of the two so that no exponential overflows.
    let max = sink.map_or(max, |sink| max.max(sink / scale));
    let mut sum = simd::exp_shifted(s, max, scale);
    if let Some(sink) = sink {
        sum += (sink - max * scale).exp();
    }
    let inv = 1.0 / sum;
    s.iter_mut().for_each(|v| *v *= inv);
}

/// Per query head, the sink logit joining its softmax (gpt-oss), if any.
pub(super) type Sinks<'a> = Option<&'a [f32]>;

fn sink_of(sinks: Sinks, head: usize) -> Option<f32> {
    sinks.map(|s| s[head])
}

pub(crate) fn attention(q: &Array, k: &Array, v: &Array, kv_len: usize, scale: f32) -> Result<Array> {
    attention_with(q, k, v, kv_len, scale, None, NO_WINDOW)
}

/// What a query sees of a plain causal attention: every position up to its own.
const NO_WINDOW: usize = usize::MAX;

/// See [`crate::Backend::attention_window`]: the blocked and row kernels with each query's
/// keys starting `window - 1` positions before its own.
pub(crate) fn attention_window(
    q: &Array,
    k: &Array,
    v: &Array,
    kv_len: usize,
    scale: f32,
    window: usize,
    sinks: Sinks,
) -> Result<Array> {
    crate::backend::check_attention_window(q, k, v, kv_len, window, sinks)?;
    attention_with(q, k, v, kv_len, scale, sinks, window)
}

/// The first key query position `pos` sees through `window` (0 without one).
fn window_start(pos: usize, window: usize) -> usize {
    (pos + 1).saturating_sub(window)
}

pub(crate) fn attention_sinks(
    q: &Array,
    k: &Array,
    v: &Array,
    kv_len: usize,
    scale: f32,
    sinks: &[f32],
) -> Result<Array> {
    if q.shape().len() != 3 || sinks.len() != q.dim(1) {
        return Err(Error::shape(
            "attention_sinks",
            format!("{} sinks for q {:?} (one per query head)", sinks.len(), q.shape()),
        ));
    }
    attention_with(q, k, v, kv_len, scale, Some(sinks), NO_WINDOW)
}

fn attention_with(
    q: &Array,
    k: &Array,
    v: &Array,
    kv_len: usize,
    scale: f32,
    sinks: Sinks,
    window: usize,
) -> Result<Array> {
    let (&[l, hq, d], &[hkv, cap, dk]) = (q.shape(), k.shape()) else {
        return Err(Error::shape("attention", format!("q {:?}, k {:?}", q.shape(), k.shape())));
    };
    if v.shape() != k.shape() || dk != d || hkv == 0 || hq % hkv != 0 || kv_len > cap || l > kv_len {
        return Err(Error::shape(
            "attention",
            format!("q {:?}, k {:?}, v {:?}, kv_len {kv_len}", q.shape(), k.shape(), v.shape()),
        ));
    }
    let qd = f32s("attention", q)?;
    let (kr, vr) = (KvRows::of("attention", k)?, KvRows::of("attention", v)?);
    let mut out = Array::zeros(&[l, hq * d], DType::F32);
    let o = out.host_mut::<f32>()?;
    if l == 1 && scale > 0.0 && window >= kv_len {
        // Decode reads every row where it lies (half-precision ones widened as loaded).
        with_partials(|p| decode(qd, kr, vr, o, [hq, d, hkv, cap], kv_len, scale, sinks, p));
        return Ok(out);
    }
    // Several queries: half-precision keys and values are widened once, the first kv_len
    // positions of each head, and the f32 kernels run on them.
    let (mut kw, mut vw) = (vec![], vec![]);
    let (kd, vd, cap) = if kr.is_f32() && vr.is_f32() {
        (kr.f32s(0..hkv * cap * d, &mut kw), vr.f32s(0..hkv * cap * d, &mut vw), cap)
    } else {
        for (rows, wide) in [(kr, &mut kw), (vr, &mut vw)] {
            let mut head = vec![];
            for h in 0..hkv {
                wide.extend_from_slice(rows.f32s(h * cap * d..(h * cap + kv_len) * d, &mut head));
            }
        }
        (&kw[..], &vw[..], kv_len)
    };
    if l >= GEMM_MIN_QUERIES && scale > 0.0 {
        blocked(qd, kd, vd, o, [l, hq, d, hkv, cap], kv_len, scale, sinks, window);
    } else {
        rows(qd, kd, vd, o, [l, hq, d, hkv, cap], kv_len, scale, sinks, window);
    }
    Ok(out)
}

/// Key chunks per KV head for split-K decode: enough tasks to balance the threads, a multiple of
/// them in total where the keys allow.
pub(super) fn decode_splits(dims: [usize; 4], kv_len: usize) -> usize {
    let [hq, d, hkv, _] = dims;
    let threads = pool::threads();
    if threads == 1 || hq * kv_len * d * 2 < PAR_MIN_WORK {
        return 1;
    }
    let most = kv_len.div_ceil(SPLIT_MIN_KEYS);
    let mut splits = (threads * 4).div_ceil(hkv).min(most).max(1);
    while !(hkv * splits).is_multiple_of(threads) && splits < most {
        splits += 1;
    }
    splits
}

/// One query over `kv_len` keys, split-K; `partials` is reusable scratch.
#[allow(clippy::too_many_arguments)]
fn decode(
    qd: &[f32],
    kd: KvRows,
    vd: KvRows,
    out: &mut [f32],
    dims: [usize; 4],
    kv_len: usize,
    scale: f32,
    sinks: Sinks,
    partials: &mut Vec<f32>,
) {
    decode_split(qd, kd, vd, out, dims, kv_len, scale, sinks, decode_splits(dims, kv_len), partials)
}

#[allow(clippy::too_many_arguments)]
fn decode_split(
    qd: &[f32],
    kd: KvRows,
    vd: KvRows,
    out: &mut [f32],
    dims: [usize; 4],
    kv_len: usize,
    scale: f32,
    sinks: Sinks,
    splits: usize,
    partials: &mut Vec<f32>,
) {
    let [hq, d, hkv, cap] = dims;
    let group = hq / hkv;
    let (chunk, splits) = split_chunks(kv_len, splits);
    let stride = group * (d + 2);
    partials.resize(hkv * splits * stride, 0.0);
    let task = |t: usize, part: &mut [f32]| {
        let (kvh, c) = (t / splits, t % splits);
        let (j0, j1) = (c * chunk, ((c + 1) * chunk).min(kv_len));
        with_starts(|starts| {
            starts.extend((j0..j1).map(|j| (kvh * cap + j) * d));
            decode_part(&qd[kvh * group * d..(kvh + 1) * group * d], kd, vd, starts, d, scale, part);
        })
    };
    let tasks = hkv * splits;
    if tasks == 1 {
        task(0, partials);
    } else {
        pool::for_chunks(partials, stride, |start, part| task(start / stride, part));
    }
    combine(partials, out, [hq, d, hkv], splits, scale, sinks);
}

/// Keys per split and the number of splits that gives, for `splits` asked over `kv_len` keys.
pub(super) fn split_chunks(kv_len: usize, splits: usize) -> (usize, usize) {
    let chunk = kv_len.div_ceil(splits.max(1));
    (chunk, kv_len.div_ceil(chunk))
}

/// `f` with this thread's split-K partials (a fresh buffer when nested on the same thread).
pub(super) fn with_partials<R>(f: impl FnOnce(&mut Vec<f32>) -> R) -> R {
    PARTIALS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut p) => f(&mut p),
        Err(_) => f(&mut vec![]),
    })
}

/// `f` with this thread's (emptied) buffer of row starts (a fresh one when a task nests inside
/// another on the same thread).
pub(super) fn with_starts<R>(f: impl FnOnce(&mut Vec<usize>) -> R) -> R {
    STARTS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut b) => {
            b.clear();
            f(&mut b)
        }
        Err(_) => f(&mut vec![]),
    })
}

/// One split-K task: the group of query heads `qs [group, d]` sharing a KV head, over the key
/// and value rows of `d` elements at `starts` in `keys, values` (read in place); leaves in
/// `part` the group's weighted values `[group, d]`, then their maxima `[group]` and sums of
/// exponentials `[group]`.
pub(super) fn decode_part(
    qs: &[f32],
    keys: KvRows,
    values: KvRows,
    starts: &[usize],
    d: usize,
    scale: f32,
    part: &mut [f32],
) {
    match (keys, values) {
        (KvRows::F32(k), KvRows::F32(v)) => decode_rows(qs, k, v, starts, d, scale, part),
        (KvRows::F16(k), KvRows::F16(v)) => decode_rows(qs, k, v, starts, d, scale, part),
        (KvRows::Bf16(k), KvRows::Bf16(v)) => decode_rows(qs, k, v, starts, d, scale, part),
        // Keys and values of two types (no cache makes them): both widened, rows in order.
        (k, v) => {
            let (mut kw, mut vw) = (vec![], vec![]);
            for &s in starts {
                k.extend_f32(s..s + d, &mut kw);
                v.extend_f32(s..s + d, &mut vw);
            }
            let dense: Vec<usize> = (0..starts.len()).map(|j| j * d).collect();
            decode_rows(qs, &kw[..], &vw[..], &dense, d, scale, part)
        }
    }
}

fn decode_rows<T: RowElem>(
    qs: &[f32],
    keys: &[T],
    values: &[T],
    starts: &[usize],
    d: usize,
    scale: f32,
    part: &mut [f32],
) {
    let (group, n) = (qs.len() / d, starts.len());
    let (weighted, stats) = part.split_at_mut(group * d);
    let (maxes, sums) = stats.split_at_mut(group);
    with_scratch(group * n, |scores| {
        // Keys and values are short streams from memory: prefetched a few rows ahead, the
        // values while the scores are computed.
        kv_dots::dots_rows(qs, keys, values, starts, d, scores);
        for ((s, m), sum) in scores.chunks_exact_mut(n).zip(maxes.iter_mut()).zip(sums.iter_mut()) {
            *m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            *sum = simd::exp_shifted(s, *m, scale);
        }
        kv_dots::weighted_rows(scores, values, starts, d, weighted);
    })
}

/// Combines the `splits` partials of each KV head (as [`decode_part`] leaves them, KV head by
/// KV head) into one query's output `out [hq * d]`: each rescaled to the largest maximum.
pub(super) fn combine(partials: &[f32], out: &mut [f32], dims: [usize; 3], splits: usize, scale: f32, sinks: Sinks) {
    let [hq, d, hkv] = dims;
    let group = hq / hkv;
    let stride = group * (d + 2);
    for (h, o) in out.chunks_exact_mut(d).enumerate() {
        let (kvh, g) = (h / group, h % group);
        let part = |c: usize| &partials[(kvh * splits + c) * stride..][..stride];
        let (max_at, sum_at) = (group * d + g, group * d + group + g);
        let max = (0..splits).map(|c| part(c)[max_at]).fold(f32::NEG_INFINITY, f32::max);
        let sink = sink_of(sinks, h);
        let max = sink.map_or(max, |sink| max.max(sink / scale));
        o.iter_mut().for_each(|v| *v = 0.0);
        let mut sum = sink.map_or(0.0, |sink| (sink - max * scale).exp());
        for c in 0..splits {
            let p = part(c);
            let w = ((p[max_at] - max) * scale).exp();
            sum += w * p[sum_at];
            simd::axpy(w, &p[g * d..(g + 1) * d], o);
        }
        let inv = 1.0 / sum;
        o.iter_mut().for_each(|v| *v *= inv);
    }
}

/// One (query, head) row at a time.
#[allow(clippy::too_many_arguments)]
fn rows(
    qd: &[f32],
    kd: &[f32],
    vd: &[f32],
    out: &mut [f32],
    dims: [usize; 5],
    kv_len: usize,
    scale: f32,
    sinks: Sinks,
    window: usize,
) {
    let [l, hq, d, hkv, cap] = dims;
    let group = hq / hkv;
    let first = kv_len - l;
    let row = |r: usize, o: &mut [f32]| {
        let (t, h) = (r / hq, r % hq);
        let kvh = h / group;
        let qv = &qd[(t * hq + h) * d..(t * hq + h + 1) * d];
        let keys = &kd[kvh * cap * d..];
        let values = &vd[kvh * cap * d..];
        let lo = window_start(first + t, window);
        let keys = &keys[lo * d..];
        let values = &values[lo * d..];
        let n = first + t + 1 - lo;
        with_scratch(n, |scores| {
            for (j, s) in scores.iter_mut().enumerate() {
                *s = simd::dot(qv, &keys[j * d..(j + 1) * d]);
            }
            if scale > 0.0 {
                softmax_scaled(scores, scale, sink_of(sinks, h));
            } else {
                // A non-positive scale flips which score is the maximum: scale first.
                scores.iter_mut().for_each(|s| *s *= scale);
                softmax_scaled(scores, 1.0, sink_of(sinks, h));
            }
            o.iter_mut().for_each(|v| *v = 0.0);
            for (j, &p) in scores.iter().enumerate() {
                simd::axpy(p, &values[j * d..(j + 1) * d], o);
            }
        })
    };
    let work = kv_len * d * 2;
    if l * hq * work < PAR_MIN_WORK || pool::threads() == 1 {
        for (r, o) in out.chunks_mut(d).enumerate() {
            row(r, o);
        }
        return;
    }
    let per_task = (l * hq).div_ceil(pool::threads() * 2).max(1);
    pool::for_chunks(out, per_task * d, |start, chunk| {
        for (i, o) in chunk.chunks_mut(d).enumerate() {
            row(start / d + i, o);
        }
    });
}

/// Blocks of queries per head through `gemm`.
#[allow(clippy::too_many_arguments)]
fn blocked(
    qd: &[f32],
    kd: &[f32],
    vd: &[f32],
    out: &mut [f32],
    dims: [usize; 5],
    kv_len: usize,
    scale: f32,
    sinks: Sinks,
    window: usize,
) {
    let [l, hq, d, hkv, cap] = dims;
    let group = hq / hkv;
    let first = kv_len - l;
    let blocks = l.div_ceil(BLOCK);
    let dst = SendPtr(out.as_mut_ptr());
    let row_stride = (hq * d) as isize;
    pool::run(hq * blocks, &|task| {
        // Later blocks have more keys: hand them out first.
        let (h, b) = (task % hq, blocks - 1 - task / hq);
        let kvh = h / group;
        let (t0, t1) = (b * BLOCK, ((b + 1) * BLOCK).min(l));
        let bl = t1 - t0;
        // Keys lo.. of the block's queries (the first query's window start on).
        let lo = window_start(first + t0, window);
        let nk = first + t1 - lo;
        with_scratch(bl * nk, |s| {
            let keys = &kd[(kvh * cap + lo) * d..(kvh * cap + lo + nk) * d];
            let values = &vd[(kvh * cap + lo) * d..(kvh * cap + lo + nk) * d];
            let qp = qd[(t0 * hq + h) * d..].as_ptr();
            // SAFETY: s is bl x nk (row-major); lhs reads bl rows of d floats at stride hq*d
            // starting at query t0 head h (inside q); rhs reads keys 0..nk of this kv head as a
            // d x nk matrix (column j = key j), inside `keys`.
            unsafe {
                gemm::gemm(
                    bl,
                    nk,
                    d,
                    s.as_mut_ptr(),
                    1,
                    nk as isize,
                    false,
                    qp,
                    1,
                    row_stride,
                    keys.as_ptr(),
                    d as isize,
                    1,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                )
            };
            for (i, srow) in s.chunks_mut(nk).enumerate() {
                let pos = first + t0 + i;
                let (from, valid) = (window_start(pos, window) - lo, pos + 1 - lo);
                softmax_scaled(&mut srow[from..valid], scale, sink_of(sinks, h));
                srow[..from].iter_mut().for_each(|v| *v = 0.0);
                srow[valid..].iter_mut().for_each(|v| *v = 0.0);
            }
            let dp = dst;
            // SAFETY: this task alone writes rows t0..t1, columns h*d..(h+1)*d of `out`
            // ([l, hq*d], alive for the whole region); lhs is s (bl x nk), rhs the values
            // 0..nk of this kv head (nk x d, row-major), inside `values`.
            unsafe {
                gemm::gemm(
                    bl,
                    d,
                    nk,
                    dp.0.add(t0 * hq * d + h * d),
                    1,
                    row_stride,
                    false,
                    s.as_ptr(),
                    1,
                    nk as isize,
                    values.as_ptr(),
                    1,
                    d as isize,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                )
            };
        })
    });
}

#[cfg(test)]
mod tests {
    use super::super::simd::tests::randoms;
    use super::*;

    /// The textbook computation, in f64 (a sink logit adds `exp(sink)` to each denominator).
    fn reference(
        qd: &[f32],
        kd: &[f32],
        vd: &[f32],
        dims: [usize; 5],
        kv_len: usize,
        scale: f32,
        sinks: Sinks,
    ) -> Vec<f32> {
        reference_window(qd, kd, vd, dims, kv_len, scale, sinks, NO_WINDOW)
    }

    /// [`reference`] where query `t` sees only the `window` positions up to its own.
    #[allow(clippy::too_many_arguments)]
    fn reference_window(
        qd: &[f32],
        kd: &[f32],
        vd: &[f32],
        dims: [usize; 5],
        kv_len: usize,
        scale: f32,
        sinks: Sinks,
        window: usize,
    ) -> Vec<f32> {
        let [l, hq, d, hkv, cap] = dims;
        let mut out = vec![0f32; l * hq * d];
        for t in 0..l {
            for h in 0..hq {
                let kvh = h / (hq / hkv);
                let n = kv_len - l + t + 1;
                let lo = n.saturating_sub(window);
                let q = &qd[(t * hq + h) * d..][..d];
                let s: Vec<f64> = (lo..n)
                    .map(|j| {
                        let k = &kd[(kvh * cap + j) * d..][..d];
                        q.iter().zip(k).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale as f64
                    })
                    .collect();
                let sink = sinks.map(|s| s[h] as f64);
                let max = s.iter().copied().chain(sink).fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|v| (v - max).exp()).collect();
                let sum: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - max).exp());
                for c in 0..d {
                    out[(t * hq + h) * d + c] =
                        (lo..n).map(|j| e[j - lo] / sum * vd[(kvh * cap + j) * d + c] as f64).sum::<f64>() as f32;
                }
            }
        }
        out
    }

    #[test]
    fn row_and_blocked_attention_match_reference() {
        for d in [32usize, 64] {
            check_attention(d);
        }
    }

    #[test]
    fn attention_with_sinks_matches_reference() {
        // Sinks below, around and far above the scaled scores (the last outweighs every key).
        let sinks = [-3.0f32, 0.0, 0.5, 2.0, 4.0, 60.0];
        for d in [32usize, 64] {
            check_attention_with(d, Some(&sinks));
        }
    }

    fn check_attention(d: usize) {
        check_attention_with(d, None)
    }

    fn check_attention_with(d: usize, sinks: Sinks) {
        let (hq, hkv, cap) = (6usize, 2usize, 160usize);
        let kd = randoms(hkv * cap * d, 11);
        let vd = randoms(hkv * cap * d, 12);
        for (l, kv_len) in [(1usize, 1usize), (1, 77), (1, 160), (1, 33), (3, 40), (16, 16), (70, 70), (100, 150)] {
            let qd: Vec<f32> = randoms(l * hq * d, l as u64).iter().map(|v| v * 3.0).collect();
            let dims = [l, hq, d, hkv, cap];
            let want = reference(&qd, &kd, &vd, dims, kv_len, 0.2, sinks);
            let mut a = vec![0f32; l * hq * d];
            rows(&qd, &kd, &vd, &mut a, dims, kv_len, 0.2, sinks, NO_WINDOW);
            let mut b = vec![0f32; l * hq * d];
            blocked(&qd, &kd, &vd, &mut b, dims, kv_len, 0.2, sinks, NO_WINDOW);
            for ((x, y), w) in a.iter().zip(&b).zip(&want) {
                assert!((x - w).abs() < 1e-5 && (y - w).abs() < 1e-5, "l {l} kv {kv_len}: {x} {y} vs {w}");
            }
            if l == 1 {
                for splits in [1usize, 2, 3, 4, 7] {
                    let mut c = vec![0f32; hq * d];
                    decode_split(
                        &qd,
                        KvRows::F32(&kd),
                        KvRows::F32(&vd),
                        &mut c,
                        [hq, d, hkv, cap],
                        kv_len,
                        0.2,
                        sinks,
                        splits,
                        &mut vec![],
                    );
                    for (x, w) in c.iter().zip(&want) {
                        assert!((x - w).abs() < 1e-5, "decode kv {kv_len} splits {splits}: {x} vs {w}");
                    }
                }
            }
        }
    }

    /// A sliding window: each query sees the `window` positions up to its own, on the row and
    /// blocked kernels, with and without sinks, windows shorter and longer than a block of
    /// queries, over chunks that start at 0 and after earlier positions; and through the op, the
    /// same as the composed default (one query at a time over its own positions).
    #[test]
    fn windowed_attention_matches_reference() {
        let (hq, hkv, cap, d) = (6usize, 2usize, 200usize, 32usize);
        let kd = randoms(hkv * cap * d, 31);
        let vd = randoms(hkv * cap * d, 32);
        let sinks = [-3.0f32, 0.0, 0.5, 2.0, 4.0, 60.0];
        for (l, kv_len, window) in
            [(3usize, 40usize, 8usize), (16, 16, 5), (70, 70, 1), (100, 150, 33), (130, 200, 128)]
        {
            for sinks in [None, Some(&sinks[..])] {
                let qd: Vec<f32> = randoms(l * hq * d, l as u64).iter().map(|v| v * 3.0).collect();
                let dims = [l, hq, d, hkv, cap];
                let want = reference_window(&qd, &kd, &vd, dims, kv_len, 0.2, sinks, window);
                let mut a = vec![0f32; l * hq * d];
                rows(&qd, &kd, &vd, &mut a, dims, kv_len, 0.2, sinks, window);
                let mut b = vec![0f32; l * hq * d];
                blocked(&qd, &kd, &vd, &mut b, dims, kv_len, 0.2, sinks, window);
                for ((x, y), w) in a.iter().zip(&b).zip(&want) {
                    assert!(
                        (x - w).abs() < 1e-5 && (y - w).abs() < 1e-5,
                        "l {l} kv {kv_len} w {window}: {x} {y} vs {w}"
                    );
                }
                let (q, k, v) = (
                    Array::from_slice(&qd, &[l, hq, d]).unwrap(),
                    Array::from_slice(&kd, &[hkv, cap, d]).unwrap(),
                    Array::from_slice(&vd, &[hkv, cap, d]).unwrap(),
                );
                let op = attention_window(&q, &k, &v, kv_len, 0.2, window, sinks).unwrap().to_f32_vec().unwrap();
                let composed = crate::backend::attention_window_composed(
                    &super::super::CpuBackend,
                    &q,
                    &k,
                    &v,
                    kv_len,
                    0.2,
                    window,
                    sinks,
                )
                .unwrap()
                .to_f32_vec()
                .unwrap();
                for ((x, y), w) in op.iter().zip(&composed).zip(&want) {
                    assert!((x - w).abs() < 1e-5 && (y - w).abs() < 1e-5, "op l {l} w {window}: {x} {y} vs {w}");
                }
            }
        }
    }

    #[test]
    fn a_window_of_no_positions_or_sinks_for_other_heads_are_errors() {
        let q = Array::zeros(&[2, 4, 8], DType::F32);
        let k = Array::zeros(&[2, 4, 8], DType::F32);
        let e = attention_window(&q, &k, &k, 4, 0.5, 0, None).unwrap_err().to_string();
        assert!(e.contains("window of 0"), "{e}");
        let e = attention_window(&q, &k, &k, 4, 0.5, 2, Some(&[0.0; 3])).unwrap_err().to_string();
        assert!(e.contains("3 sinks for 4 query heads"), "{e}");
    }

    /// Keys and values held in f16 or bf16 give exactly the attention of their f32 values, on
    /// every path (decode, rows, blocked).
    #[test]
    fn half_precision_keys_and_values_attend_as_their_f32_values() {
        let (hq, hkv, cap, d) = (4usize, 2usize, 96usize, 64usize);
        let (kd, vd) = (randoms(hkv * cap * d, 21), randoms(hkv * cap * d, 22));
        for dtype in [DType::F16, DType::BF16] {
            let narrow = |x: &[f32]| Array::from_slice(x, &[hkv, cap, d]).unwrap().astype(dtype).unwrap();
            let (k, v) = (narrow(&kd), narrow(&vd));
            let (kw, vw) = (Array::from_slice(&k.to_f32_vec().unwrap(), &[hkv, cap, d]).unwrap(), {
                Array::from_slice(&v.to_f32_vec().unwrap(), &[hkv, cap, d]).unwrap()
            });
            for (l, kv_len) in [(1usize, 1usize), (1, 90), (5, 60), (40, 96)] {
                let q = Array::from_slice(&randoms(l * hq * d, 3), &[l, hq, d]).unwrap();
                let half = attention(&q, &k, &v, kv_len, 0.125).unwrap().to_f32_vec().unwrap();
                let wide = attention(&q, &kw, &vw, kv_len, 0.125).unwrap().to_f32_vec().unwrap();
                assert_eq!(half, wide, "{dtype} l {l} kv {kv_len}");
            }
        }
    }
}
