//! Array plumbing the cache kinds share: slicing and joining along the positions axis, and
//! attention with the masks mlx-lm's caches produce.

use nuvec::{Array, DType};

use crate::Result;

/// Positions `start..end` of `a [heads, positions, dim]`.
pub(super) fn slice_axis1(a: &Array, start: usize, end: usize) -> Result<Array> {
    Ok(a.transpose01()?.slice_rows(start, end)?.transpose01()?)
}

/// `parts [heads, n_i, dim]` joined along the positions.
pub(crate) fn concat_axis1(parts: &[Array]) -> Result<Array> {
    let (h, d) = (parts[0].dim(0), parts[0].dim(2));
    let total: usize = parts.iter().map(|p| p.dim(1)).sum();
    let mut out = Array::zeros_on(&[h, total, d], parts[0].dtype(), parts[0].device())?;
    let mut at = 0;
    for p in parts {
        if p.dim(1) > 0 {
            out.write_axis1(p, at)?;
        }
        at += p.dim(1);
    }
    Ok(out)
}

/// Per query head, a logit joining each softmax (gpt-oss's attention sinks), or none.
pub(crate) type Sinks<'a> = Option<&'a [f32]>;

/// Causal attention over the first `kv_len` positions of `k, v`, with sinks when given.
pub(crate) fn sdpa(q: &Array, k: &Array, v: &Array, kv_len: usize, scale: f32, sinks: Sinks) -> Result<Array> {
    Ok(match sinks {
        None => nuvec::attention(q, k, v, kv_len, scale)?,
        Some(s) => nuvec::attention_sinks(q, k, v, kv_len, scale, s)?,
    })
}

/// Causal attention of `q [L, heads, dim]` over all of `k, v` (the last L positions are q's).
pub(crate) fn attend_causal(q: &Array, k: &Array, v: &Array, scale: f32, sinks: Sinks) -> Result<Array> {
    let (k, v) = on_device_of(q, k, v)?;
    sdpa(q, &k, &v, k.dim(1), scale, sinks)
}

/// `k, v` on `q`'s device: quantized caches dequantize on the host, so their keys and values
/// cross over here (a no-op when they are already there).
pub(crate) fn on_device_of(q: &Array, k: &Array, v: &Array) -> Result<(Array, Array)> {
    Ok((k.to_device(q.device())?, v.to_device(q.device())?))
}

/// mlx-lm's `create_causal_mask(L, offset, window)`: query `i` sits at position `held + i` of
/// `k, v` and sees positions `p` with `held + i - window < p <= held + i`.
pub(crate) fn attend_windowed(
    q: &Array,
    k: &Array,
    v: &Array,
    held: usize,
    window: usize,
    scale: f32,
    sinks: Sinks,
) -> Result<Array> {
    let (k, v) = on_device_of(q, k, v)?;
    Ok(nuvec::attention_window(q, &k, &v, held + q.dim(0), scale, window, sinks)?)
}

/// What one-token steps of a rotating cache with pinned positions show each query: query `i`,
/// at position `held + i` of `k, v`, sees the first `pinned` positions and the `recent` newest
/// up to itself (the ring's positions after the pinned ones lie in order here).
pub(crate) fn attend_pinned_window(
    q: &Array,
    k: &Array,
    v: &Array,
    held: usize,
    (pinned, recent): (usize, usize),
    scale: f32,
    sinks: Sinks,
) -> Result<Array> {
    let (l, width) = (q.dim(0), q.dim(1) * q.dim(2));
    let (k, v) = on_device_of(q, k, v)?;
    let (k, v) = (k.transpose01()?, v.transpose01()?);
    let mut out = Array::zeros_on(&[1, l, width], DType::F32, q.device())?;
    for i in 0..l {
        let last = held + i;
        let start = (last + 1).saturating_sub(recent).max(pinned);
        let seen = |a: &Array| -> Result<Array> {
            let parts = [a.slice_rows(0, pinned)?, a.slice_rows(start, last + 1)?];
            Ok(crate::step::concat_rows(&parts)?.transpose01()?)
        };
        let (ki, vi) = (seen(&k)?, seen(&v)?);
        let row = sdpa(&q.slice_rows(i, i + 1)?, &ki, &vi, ki.dim(1), scale, sinks)?;
        out.write_axis1(&row.reshape(&[1, 1, width])?, i)?;
    }
    Ok(out.reshape(&[l, width])?)
}

/// Attention of each query row `i` of `q [L, heads, dim]` over the positions `visible(i)` of
/// `k, v [kv_heads, positions, dim]` (with sinks when given): the masks that are not plain
/// causal ones (a window, a chunk), one query at a time.
pub(super) fn attend_ranges(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    sinks: Sinks,
    visible: impl Fn(usize) -> std::ops::Range<usize>,
) -> Result<Array> {
    let (l, width) = (q.dim(0), q.dim(1) * q.dim(2));
    let (k, v) = on_device_of(q, k, v)?;
    // Positions first, once: each query then copies only its range (a sliding-window model's
    // long prefill comes here for every query).
    let (k, v) = (k.transpose01()?, v.transpose01()?);
    let range_of =
        |a: &Array, r: &std::ops::Range<usize>| -> Result<Array> { Ok(a.slice_rows(r.start, r.end)?.transpose01()?) };
    let mut out = Array::zeros_on(&[1, l, width], DType::F32, q.device())?;
    for i in 0..l {
        let range = visible(i);
        let (ki, vi) = (range_of(&k, &range)?, range_of(&v, &range)?);
        let row = sdpa(&q.slice_rows(i, i + 1)?, &ki, &vi, range.len(), scale, sinks)?;
        out.write_axis1(&row.reshape(&[1, 1, width])?, i)?;
    }
    Ok(out.reshape(&[l, width])?)
}
