//! `StepGraph` (a decode step captured as a CUDA graph, replayed at later positions) against the
//! same step run eagerly (feature `cuda`; needs an NVIDIA GPU; run with one test thread).
//!
//! The step is a miniature attention layer built from the position-dependent ops: a one-token
//! embedding, `rope_qk` and `rope`, `write_kv_rows` into a cache, attention over it, and the
//! projections around them. Replays use the eager path's kernels, reading the step's position
//! and token from the graph's step scalars (and split attention its eager chunk, from the device
//! kv length), so each step's output must equal the eager one bit for bit, at every position up
//! to 900 (with 8 query heads the split count changes every 32 positions; with 32 the chunk grows
//! past 32 keys from kv length 513 on). Head size 64 takes the split-key attention kernels, which
//! read the step scalars: no node is patched per replay. Head size 6 takes the fallback kernel,
//! whose one node per replay is patched from the host. Also: what a capture must refuse (an
//! upload, a buffer outliving it), and that the device works normally after a refused capture.
#![cfg(feature = "cuda")]

use nuvec::backends::cuda::StepGraph;
use nuvec::{attention, rope_qk, Array, DType, Matrix};

const VOCAB: usize = 300;
const HKV: usize = 2;
const CAP: usize = 1024;

mod common;
use common::{gpu, randoms};

struct Layer {
    embed: Matrix,
    wk: Matrix,
    wv: Matrix,
    wo: Matrix,
    freqs: Vec<f32>,
    d: usize,
    hq: usize,
}

impl Layer {
    fn new(d: usize, hq: usize) -> Self {
        let dev = gpu();
        let m = |rows: usize, cols: usize, seed: u64| {
            Matrix::Dense(Array::from_slice_on(&randoms(rows * cols, seed, 1.0), &[rows, cols], dev).unwrap())
        };
        let freqs = (0..d / 2).map(|i| 10000f32.powf(-((2 * i) as f32) / d as f32)).collect();
        Layer {
            embed: m(VOCAB, hq * d, 1),
            wk: m(HKV * d, hq * d, 2),
            wv: m(HKV * d, hq * d, 3),
            wo: m(VOCAB, hq * d, 4),
            freqs,
            d,
            hq,
        }
    }

    fn caches(&self) -> (Array, Array) {
        let z = || Array::zeros_on(&[HKV, CAP, self.d], DType::F32, gpu()).unwrap();
        (z(), z())
    }

    /// One decode step at `pos` with `token`: logits `[1, VOCAB]`.
    fn step(&self, pos: usize, token: u32, kc: &mut Array, vc: &mut Array) -> nuvec::Result<Array> {
        let d = self.d;
        let x = self.embed.embed(&[token])?;
        let k = x.linear(&self.wk)?.reshape(&[1, HKV, d])?;
        let v = x.linear(&self.wv)?.reshape(&[1, HKV, d])?;
        let q = x.reshape(&[1, self.hq, d])?;
        let (q, k) = rope_qk(&q, &k, None, &self.freqs, pos, false)?;
        // The separate rope kernel too (a second rotation; any function of the position will do).
        let q = q.rope(&self.freqs, pos, true)?;
        kc.write_kv_rows(vc, &k, &v, pos)?;
        let o = attention(&q, kc, vc, pos + 1, 1.0 / (d as f32).sqrt())?;
        o.linear(&self.wo)
    }
}

