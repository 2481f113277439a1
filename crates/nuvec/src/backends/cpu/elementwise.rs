//! Norms, rotary embeddings, copies and elementwise ops.

use super::kv_rows::KvRowsMut;
use super::linear::PAR_MIN_WORK;
use super::pool;
use super::{f32s, floats, output};
use crate::{Array, Error, Result};

pub(crate) fn binary(op: &'static str, a: &Array, b: &Array, f: impl Fn(f32, f32) -> f32 + Sync) -> Result<Array> {
    if a.shape() != b.shape() {
        return Err(Error::shape(op, format!("{:?} and {:?} differ", a.shape(), b.shape())));
    }
    let (x, y) = (f32s(op, a)?, f32s(op, b)?);
    let mut out = Array::zeros(a.shape(), crate::DType::F32);
    for ((o, &x), &y) in out.host_mut::<f32>()?.iter_mut().zip(x).zip(y) {
        *o = f(x, y);
    }
    Ok(out)
}

pub(crate) fn silu_mul(gate: &Array, up: &Array) -> Result<Array> {
    if gate.shape() != up.shape() {
        return Err(Error::shape("silu_mul", format!("{:?} and {:?} differ", gate.shape(), up.shape())));
    }
    let (g, u) = (f32s("silu_mul", gate)?, f32s("silu_mul", up)?);
    let mut out = Array::zeros(gate.shape(), crate::DType::F32);
    super::simd::silu_mul(g, u, out.host_mut::<f32>()?);
    Ok(out)
}

pub(crate) fn add_bias(x: &Array, bias: &Array) -> Result<Array> {
    by_columns("add_bias", x, bias, |a, b| a + b)
}

pub(crate) fn mul_columns(x: &Array, w: &Array) -> Result<Array> {
    by_columns("mul_columns", x, w, |a, b| a * b)
}

pub(crate) fn add_linear(y: &Array, t: &Array, w: &Array) -> Result<Array> {
    let (n, r) = crate::backend::check_add_linear(y, t, w)?;
    let shape = y.shape().to_vec();
    let (y, t, w) = (f32s("add_linear", y)?, f32s("add_linear", t)?, f32s("add_linear", w)?);
    let mut out = y.to_vec();
    for (o_row, t_row) in out.chunks_mut(n).zip(t.chunks(r)) {
        for (o, w_row) in o_row.iter_mut().zip(w.chunks(r)) {
            *o += t_row.iter().zip(w_row).map(|(a, b)| a * b).sum::<f32>();
        }
    }
    output(out, &shape)
}

/// `f(x[i, j], row[j])` for every entry of `x [.., N]`.
fn by_columns(op: &'static str, x: &Array, row: &Array, f: impl Fn(f32, f32) -> f32) -> Result<Array> {
    let n = x.dim(-1);
    if row.len() != n {
        return Err(Error::shape(op, format!("a row of {} for rows of {n}", row.len())));
    }
    let (data, row) = (f32s(op, x)?, floats(op, row)?);
    let out = data.chunks(n).flat_map(|r| r.iter().zip(row.iter()).map(|(&a, &b)| f(a, b))).collect();
    output(out, x.shape())
}

pub(crate) fn rms_norm(x: &Array, weight: &Array, eps: f32) -> Result<Array> {
    let d = x.dim(-1);
    if weight.len() != d {
        return Err(Error::shape("rms_norm", format!("weight of {} for rows of {d}", weight.len())));
    }
    let (data, w) = (f32s("rms_norm", x)?, floats("rms_norm", weight)?);
    let mut out = Array::zeros(x.shape(), crate::DType::F32);
    let norm_rows = |start: usize, o: &mut [f32]| {
        for (o, row) in o.chunks_mut(d).zip(data[start..].chunks(d)) {
            let mean_sq = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let inv = 1.0 / (mean_sq + eps).sqrt();
            for ((o, &v), &w) in o.iter_mut().zip(row).zip(w.iter()) {
                *o = v * inv * w;
            }
        }
    };
    let o = out.host_mut::<f32>()?;
    if o.len() * 4 < PAR_MIN_WORK || d == 0 {
        norm_rows(0, o);
    } else {
        let rows = (o.len() / d).div_ceil(pool::threads() * 4).max(1);
        pool::for_chunks(o, rows * d, norm_rows);
    }
    Ok(out)
}

pub(crate) fn rope(x: &Array, inv_freqs: &[f32], offset: usize, traditional: bool) -> Result<Array> {
    let [l, h, d] = *x.shape() else {
        return Err(Error::shape("rope", format!("expected [L, H, D], got {:?}", x.shape())));
    };
    let half = inv_freqs.len();
    if 2 * half > d {
        return Err(Error::shape("rope", format!("{half} frequencies for heads of {d}")));
    }
    let data = f32s("rope", x)?;
    let mut out = Array::zeros(x.shape(), crate::DType::F32);
    let o = out.host_mut::<f32>()?;
    o.copy_from_slice(data);
    let rotate = |start: usize, rows: &mut [f32]| {
        with_sin_cos(half, |sin, cos| {
            for (i, rows) in rows.chunks_mut(h * d).enumerate() {
                let pos = (offset + start / (h * d) + i) as f32;
                for (j, f) in inv_freqs.iter().enumerate() {
                    (sin[j], cos[j]) = (pos * f).sin_cos();
                }
                for head in rows.chunks_mut(d) {
                    for i in 0..half {
                        let (a, b) = if traditional { (2 * i, 2 * i + 1) } else { (i, i + half) };
                        let (x1, x2) = (head[a], head[b]);
                        head[a] = x1 * cos[i] - x2 * sin[i];
                        head[b] = x1 * sin[i] + x2 * cos[i];
                    }
                }
            }
        })
    };
    if l * h * d * 8 < PAR_MIN_WORK || h * d == 0 {
        rotate(0, o);
    } else {
        pool::for_chunks(o, l.div_ceil(pool::threads() * 4).max(1) * h * d, rotate);
    }
    Ok(out)
}

