//! Gated DeltaNet ops: the depthwise causal convolution and the gated delta recurrence, in the
//! order mlx-lm's reference ops compute them. Heads are independent, so the recurrence runs one
//! head per task; each state row's dot products and update use the SIMD `dot`/`axpy` kernels,
//! checked against the plain loops of [`recur_head`] with `simd = false`.

use super::linear::PAR_MIN_WORK;
use super::{f32s, floats, output, pool, simd};
use crate::{Array, Error, GatedDeltaDims, Result};

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// MLX's `softplus`: `logaddexp(x, 0)`.
fn softplus(x: f32) -> f32 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

pub(crate) fn causal_conv1d_silu(x: &Array, state: &Array, weight: &Array) -> Result<(Array, Array)> {
    let op = "causal_conv1d_silu";
    let (&[l, c], &[keep, sc]) = (x.shape(), state.shape()) else {
        return Err(Error::shape(
            op,
            format!("expected x [L, C] and state [K-1, C], got {:?}, {:?}", x.shape(), state.shape()),
        ));
    };
    let taps = keep + 1;
    if sc != c || weight.len() != c * taps || weight.shape().first() != Some(&c) {
        return Err(Error::shape(
            op,
            format!("x {:?}, state {:?} and weight {:?} do not fit [C, K]", x.shape(), state.shape(), weight.shape()),
        ));
    }
    let (xs, st, w) = (f32s(op, x)?, f32s(op, state)?, floats(op, weight)?);
    // The padded input, `state ++ x`: row `r` of it.
    let row = |r: usize| if r < keep { &st[r * c..(r + 1) * c] } else { &xs[(r - keep) * c..(r - keep + 1) * c] };
    let mut out = vec![0f32; l * c];
    for (t, o) in out.chunks_mut(c.max(1)).enumerate().take(l) {
        for (ch, o) in o.iter_mut().enumerate() {
            let mut acc = 0f32;
            for j in 0..taps {
                acc += w[ch * taps + j] * row(t + j)[ch];
            }
            *o = silu(acc);
        }
    }
    let next: Vec<f32> = (l..l + keep).flat_map(|r| row(r).iter().copied()).collect();
    Ok((output(out, &[l, c])?, output(next, &[keep, c])?))
}

pub(crate) fn sigmoid_mul(gate: &Array, x: &Array) -> Result<Array> {
    let op = "sigmoid_mul";
    if gate.shape() != x.shape() {
        return Err(Error::shape(op, format!("{:?} and {:?} differ", gate.shape(), x.shape())));
    }
    let (g, v) = (f32s(op, gate)?, f32s(op, x)?);
    output(g.iter().zip(v).map(|(&g, &v)| v * sigmoid(g)).collect(), x.shape())
}

/// `x * rsqrt(mean(x^2) + eps) * scale` over each head of `dim` features (MLX's `fast.rms_norm`
/// without a weight, then the scalar).
fn normalize_heads(x: &mut [f32], dim: usize, eps: f32, scale: f32) {
    for head in x.chunks_mut(dim) {
        let mean_sq = head.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let inv = 1.0 / (mean_sq + eps).sqrt();
        head.iter_mut().for_each(|v| *v = scale * (*v * inv));
    }
}

/// What the recurrence of every head reads: normalized queries and keys `[L, Hk, Dk]`, values
/// `[L, Hv, Dv]`, decays and write strengths `[L, Hv]`.
struct Inputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
}