fn bits(a: &Array) -> Vec<u32> {
    a.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// Captures the step at position 1 and replays it at 2..900 against the eager step; `patched`:
/// the kernel nodes each replay must set from the host.
fn replays_equal_eager(d: usize, hq: usize, patched: usize) {
    let layer = Layer::new(d, hq);
    let (mut ke, mut ve) = layer.caches();
    let (mut kg, mut vg) = layer.caches();
    let token = |pos: usize| ((pos * 7919 + 13) % VOCAB) as u32;
    // Position 0 eagerly on both (the rope table is uploaded here, which no capture may do).
    let a = layer.step(0, token(0), &mut ke, &mut ve).unwrap();
    let b = layer.step(0, token(0), &mut kg, &mut vg).unwrap();
    assert_eq!(bits(&a), bits(&b), "d {d}: eager position 0");
    let a = layer.step(1, token(1), &mut ke, &mut ve).unwrap();
    let (b, mut graph) =
        StepGraph::capture(0, 1, token(1), &[1, VOCAB], || layer.step(1, token(1), &mut kg, &mut vg)).unwrap();
    assert_eq!(bits(&a), bits(&b), "d {d}: the captured step's own launch");
    // The embedding, rope_qk, rope, the cache write and attention move on by the step scalars
    // (attention only on the split path); the fallback attention kernel is patched.
    assert_eq!(graph.patched_nodes(), patched, "d {d}: patched nodes per replay");
    let sites = graph.step_scalar_sites();
    assert!(sites >= 4 + usize::from(patched == 0), "d {d}: {sites} launch sites read the step scalars");
    let mut held = Vec::new();
    for pos in 2..900 {
        let a = layer.step(pos, token(pos), &mut ke, &mut ve).unwrap();
        let b = graph.replay(pos, token(pos)).unwrap().unwrap_or_else(|| panic!("d {d}: replay refused {pos}"));
        let (x, y) = (bits(&a), bits(&b));
        if let Some(i) = x.iter().zip(&y).position(|(p, q)| p != q) {
            panic!(
                "d {d} hq {hq} position {pos}: logit {i} eager {} replay {}",
                f32::from_bits(x[i]),
                f32::from_bits(y[i])
            );
        }
        // Earlier outputs keep their values while the graph runs again.
        if pos % 100 == 0 {
            held.push((pos, y, b));
        }
    }
    for (pos, y, b) in held {
        assert_eq!(bits(&b), y, "d {d}: the output of position {pos} changed after later replays");
    }
    // The caches hold what the eager steps wrote.
    assert_eq!(bits(&kg), bits(&ke), "d {d}: key caches");
    assert_eq!(bits(&vg), bits(&ve), "d {d}: value caches");
    assert!(graph.replay(0, 1).unwrap().is_none(), "d {d}: a position before the capture");
    assert!(graph.replay(CAP, 1).unwrap().is_none(), "d {d}: a position past the cache's capacity");
    assert!(graph.replay(5, VOCAB as u32).unwrap().is_none(), "d {d}: a token outside the table");
    println!(
        "RESULT d {d} hq {hq}: 898 replays bit-identical to eager ({} patched nodes, {sites} step-scalar sites)",
        graph.patched_nodes()
    );
}

#[test]
fn replays_equal_eager_split_attention() {
    replays_equal_eager(64, 8, 0);
}

#[test]
fn replays_equal_eager_split_attention_long_chunks() {
    replays_equal_eager(64, 32, 0);
}

#[test]
fn replays_equal_eager_fallback_attention() {
    replays_equal_eager(6, 8, 1);
}

#[test]
fn refused_captures_leave_the_device_working() {
    let dev = gpu();
    let layer = Layer::new(64, 8);
    let (mut kc, mut vc) = layer.caches();
    layer.step(0, 1, &mut kc, &mut vc).unwrap();
    // An upload cannot be captured.
    let err = StepGraph::capture(0, 1, 1, &[1, 4], || Array::from_slice_on(&[1f32; 4], &[1, 4], dev)).unwrap_err();
    assert!(err.to_string().contains("cannot be captured"), "{err}");
    // A read to the host neither.
    let err = StepGraph::capture(0, 1, 1, &[1, VOCAB], || -> nuvec::Result<Array> {
        let y = layer.step(1, 1, &mut kc, &mut vc)?;
        y.to_vec::<f32>()?;
        Ok(y)
    })
    .unwrap_err();
    assert!(err.to_string().contains("cannot be captured"), "{err}");
    // A buffer made in the capture must not outlive it.
    let mut escaped = None;
    let err = StepGraph::capture(0, 1, 1, &[1, VOCAB], || -> nuvec::Result<Array> {
        let y = layer.step(1, 1, &mut kc, &mut vc)?;
        escaped = Some(layer.embed.embed(&[2])?);
        Ok(y)
    })
    .unwrap_err();
    assert!(err.to_string().contains("outlive"), "{err}");
    drop(escaped);
    // The wrong output shape.
    let err = StepGraph::capture(0, 1, 1, &[1, 7], || layer.step(1, 1, &mut kc, &mut vc)).unwrap_err();
    assert!(err.to_string().contains("expected f32 [1, 7]"), "{err}");
    // The device works as before, and a buffer dropped during a capture is kept for the graph.
    let (mut ke, mut ve) = layer.caches();
    layer.step(0, 1, &mut ke, &mut ve).unwrap();
    let want = layer.step(1, 1, &mut ke, &mut ve).unwrap();
    let old = Array::zeros_on(&[4096], DType::F32, dev).unwrap();
    let (got, _graph) = StepGraph::capture(0, 1, 1, &[1, VOCAB], || -> nuvec::Result<Array> {
        drop(old);
        layer.step(1, 1, &mut kc, &mut vc)
    })
    .unwrap();
    assert_eq!(bits(&got), bits(&want), "a capture after refused ones");
    println!("RESULT refused captures: upload, host read, escaping buffer, wrong shape; device fine after");
}
