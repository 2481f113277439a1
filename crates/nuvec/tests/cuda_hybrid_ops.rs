//! The ops of Qwen3.5 hybrids (Gated DeltaNet: `causal_conv1d_silu`, `gated_delta`,
//! `sigmoid_mul`) and of gpt-oss (`attention_sinks`, `swiglu_oai`), and sliding-window attention
//! (`attention_window`: gpt-oss, Gemma 4), on CUDA against the CPU
//! backend (itself checked against mlx-lm and against the ops' definitions), on random inputs.
//!
//! Needs a CUDA device: without one every test FAILS, saying so (it never passes silently). Built
//! only with `--features cuda`. Tolerance as tests/cuda_ops.rs: float results must satisfy
//! `|gpu - cpu| <= 1e-4 * (|cpu| + mean|cpu|)` per element; copies (the convolution's next
//! state) must match bit for bit. Each case prints a `RESULT` line (run with `--nocapture`).

#![cfg(feature = "cuda")]

use nuvec::{Array, DType, Device, GatedDeltaDims};

mod common;
use common::{arr, close, exact, floats, Rng};

/// The device under test. Compared at f32 tolerance: the prefill products (64+ query attention
/// here) in f32.
fn gpu() -> Device {
    common::gpu_with(nuvec::backends::cuda::MatmulPrecision::F32)
}

fn to_gpu(a: &Array) -> Array {
    a.to_device(gpu()).unwrap()
}

#[test]
fn causal_conv1d_silu_continues_across_calls() {
    // Two calls per case, the second from the state the first returned (on each device), with a
    // non-zero starting state; K = 4 as Qwen3.5, and 2 and 1 (no state rows) for the edges.
    let mut rng = Rng::new(21);
    for (l1, l2, c, k) in [
        (1usize, 1usize, 96usize, 4usize),
        (37, 1, 96, 4),
        (37, 37, 200, 4),
        (2, 5, 640, 4),
        (5, 3, 33, 2),
        (4, 2, 10, 1),
    ] {
        for wdtype in [DType::F32, DType::F16, DType::BF16] {
            let w = floats(&rng.vec(c * k, 0.5), &[c, k], wdtype);
            let state = arr(&rng.vec((k - 1) * c, 1.0), &[k - 1, c]);
            let (x1, x2) = (arr(&rng.vec(l1 * c, 2.0), &[l1, c]), arr(&rng.vec(l2 * c, 2.0), &[l2, c]));
            let (want1, wstate1) = x1.causal_conv1d_silu(&state, &w).unwrap();
            let (want2, wstate2) = x2.causal_conv1d_silu(&wstate1, &w).unwrap();
            let wg = to_gpu(&w);
            let (got1, gstate1) = to_gpu(&x1).causal_conv1d_silu(&to_gpu(&state), &wg).unwrap();
            let (got2, gstate2) = to_gpu(&x2).causal_conv1d_silu(&gstate1, &wg).unwrap();
            let case = format!("conv1d_silu C={c} K={k} weight {wdtype}");
            close(&format!("{case} L={l1}"), &got1, &want1);
            exact(&format!("{case} L={l1} state"), &gstate1, &wstate1);
            close(&format!("{case} then L={l2}"), &got2, &want2);
            exact(&format!("{case} then L={l2} state"), &gstate2, &wstate2);
        }
    }
    // Shapes that do not fit are errors, as on the CPU.
    let (x, w) = (to_gpu(&arr(&rng.vec(6 * 3, 1.0), &[6, 3])), to_gpu(&arr(&rng.vec(12, 1.0), &[3, 4])));
    assert!(x.causal_conv1d_silu(&to_gpu(&arr(&[0.0; 6], &[2, 3])), &w).is_err(), "state of 2 rows for K = 4");
    assert!(x.causal_conv1d_silu(&to_gpu(&arr(&[0.0; 12], &[3, 4])), &w).is_err(), "state of 4 channels for 3");
    let e = x.causal_conv1d_silu(&arr(&[0.0; 9], &[3, 3]), &w).unwrap_err().to_string();
    assert!(e.contains("causal_conv1d_silu") && e.contains("cpu"), "a state on the host is an error: {e}");
}

