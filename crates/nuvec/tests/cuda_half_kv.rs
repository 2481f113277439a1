//! Keys and values kept in f16 or bf16 on a CUDA device, against the CPU backend holding the same
//! half-precision caches: the writes round f32 rows to the cache's type bit for bit as the CPU
//! does (`write_axis1`, `write_axis1_from_rows`, `write_kv_rows`, the rope kernels' cache writes,
//! `astype`), copies keep them (`transpose01`, `slice_rows`), and every attention path widens each
//! value as it reads it: decode (split keys), short chunks, long chunks (the half rows widened for
//! SGEMM), the one-block fallback, the paged decode kernel. Attention matches the CPU's at f32
//! rounding (tests/cuda_ops.rs's tolerance); the paged decode of each sequence equals, bit for
//! bit, the GPU's decode of that sequence over a contiguous cache of the same type.
//!
//! Needs a CUDA device: without one every test FAILS, saying so. Built only with `--features cuda`.

#![cfg(feature = "cuda")]

use nuvec::backends::cuda::MatmulPrecision;
use nuvec::{Array, DType, Device};

mod common;
use common::{arr, close, exact, floats, gather_paged, scattered_tables, Rng};

const HALVES: [DType; 2] = [DType::F16, DType::BF16];

fn gpu() -> Device {
    common::gpu_with(MatmulPrecision::F32)
}

#[test]
fn writes_round_as_the_cpu_does_and_copies_keep_the_type() {
    let dev = gpu();
    let mut rng = Rng::new(31);
    let to = |a: &Array| a.to_device(dev).unwrap();
    for dtype in HALVES {
        let dst = floats(&rng.vec(2 * 50 * 16, 1.0), &[2, 50, 16], dtype);
        let src = arr(&rng.vec(2 * 37 * 16, 3.0), &[2, 37, 16]);
        let mut want = dst.clone();
        want.write_axis1(&src, 5).unwrap();
        let mut got = to(&dst);
        got.write_axis1(&to(&src), 5).unwrap();
        exact(&format!("write_axis1 f32 into {dtype}"), &got, &want);
        // A half source into a half cache (a cache growing): the values as they are.
        let half_src = floats(&rng.vec(2 * 7 * 16, 1.0), &[2, 7, 16], dtype);
        let (mut want, mut got) = (dst.clone(), to(&dst));
        want.write_axis1(&half_src, 40).unwrap();
        got.write_axis1(&to(&half_src), 40).unwrap();
        exact(&format!("write_axis1 {dtype} into {dtype}"), &got, &want);

        let rows = arr(&rng.vec(37 * 2 * 16, 3.0), &[37, 2, 16]);
        let (mut want, mut got) = (dst.clone(), to(&dst));
        want.write_axis1_from_rows(&rows, 9).unwrap();
        got.write_axis1_from_rows(&to(&rows), 9).unwrap();
        exact(&format!("write_axis1_from_rows f32 into {dtype}"), &got, &want);

        let (mut wk, mut wv, mut gk, mut gv) = (dst.clone(), dst.clone(), to(&dst), to(&dst));
        let vals = arr(&rng.vec(37 * 2 * 16, 3.0), &[37, 2, 16]);
        wk.write_kv_rows(&mut wv, &rows, &vals, 11).unwrap();
        gk.write_kv_rows(&mut gv, &to(&rows), &to(&vals), 11).unwrap();
        exact(&format!("write_kv_rows keys into {dtype}"), &gk, &wk);
        exact(&format!("write_kv_rows values into {dtype}"), &gv, &wv);

        exact(&format!("transpose01 {dtype}"), &to(&dst).transpose01().unwrap(), &dst.transpose01().unwrap());
        exact(&format!("slice_rows {dtype}"), &to(&dst).slice_rows(1, 2).unwrap(), &dst.slice_rows(1, 2).unwrap());

        let wide = arr(&rng.vec(1000, 70000.0), &[10, 100]);
        let narrowed = to(&wide).astype(dtype).unwrap();
        assert_eq!(narrowed.device(), dev, "astype stays on the GPU");
        exact(&format!("astype f32 -> {dtype}"), &narrowed, &wide.astype(dtype).unwrap());
        exact(
            &format!("astype {dtype} -> f32"),
            &to(&dst).astype(DType::F32).unwrap(),
            &dst.astype(DType::F32).unwrap(),
        );
    }
}