fn prepare(mixed: &[f32], a: &[f32], b: &[f32], a_log: &[f32], dt_bias: &[f32], l: usize, d: GatedDeltaDims) -> Inputs {
    let (hk, hv, dk, dv) = (d.key_heads, d.value_heads, d.key_dim, d.value_dim);
    let width = d.mixed_width();
    let take = |from: usize, n: usize| -> Vec<f32> {
        mixed.chunks(width).take(l).flat_map(|r| r[from..from + n].iter().copied()).collect()
    };
    let (mut q, mut k, v) = (take(0, hk * dk), take(hk * dk, hk * dk), take(2 * hk * dk, hv * dv));
    // mlx-lm's normalize_qk: eps 1e-6 is added to sum(x^2), i.e. 1e-6 / Dk to the mean.
    let inv_scale = (dk as f64).powf(-0.5);
    let eps = (1e-6 * inv_scale * inv_scale) as f32;
    normalize_heads(&mut q, dk, eps, (inv_scale * inv_scale) as f32);
    normalize_heads(&mut k, dk, eps, inv_scale as f32);
    let decay: Vec<f32> = a_log.iter().map(|&x| x.exp()).collect();
    let g = a.iter().enumerate().map(|(i, &x)| (-decay[i % hv] * softplus(x + dt_bias[i % hv])).exp()).collect();
    let beta = b.iter().map(|&x| sigmoid(x)).collect();
    Inputs { q, k, v, g, beta }
}

