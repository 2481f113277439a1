//! Causal scaled-dot-product attention with grouped KV heads.

use rayon::prelude::*;

use super::{f32s, output};
use crate::{Array, Error, Result};

pub(crate) fn attention(q: &Array, k: &Array, v: &Array, kv_len: usize, scale: f32) -> Result<Array> {
    let (&[l, hq, d], &[hkv, cap, dk]) = (q.shape(), k.shape()) else {
        return Err(Error::shape("attention", format!("q {:?}, k {:?}", q.shape(), k.shape())));
    };
    if v.shape() != k.shape() || dk != d || hkv == 0 || hq % hkv != 0 || kv_len > cap || l > kv_len {
        return Err(Error::shape(
            "attention",
            format!("q {:?}, k {:?}, v {:?}, kv_len {kv_len}", q.shape(), k.shape(), v.shape()),
        ));
    }
    let (qd, kd, vd) = (f32s("attention", q)?, f32s("attention", k)?, f32s("attention", v)?);
    let group = hq / hkv;
    let first = kv_len - l;
    // One task per (query position, head): out[t, h, :].
    let mut out = vec![0f32; l * hq * d];
    out.par_chunks_mut(d).enumerate().for_each(|(row, o)| {
        let (t, h) = (row / hq, row % hq);
        let kvh = h / group;
        let qv = &qd[(t * hq + h) * d..(t * hq + h + 1) * d];
        let keys = &kd[kvh * cap * d..];
        let values = &vd[kvh * cap * d..];
        let n = first + t + 1;
        let mut scores: Vec<f32> =
            (0..n).map(|j| qv.iter().zip(&keys[j * d..(j + 1) * d]).map(|(a, b)| a * b).sum::<f32>() * scale).collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        for (j, s) in scores.iter().enumerate() {
            let w = s / sum;
            for (o, vv) in o.iter_mut().zip(&values[j * d..(j + 1) * d]) {
                *o += w * vv;
            }
        }
    });
    output(out, &[l, hq * d])
}