#[test]
fn rope_writes_round_keys_and_values_into_half_caches() {
    let dev = gpu();
    let mut rng = Rng::new(37);
    let (l, hq, hkv, d, cap, at) = (3usize, 8usize, 2usize, 64usize, 20usize, 4usize);
    let inv_freqs: Vec<f32> = (0..d / 2).map(|i| 10000f32.powf(-2.0 * i as f32 / d as f32)).collect();
    let q = arr(&rng.vec(l * hq * d, 1.0), &[l, hq, d]).to_device(dev).unwrap();
    let k = arr(&rng.vec(l * hkv * d, 1.0), &[l, hkv, d]).to_device(dev).unwrap();
    let v = arr(&rng.vec(l * hkv * d, 1.0), &[l, hkv, d]).to_device(dev).unwrap();
    for dtype in HALVES {
        let before = floats(&rng.vec(hkv * cap * d, 1.0), &[hkv, cap, d], dtype);
        // The fused rope and cache write against the GPU's rope then the CPU's rounding write.
        let (mut kc, mut vc) = (before.to_device(dev).unwrap(), before.to_device(dev).unwrap());
        let qo = nuvec::rope_qk_write_kv(&q, &k, &v, None, &inv_freqs, 100, false, (&mut kc, &mut vc, at)).unwrap();
        let (qr, kr) = nuvec::rope_qk(&q, &k, None, &inv_freqs, 100, false).unwrap();
        exact(&format!("rope_qk_write_kv queries ({dtype} caches)"), &qo, &qr);
        let (mut wk, mut wv) = (before.clone(), before.clone());
        let host = |a: &Array| a.to_device(Device::Cpu).unwrap();
        wk.write_axis1_from_rows(&host(&kr), at).unwrap();
        wv.write_axis1_from_rows(&host(&v), at).unwrap();
        exact(&format!("rope_qk_write_kv keys into {dtype}"), &host(&kc), &wk);
        exact(&format!("rope_qk_write_kv values into {dtype}"), &host(&vc), &wv);

        // A paged decode step's writes: row i at its own position, into store row slots[i].
        let (positions, slots) = ([0usize, 9, 300], [7usize, 0, 19]);
        let store = floats(&rng.vec(cap * hkv * d, 1.0), &[1, cap, hkv * d], dtype);
        let (mut ks, mut vs) = (store.to_device(dev).unwrap(), store.to_device(dev).unwrap());
        let qp =
            nuvec::rope_qk_write_paged(&q, &k, &v, None, &inv_freqs, false, (&positions, &slots), (&mut ks, &mut vs))
                .unwrap();
        let (mut wk, mut wv) = (store.clone(), store.clone());
        for i in 0..l {
            let (qi, ki) = (q.slice_rows(i, i + 1).unwrap(), k.slice_rows(i, i + 1).unwrap());
            let (qr, kr) = nuvec::rope_qk(&qi, &ki, None, &inv_freqs, positions[i], false).unwrap();
            exact(&format!("paged rope row {i} query ({dtype} stores)"), &qp.slice_rows(i, i + 1).unwrap(), &qr);
            wk.write_axis1(&host(&kr).reshape(&[1, 1, hkv * d]).unwrap(), slots[i]).unwrap();
            let vi = host(&v.slice_rows(i, i + 1).unwrap()).reshape(&[1, 1, hkv * d]).unwrap();
            wv.write_axis1(&vi, slots[i]).unwrap();
        }
        exact(&format!("paged rope keys into {dtype}"), &host(&ks), &wk);
        exact(&format!("paged rope values into {dtype}"), &host(&vs), &wv);
    }
}