#[test]
fn sigmoid_mul_elementwise() {
    let mut rng = Rng::new(22);
    for shape in [vec![1usize, 64], vec![37, 4, 16], vec![3, 1000]] {
        let n: usize = shape.iter().product();
        let (gate, x) = (arr(&rng.vec(n, 8.0), &shape), arr(&rng.vec(n, 3.0), &shape));
        let want = x.sigmoid_mul(&gate).unwrap();
        let got = to_gpu(&x).sigmoid_mul(&to_gpu(&gate)).unwrap();
        close(&format!("sigmoid_mul {shape:?}"), &got, &want);
    }
    let (a, b) = (to_gpu(&arr(&[1.0; 6], &[2, 3])), to_gpu(&arr(&[1.0; 6], &[3, 2])));
    assert!(a.sigmoid_mul(&b).is_err(), "shapes that differ are an error");
}

/// One random Gated DeltaNet step's inputs for `l` positions.
struct DeltaInputs {
    mixed: Array,
    a: Array,
    b: Array,
}

fn delta_inputs(rng: &mut Rng, l: usize, d: GatedDeltaDims) -> DeltaInputs {
    let hv = d.value_heads;
    DeltaInputs {
        mixed: arr(&rng.vec(l * d.mixed_width(), 1.0), &[l, d.mixed_width()]),
        a: arr(&rng.vec(l * hv, 3.0), &[l, hv]),
        b: arr(&rng.vec(l * hv, 3.0), &[l, hv]),
    }
}

#[test]
fn gated_delta_matches_the_cpu_and_carries_its_state() {
    // Per case: a first call from a random state, then a second from the state it returned (on
    // each device); outputs and both states compared. Hv = Hk and Hv = 2 Hk (and 3 Hk), Dk and Dv
    // from 16 to 128 (rows not a multiple of the kernel's 16 per block: Dv 40, 96), L = 1 and 37,
    // the per-head parameters in each float dtype.
    let mut rng = Rng::new(23);
    let cases = [
        // (Hk, Hv, Dk, Dv, L1, L2)
        (2usize, 2usize, 16usize, 16usize, 1usize, 1usize),
        (2, 4, 16, 16, 37, 1),
        (1, 2, 32, 40, 37, 37),
        (2, 6, 64, 96, 5, 1),
        (4, 8, 64, 64, 1, 37),
        (2, 4, 128, 128, 37, 1),
        (16, 32, 128, 128, 1, 1),
        (3, 3, 48, 24, 37, 2),
    ];
    for (hk, hv, dk, dv, l1, l2) in cases {
        let d = GatedDeltaDims { key_heads: hk, value_heads: hv, key_dim: dk, value_dim: dv };
        for pdtype in [DType::F32, DType::BF16, DType::F16] {
            let a_log = floats(&rng.vec(hv, 1.0), &[hv], pdtype);
            let dt_bias = floats(&rng.vec(hv, 1.0), &[hv], pdtype);
            let state = arr(&rng.vec(hv * dv * dk, 0.3), &[hv, dv, dk]);
            let (s1, s2) = (delta_inputs(&mut rng, l1, d), delta_inputs(&mut rng, l2, d));
            let cpu = |s: &DeltaInputs, state: &Array| {
                nuvec::gated_delta(&s.mixed, [&s.a, &s.b], [&a_log, &dt_bias], state, d).unwrap()
            };
            let (al, dt) = (to_gpu(&a_log), to_gpu(&dt_bias));
            let gpu_step = |s: &DeltaInputs, state: &Array| {
                let (m, a, b) = (to_gpu(&s.mixed), to_gpu(&s.a), to_gpu(&s.b));
                nuvec::gated_delta(&m, [&a, &b], [&al, &dt], state, d).unwrap()
            };
            let (want1, wstate1) = cpu(&s1, &state);
            let (want2, wstate2) = cpu(&s2, &wstate1);
            let (got1, gstate1) = gpu_step(&s1, &to_gpu(&state));
            let (got2, gstate2) = gpu_step(&s2, &gstate1);
            let case = format!("gated_delta Hk={hk} Hv={hv} Dk={dk} Dv={dv} params {pdtype}");
            close(&format!("{case} L={l1}"), &got1, &want1);
            close(&format!("{case} L={l1} state"), &gstate1, &wstate1);
            close(&format!("{case} then L={l2}"), &got2, &want2);
            close(&format!("{case} then L={l2} state"), &gstate2, &wstate2);
        }
    }
    // From a zero state, as a sequence starts, with a_log and dt_bias of different dtypes.
    let d = GatedDeltaDims { key_heads: 2, value_heads: 4, key_dim: 128, value_dim: 128 };
    let s = delta_inputs(&mut rng, 37, d);
    let (a_log, dt_bias) = (floats(&rng.vec(4, 1.0), &[4], DType::F32), floats(&rng.vec(4, 1.0), &[4], DType::BF16));
    let zero = Array::zeros(&[4, 128, 128], DType::F32);
    let (want, wstate) = nuvec::gated_delta(&s.mixed, [&s.a, &s.b], [&a_log, &dt_bias], &zero, d).unwrap();
    let (got, gstate) = nuvec::gated_delta(
        &to_gpu(&s.mixed),
        [&to_gpu(&s.a), &to_gpu(&s.b)],
        [&to_gpu(&a_log), &to_gpu(&dt_bias)],
        &Array::zeros_on(&[4, 128, 128], DType::F32, gpu()).unwrap(),
        d,
    )
    .unwrap();
    close("gated_delta from zeros, a_log f32 and dt_bias bf16, L=37", &got, &want);
    close("gated_delta from zeros, a_log f32 and dt_bias bf16, L=37 state", &gstate, &wstate);
    // Shapes that do not fit are errors, as on the CPU.
    let bad = GatedDeltaDims { key_heads: 3, value_heads: 4, key_dim: 16, value_dim: 16 };
    let g = |a: &Array| to_gpu(a);
    let e = nuvec::gated_delta(
        &g(&s.mixed),
        [&g(&s.a), &g(&s.b)],
        [&g(&a_log), &g(&dt_bias)],
        &g(&Array::zeros(&[4, 16, 16], DType::F32)),
        bad,
    );
    assert!(e.is_err(), "value heads not a multiple of key heads");
    let e = nuvec::gated_delta(
        &g(&s.mixed),
        [&g(&s.a), &g(&s.b)],
        [&g(&a_log), &g(&dt_bias)],
        &g(&Array::zeros(&[4, 128, 64], DType::F32)),
        d,
    );
    assert!(e.is_err(), "a state of the wrong shape");
}