/// Runs `f` with two thread-local buffers of `n` floats.
fn with_sin_cos<R>(n: usize, f: impl FnOnce(&mut [f32], &mut [f32]) -> R) -> R {
    super::linear::with_scratch(2 * n, |buf| {
        let (sin, cos) = buf.split_at_mut(n);
        f(sin, cos)
    })
}

pub(crate) fn write_axis1(dst: &mut Array, src: &Array, offset: usize) -> Result<()> {
    let (&[a, cap, c], &[sa, n, sc]) = (dst.shape(), src.shape()) else {
        return Err(Error::shape(
            "write_axis1",
            format!("expected 3-d arrays, got {:?} and {:?}", dst.shape(), src.shape()),
        ));
    };
    if a != sa || c != sc || offset + n > cap {
        return Err(Error::shape(
            "write_axis1",
            format!("cannot write {:?} into {:?} at {offset}", src.shape(), dst.shape()),
        ));
    }
    if src.dtype() == dst.dtype() {
        // Same element type (f32, or a half-precision cache's own positions): a byte copy.
        let size = src.dtype().size();
        let (run, s) = (n * c * size, src.raw_bytes());
        let d = dst.host_bytes_mut()?;
        for i in 0..a {
            let to = (i * cap + offset) * c * size;
            d[to..to + run].copy_from_slice(&s[i * run..(i + 1) * run]);
        }
        return Ok(());
    }
    let s = f32s("write_axis1", src)?;
    let mut d = KvRowsMut::of("write_axis1", dst)?;
    for i in 0..a {
        d.store((i * cap + offset) * c, &s[i * n * c..(i + 1) * n * c]);
    }
    Ok(())
}

pub(crate) fn write_axis1_from_rows(dst: &mut Array, src: &Array, offset: usize) -> Result<()> {
    let (&[a, cap, c], &[n, sa, sc]) = (dst.shape(), src.shape()) else {
        return Err(Error::shape(
            "write_axis1_from_rows",
            format!("expected 3-d arrays, got {:?} and {:?}", dst.shape(), src.shape()),
        ));
    };
    if a != sa || c != sc || offset + n > cap {
        return Err(Error::shape(
            "write_axis1_from_rows",
            format!("cannot write {:?} (rows first) into {:?} at {offset}", src.shape(), dst.shape()),
        ));
    }
    let s = f32s("write_axis1_from_rows", src)?;
    let mut d = KvRowsMut::of("write_axis1_from_rows", dst)?;
    for (t, row) in s.chunks_exact(a * c.max(1)).enumerate().take(n) {
        for (i, head) in row.chunks_exact(c.max(1)).enumerate() {
            d.store((i * cap + offset + t) * c, head);
        }
    }
    Ok(())
}

pub(crate) fn transpose01(x: &Array) -> Result<Array> {
    let [a, b, c] = *x.shape() else {
        return Err(Error::shape("transpose01", format!("expected [A, B, C], got {:?}", x.shape())));
    };
    // Any element type: a cache in half precision is sliced and reordered as stored.
    let size = x.dtype().size();
    let (data, row) = (x.raw_bytes(), c * size);
    let mut out = vec![0u8; data.len()];
    for i in 0..a {
        for j in 0..b {
            out[(j * a + i) * row..(j * a + i + 1) * row]
                .copy_from_slice(&data[(i * b + j) * row..(i * b + j + 1) * row]);
        }
    }
    Array::from_bytes(crate::buffer::Bytes::copy_of(&out), vec![b, a, c], x.dtype())
}

pub(crate) fn slice_rows(x: &Array, start: usize, end: usize) -> Result<Array> {
    let m = x.dim(0);
    if start > end || end > m {
        return Err(Error::shape("slice_rows", format!("rows {start}..{end} of {m}")));
    }
    // Any element type (see transpose01).
    let row = x.nbytes() / m.max(1);
    let mut shape = x.shape().to_vec();
    shape[0] = end - start;
    Array::from_bytes(crate::buffer::Bytes::copy_of(&x.raw_bytes()[start * row..end * row]), shape, x.dtype())
}

pub(crate) fn argmax(x: &Array) -> Result<Array> {
    let n = x.dim(-1);
    let data = f32s("argmax", x)?;
    // The first maximum wins, as in MLX.
    let ids: Vec<u32> = data
        .chunks(n)
        .map(|row| {
            let mut best = 0;
            for (i, &v) in row.iter().enumerate() {
                if v > row[best] {
                    best = i;
                }
            }
            best as u32
        })
        .collect();
    let shape = &x.shape()[..x.shape().len() - 1];
    Array::from_slice(&ids, shape)
}