#[test]
fn attention_over_half_caches_matches_the_cpu() {
    let dev = gpu();
    let mut rng = Rng::new(41);
    for dtype in HALVES {
        // Decode, a short chunk, long chunks (widened for SGEMM), the fallback (D = 30).
        for (l, kv, hq, hkv, d) in [
            (1usize, 1000usize, 32usize, 8usize, 128usize),
            (1, 1, 4, 2, 64),
            (3, 700, 8, 8, 128),
            (100, 357, 8, 2, 128),
            (2, 50, 4, 2, 30),
        ] {
            let cap = kv + 5;
            let q = arr(&rng.vec(l * hq * d, 1.0), &[l, hq, d]);
            let k = floats(&rng.vec(hkv * cap * d, 1.0), &[hkv, cap, d], dtype);
            let v = floats(&rng.vec(hkv * cap * d, 1.0), &[hkv, cap, d], dtype);
            let scale = 1.0 / (d as f32).sqrt();
            let want = nuvec::attention(&q, &k, &v, kv, scale).unwrap();
            let (qg, kg, vg) = (q.to_device(dev).unwrap(), k.to_device(dev).unwrap(), v.to_device(dev).unwrap());
            let got = nuvec::attention(&qg, &kg, &vg, kv, scale).unwrap();
            close(&format!("attention over {dtype} L={l} kv={kv} Hq={hq} Hkv={hkv} D={d}"), &got, &want);
        }
    }
}

#[test]
fn paged_decode_over_half_stores_equals_each_contiguous_decode() {
    let dev = gpu();
    let mut rng = Rng::new(43);
    let (hq, hkv, d, bs, blocks) = (8usize, 2usize, 128usize, 16usize, 80usize);
    let width = hkv * d;
    let lens = [1usize, 16, 33, 200, 700];
    let tables = scattered_tables(&lens, bs, blocks);
    let seqs: Vec<nuvec::PagedSeq> = tables.iter().zip(lens).map(|(t, len)| nuvec::PagedSeq::new(t, len)).collect();
    let q = arr(&rng.vec(lens.len() * hq * d, 1.0), &[lens.len(), hq, d]);
    let scale = 1.0 / (d as f32).sqrt();
    for dtype in HALVES {
        let kf = rng.vec(blocks * bs * width, 1.0);
        let vf = rng.vec(blocks * bs * width, 1.0);
        let (k, v) = (floats(&kf, &[1, blocks * bs, width], dtype), floats(&vf, &[1, blocks * bs, width], dtype));
        let (qg, kg, vg) = (q.to_device(dev).unwrap(), k.to_device(dev).unwrap(), v.to_device(dev).unwrap());
        let case = format!("paged decode over {dtype} stores");
        let want = nuvec::paged_decode_attention(&q, &k, &v, &seqs, bs, scale, None).unwrap();
        let got = nuvec::paged_decode_attention(&qg, &kg, &vg, &seqs, bs, scale, None).unwrap();
        close(&case, &got, &want);
        let got = got.to_f32_vec().unwrap();
        for (i, (table, &len)) in tables.iter().zip(&lens).enumerate() {
            // This sequence's rows as a contiguous cache [Hkv, len, D] of the same type.
            let gather = |x: &[f32]| {
                floats(&gather_paged(x, table, len, bs, hkv, d), &[hkv, len, d], dtype).to_device(dev).unwrap()
            };
            let qi = q.slice_rows(i, i + 1).unwrap().to_device(dev).unwrap();
            let solo = nuvec::attention(&qi, &gather(&kf), &gather(&vf), len, scale).unwrap().to_f32_vec().unwrap();
            let row = &got[i * hq * d..(i + 1) * hq * d];
            let same = row.iter().zip(&solo).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{case}: sequence {i} (len {len}) differs from its own decode");
        }
        eprintln!("RESULT {case}: every sequence bit for bit its own decode");
    }
}