#[test]
fn attention_sinks_every_path() {
    // Decode and short chunks (split keys), 64+ queries (SGEMM + softmax), the fallback kernel
    // (a head size not a multiple of 4), GQA; sinks from well below to well above the scores.
    let dev = gpu();
    let mut rng = Rng::new(24);
    for (l, kv, hq, hkv, d) in [
        (1usize, 1usize, 4usize, 2usize, 64usize),
        (1, 1000, 32, 8, 128),
        (1, 77, 8, 1, 16),
        (3, 700, 8, 8, 128),
        (37, 300, 4, 4, 16),
        (2, 50, 4, 2, 30),
        (1, 77, 4, 1, 30),
        (64, 64, 4, 1, 64),
        (100, 357, 8, 2, 128),
        (300, 300, 2, 2, 256),
    ] {
        let cap = kv + 5;
        let q = arr(&rng.vec(l * hq * d, 1.0), &[l, hq, d]);
        let k = arr(&rng.vec(hkv * cap * d, 1.0), &[hkv, cap, d]);
        let v = arr(&rng.vec(hkv * cap * d, 1.0), &[hkv, cap, d]);
        let scale = 1.0 / (d as f32).sqrt();
        let mut sinks = rng.vec(hq, 3.0);
        sinks[0] = 12.0; // dominates the softmax
        if hq > 1 {
            sinks[1] = -12.0; // all but vanishes
        }
        let want = nuvec::attention_sinks(&q, &k, &v, kv, scale, &sinks).unwrap();
        let (qg, kg, vg) = (q.to_device(dev).unwrap(), k.to_device(dev).unwrap(), v.to_device(dev).unwrap());
        let got = nuvec::attention_sinks(&qg, &kg, &vg, kv, scale, &sinks).unwrap();
        close(&format!("attention_sinks L={l} kv={kv} Hq={hq} Hkv={hkv} D={d}"), &got, &want);
        // Plain attention on the same inputs stays as it was (no sink).
        let plain = nuvec::attention(&qg, &kg, &vg, kv, scale).unwrap();
        close(
            &format!("attention (no sinks) L={l} kv={kv} Hq={hq} Hkv={hkv} D={d}"),
            &plain,
            &nuvec::attention(&q, &k, &v, kv, scale).unwrap(),
        );
        let e = nuvec::attention_sinks(&qg, &kg, &vg, kv, scale, &sinks[1..]).unwrap_err().to_string();
        assert!(e.contains("attention_sinks"), "one sink short: {e}");
    }
}