/// Runs value head `h` over every position: `state [Dv, Dk]` in place, its outputs into
/// `y [L, Dv]`. Per state row: decay by `g`, read the memory along `k`, move it towards `v` by
/// `beta`, read the output along `q`. `simd = false` is the scalar reference.
fn recur_head(x: &Inputs, h: usize, l: usize, d: GatedDeltaDims, state: &mut [f32], y: &mut [f32], simd: bool) {
    let (hk, hv, dk, dv) = (d.key_heads, d.value_heads, d.key_dim, d.value_dim);
    let kh = h / (hv / hk);
    for t in 0..l {
        let q = &x.q[(t * hk + kh) * dk..][..dk];
        let k = &x.k[(t * hk + kh) * dk..][..dk];
        let v = &x.v[(t * hv + h) * dv..][..dv];
        let (g, beta) = (x.g[t * hv + h], x.beta[t * hv + h]);
        for (r, row) in state.chunks_mut(dk).enumerate() {
            if simd {
                row.iter_mut().for_each(|s| *s *= g);
                let delta = (v[r] - simd::dot(row, k)) * beta;
                simd::axpy(delta, k, row);
                y[t * dv + r] = simd::dot(row, q);
                continue;
            }
            let mut memory = 0f32;
            for (s, &kj) in row.iter_mut().zip(k) {
                *s *= g;
                memory += *s * kj;
            }
            let delta = (v[r] - memory) * beta;
            let mut out = 0f32;
            for ((s, &kj), &qj) in row.iter_mut().zip(k).zip(q) {
                *s += kj * delta;
                out += *s * qj;
            }
            y[t * dv + r] = out;
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn gated_delta(
    mixed: &Array,
    a: &Array,
    b: &Array,
    a_log: &Array,
    dt_bias: &Array,
    state: &Array,
    d: GatedDeltaDims,
) -> Result<(Array, Array)> {
    let op = "gated_delta";
    let (hv, dk, dv) = (d.value_heads, d.key_dim, d.value_dim);
    let l = d.check_inputs(mixed, [a, b], [a_log, dt_bias], state)?;
    let inputs =
        prepare(f32s(op, mixed)?, f32s(op, a)?, f32s(op, b)?, &floats(op, a_log)?, &floats(op, dt_bias)?, l, d);
    // Per head, its state then its outputs, so that heads run as independent chunks.
    let per_head = dv * dk + l * dv;
    let mut work = vec![0f32; hv * per_head];
    let old = f32s(op, state)?;
    for (h, w) in work.chunks_mut(per_head).enumerate() {
        w[..dv * dk].copy_from_slice(&old[h * dv * dk..(h + 1) * dv * dk]);
    }
    let run = |start: usize, chunk: &mut [f32]| {
        for (i, w) in chunk.chunks_mut(per_head).enumerate() {
            let (s, y) = w.split_at_mut(dv * dk);
            recur_head(&inputs, start / per_head + i, l, d, s, y, true);
        }
    };
    if work.len() * 4 < PAR_MIN_WORK || hv == 1 {
        run(0, &mut work);
    } else {
        pool::for_chunks(&mut work, per_head, run);
    }
    let mut y = vec![0f32; l * hv * dv];
    let mut next = Vec::with_capacity(hv * dv * dk);
    for (h, w) in work.chunks(per_head).enumerate() {
        next.extend_from_slice(&w[..dv * dk]);
        for t in 0..l {
            y[(t * hv + h) * dv..][..dv].copy_from_slice(&w[dv * dk + t * dv..][..dv]);
        }
    }
    Ok((output(y, &[l, hv, dv])?, output(next, &[hv, dv, dk])?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recurrence written directly from its definition (per position: decay, correct, read),
    /// against which the chunked, threaded op is checked.
    #[test]
    fn recurrence_matches_its_definition_and_continues_across_calls() {
        let d = GatedDeltaDims { key_heads: 2, value_heads: 4, key_dim: 8, value_dim: 6 };
        let l = 7;
        let rand = |n: usize, seed: u64| -> Vec<f32> {
            let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            (0..n)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    (s % 2000) as f32 / 1000.0 - 1.0
                })
                .collect()
        };
        let arr = |v: Vec<f32>, shape: &[usize]| Array::from_slice(&v, shape).unwrap();
        let mixed = rand(l * d.mixed_width(), 1);
        let (a, b, a_log, dt) = (rand(l * 4, 2), rand(l * 4, 3), rand(4, 4), rand(4, 5));
        let run = |from: usize, to: usize, state: &Array| {
            gated_delta(
                &arr(mixed[from * d.mixed_width()..to * d.mixed_width()].to_vec(), &[to - from, d.mixed_width()]),
                &arr(a[from * 4..to * 4].to_vec(), &[to - from, 4]),
                &arr(b[from * 4..to * 4].to_vec(), &[to - from, 4]),
                &arr(a_log.clone(), &[4]),
                &arr(dt.clone(), &[4]),
                state,
                d,
            )
            .unwrap()
        };
        let zero = Array::zeros(&[4, 6, 8], crate::DType::F32);
        let (y_all, s_all) = run(0, l, &zero);
        let (y1, s1) = run(0, 3, &zero);
        let (y2, s2) = run(3, l, &s1);
        // Reference: direct formulas, one position at a time.
        let mut state = vec![0f64; 4 * 6 * 8];
        let mut expect = vec![];
        for t in 0..l {
            let row = &mixed[t * d.mixed_width()..(t + 1) * d.mixed_width()];
            for h in 0..4 {
                let kh = h / 2;
                let norm = |x: &[f32], scale: f64| -> Vec<f64> {
                    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
                    x.iter().map(|&v| v as f64 / (ss + 1e-6).sqrt() * scale).collect()
                };
                let q = norm(&row[kh * 8..kh * 8 + 8], 8f64.powf(-0.5));
                let k = norm(&row[16 + kh * 8..16 + kh * 8 + 8], 1.0);
                let v = &row[32 + h * 6..32 + h * 6 + 6];
                let x = (a[t * 4 + h] + dt[h]) as f64;
                let g = (-(a_log[h] as f64).exp() * (1.0 + x.exp()).ln()).exp();
                let beta = 1.0 / (1.0 + (-(b[t * 4 + h] as f64)).exp());
                let s = &mut state[h * 48..(h + 1) * 48];
                for r in 0..6 {
                    let srow = &mut s[r * 8..(r + 1) * 8];
                    srow.iter_mut().for_each(|x| *x *= g);
                    let mem: f64 = srow.iter().zip(&k).map(|(s, k)| s * k).sum();
                    let delta = (v[r] as f64 - mem) * beta;
                    srow.iter_mut().zip(&k).for_each(|(s, k)| *s += k * delta);
                    expect.push(srow.iter().zip(&q).map(|(s, q)| s * q).sum::<f64>());
                }
            }
        }
        let close = |ours: &[f32], theirs: &[f64]| {
            assert_eq!(ours.len(), theirs.len());
            for (o, t) in ours.iter().zip(theirs) {
                assert!((*o as f64 - t).abs() < 1e-5 * (1.0 + t.abs()), "{o} vs {t}");
            }
        };
        close(&y_all.to_vec::<f32>().unwrap(), &expect);
        close(&s_all.to_vec::<f32>().unwrap(), &state);
        let mut joined = y1.to_vec::<f32>().unwrap();
        joined.extend(y2.to_vec::<f32>().unwrap());
        assert_eq!(joined, y_all.to_vec::<f32>().unwrap(), "prefill in two calls equals one");
        assert_eq!(s2.to_vec::<f32>().unwrap(), s_all.to_vec::<f32>().unwrap());
    }

    /// Large enough to run one head per pool task: equal to the scalar reference run one head
    /// after another (up to summation order).
    #[test]
    fn threaded_simd_heads_equal_the_scalar_reference() {
        let d = GatedDeltaDims { key_heads: 4, value_heads: 8, key_dim: 64, value_dim: 64 };
        let l = 5;
        let wave = |n: usize, f: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * f).sin()).collect() };
        let (mixed, a, b) = (wave(l * d.mixed_width(), 0.37), wave(l * 8, 0.11), wave(l * 8, 0.53));
        let (a_log, dt, state) = (wave(8, 0.7), wave(8, 0.9), wave(8 * 64 * 64, 0.013));
        let arr = |v: &[f32], shape: &[usize]| Array::from_slice(v, shape).unwrap();
        assert!(8 * (64 * 64 + l * 64) * 4 >= PAR_MIN_WORK, "the op must take its threaded path");
        let (y, next) = gated_delta(
            &arr(&mixed, &[l, d.mixed_width()]),
            &arr(&a, &[l, 8]),
            &arr(&b, &[l, 8]),
            &arr(&a_log, &[8]),
            &arr(&dt, &[8]),
            &arr(&state, &[8, 64, 64]),
            d,
        )
        .unwrap();
        let inputs = prepare(&mixed, &a, &b, &a_log, &dt, l, d);
        let (y, next) = (y.to_vec::<f32>().unwrap(), next.to_vec::<f32>().unwrap());
        for h in 0..8 {
            let mut s = state[h * 4096..(h + 1) * 4096].to_vec();
            let mut out = vec![0f32; l * 64];
            recur_head(&inputs, h, l, d, &mut s, &mut out, false);
            let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| (a - b).abs() <= 1e-5 * (1.0 + b.abs()));
            assert!(close(&s, &next[h * 4096..(h + 1) * 4096]), "head {h}: state");
            for t in 0..l {
                assert!(close(&out[t * 64..(t + 1) * 64], &y[(t * 8 + h) * 64..(t * 8 + h + 1) * 64]), "head {h}, {t}");
            }
        }
    }

    #[test]
    fn conv_continues_across_calls_and_checks_shapes() {
        let (c, k, l) = (3, 4, 6);
        let x: Vec<f32> = (0..l * c).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..c * k).map(|i| (i as f32 * 0.71).cos()).collect();
        let arr = |v: &[f32], shape: &[usize]| Array::from_slice(v, shape).unwrap();
        let zero = Array::zeros(&[k - 1, c], crate::DType::F32);
        let (all, s_all) = causal_conv1d_silu(&arr(&x, &[l, c]), &zero, &arr(&w, &[c, k])).unwrap();
        let all = all.to_vec::<f32>().unwrap();
        for t in 0..l {
            for ch in 0..c {
                let acc: f32 =
                    (0..k).map(|j| (t + j).checked_sub(k - 1).map_or(0.0, |p| x[p * c + ch]) * w[ch * k + j]).sum();
                assert!((all[t * c + ch] - silu(acc)).abs() < 1e-6);
            }
        }
        // One position at a time, each from the state the previous call returned.
        let mut state = zero;
        let mut steps = vec![];
        for t in 0..l {
            let (y, s) = causal_conv1d_silu(&arr(&x[t * c..(t + 1) * c], &[1, c]), &state, &arr(&w, &[c, k])).unwrap();
            steps.extend(y.to_vec::<f32>().unwrap());
            state = s;
        }
        assert_eq!(steps, all);
        assert_eq!(state.to_vec::<f32>().unwrap(), s_all.to_vec::<f32>().unwrap());
        assert!(causal_conv1d_silu(&arr(&x, &[l, c]), &arr(&[0.0; 6], &[2, 3]), &arr(&w, &[c, k])).is_err());
    }
}