#[test]
fn attention_window_every_path() {
    // A sliding layer's prefill chunk: 64+ queries through SGEMM and the windowed softmax, fewer
    // (and a head size the SGEMM path does not take) one query at a time over its own
    // positions; windows of one position, shorter and longer than a block of queries, and one
    // reaching every position (plain causal); with and without sinks.
    let mut rng = Rng::new(26);
    for (l, kv, hq, hkv, d, window) in [
        (64usize, 64usize, 4usize, 1usize, 64usize, 8usize),
        (100, 357, 8, 2, 128, 128),
        (300, 300, 2, 2, 64, 1),
        (600, 600, 8, 2, 64, 128),
        (37, 300, 4, 4, 16, 20),
        (70, 90, 4, 2, 30, 33),
        (80, 80, 4, 2, 64, 500),
    ] {
        let cap = kv + 5;
        let q = arr(&rng.vec(l * hq * d, 1.0), &[l, hq, d]);
        let k = arr(&rng.vec(hkv * cap * d, 1.0), &[hkv, cap, d]);
        let v = arr(&rng.vec(hkv * cap * d, 1.0), &[hkv, cap, d]);
        let scale = 1.0 / (d as f32).sqrt();
        let mut sinks = rng.vec(hq, 3.0);
        sinks[0] = 12.0;
        let (qg, kg, vg) = (to_gpu(&q), to_gpu(&k), to_gpu(&v));
        for sinks in [None, Some(&sinks[..])] {
            let want = nuvec::attention_window(&q, &k, &v, kv, scale, window, sinks).unwrap();
            let got = nuvec::attention_window(&qg, &kg, &vg, kv, scale, window, sinks).unwrap();
            let case =
                format!("attention_window L={l} kv={kv} Hq={hq} Hkv={hkv} D={d} w={window} sinks={}", sinks.is_some());
            close(&case, &got, &want);
        }
    }
    let (qg, kg) = (
        to_gpu(&arr(&rng.vec(64 * 4 * 64, 1.0), &[64, 4, 64])),
        to_gpu(&arr(&rng.vec(64 * 4 * 64, 1.0), &[1, 256, 64])),
    );
    let e = nuvec::attention_window(&qg, &kg, &kg, 64, 0.125, 0, None).unwrap_err().to_string();
    assert!(e.contains("window of 0"), "{e}");
}

#[test]
fn swiglu_oai_clamps() {
    let mut rng = Rng::new(25);
    for shape in [vec![1usize, 64], vec![37, 200], vec![5, 2880]] {
        let n: usize = shape.iter().product();
        // Values well past the clamp (limit 7) on both sides.
        let (gate, up) = (arr(&rng.vec(n, 12.0), &shape), arr(&rng.vec(n, 12.0), &shape));
        for (alpha, limit) in [(1.702f32, 7.0f32), (1.0, 0.5)] {
            let want = gate.swiglu_oai(&up, alpha, limit).unwrap();
            let got = to_gpu(&gate).swiglu_oai(&to_gpu(&up), alpha, limit).unwrap();
            close(&format!("swiglu_oai {shape:?} alpha={alpha} limit={limit}"), &got, &want);
        }
    }
    let (a, b) = (to_gpu(&arr(&[1.0; 6], &[2, 3])), to_gpu(&arr(&[1.0; 6], &[3, 2])));
    assert!(a.swiglu_oai(&b, 1.702, 7.0).is_err(), "shapes that differ are an error");
    assert!(a.swiglu_oai(&a, 1.702, -1.0).is_err(), "a negative limit is an error");
}
