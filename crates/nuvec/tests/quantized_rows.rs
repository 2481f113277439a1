//! The ops over a paged cache's quantized rows as the CPU backend runs them
//! (`backends/cpu/quantized_kv.rs`; tests/cuda_ops.rs holds the CUDA kernels to the same rules):
//! rows quantized into scattered slots are `quantize_affine`'s, other rows kept; rows copied
//! within a store; a sequence's positions read back through its block table are
//! `dequantize_rows`'; decode attention over the stores (each task dequantizing its own rows) is,
//! row by row, attention over each sequence's positions read back; and the inputs each refuses,
//! with the error naming them.

use nuvec::quantize::{dequantize_rows, quantize_affine};
use nuvec::{backend, Array, DType, Device, PagedSeq, QuantMode, QuantSpec, Quantized};

const HEADS: usize = 2;
const DIM: usize = 32;
const COLS: usize = HEADS * DIM;
const BLOCK: usize = 4;
const ROWS: usize = 6 * BLOCK;

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 2001) as f32 / 500.0 - 2.0).collect()
}

fn store(spec: QuantSpec) -> Quantized {
    let zeros = |w, t| Array::zeros(&[ROWS, w], t);
    let g = COLS / spec.group_size;
    Quantized::new(zeros(COLS * spec.bits / 32, DType::U32), zeros(g, DType::F32), zeros(g, DType::F32), spec, COLS)
        .unwrap()
}

fn spec(bits: usize, group_size: usize) -> QuantSpec {
    QuantSpec { mode: QuantMode::Affine, bits, group_size }
}

#[test]
fn rows_quantized_into_slots_are_quantize_affines() {
    for (bits, group) in [(8, 32), (4, 32), (3, 32), (6, 64)] {
        let spec = spec(bits, group);
        let mut s = store(spec);
        let x = values(3 * COLS, bits as u32);
        let slots = [17, 2, 9];
        nuvec::quantize_rows_into(&Array::from_slice(&x, &[3, COLS]).unwrap(), &mut s, &slots).unwrap();
        let want = quantize_affine(&x, 3, COLS, spec, DType::F32).unwrap();
        let (w, g) = (COLS * bits / 32, COLS / group);
        let (words, scales) = (s.packed.to_vec::<u32>().unwrap(), s.scales.to_vec::<f32>().unwrap());
        let (want_words, want_scales) = (want.packed.to_vec::<u32>().unwrap(), want.scales.to_vec::<f32>().unwrap());
        for (i, &slot) in slots.iter().enumerate() {
            assert_eq!(words[slot * w..(slot + 1) * w], want_words[i * w..(i + 1) * w], "{bits}-bit: slot {slot}");
            assert_eq!(scales[slot * g..(slot + 1) * g], want_scales[i * g..(i + 1) * g], "{bits}-bit: slot {slot}");
        }
        let untouched = (0..ROWS).filter(|r| !slots.contains(r));
        assert!(untouched.clone().all(|r| words[r * w..(r + 1) * w].iter().all(|&v| v == 0)), "{bits}-bit: other rows");
        // Block 2 (rows 8-11, slot 9 among them) copied over block 5.
        let backend = backend(Device::Cpu);
        for part in [&mut s.packed, &mut s.scales, &mut s.biases] {
            backend.copy_rows_within(part, 2 * BLOCK, 5 * BLOCK, BLOCK).unwrap();
        }
        let copied = s.packed.to_vec::<u32>().unwrap();
        assert_eq!(copied[20 * w..24 * w], copied[8 * w..12 * w], "{bits}-bit: the copied block");
    }
}

#[test]
fn positions_read_back_and_attended_through_block_tables() {
    let spec = spec(8, 32);
    let (mut k, mut v) = (store(spec), store(spec));
    let all: Vec<usize> = (0..ROWS).collect();
    nuvec::quantize_rows_into(&Array::from_slice(&values(ROWS * COLS, 1), &[ROWS, COLS]).unwrap(), &mut k, &all)
        .unwrap();
    nuvec::quantize_rows_into(&Array::from_slice(&values(ROWS * COLS, 2), &[ROWS, COLS]).unwrap(), &mut v, &all)
        .unwrap();
    let tables: [&[u32]; 2] = [&[4, 1, 3], &[0, 5]];
    let lens = [11usize, 5];
    // Positions 2..9 of the first sequence, against the host's rule in [heads, positions, dim].
    let got = nuvec::dequantize_paged(&k, HEADS, tables[0], BLOCK, 2, 9).unwrap();
    let (words, scales, biases) =
        (k.packed.to_vec::<u32>().unwrap(), k.scales.to_vec::<f32>().unwrap(), k.biases.to_vec::<f32>().unwrap());
    let (w, g) = (COLS * 8 / 32, COLS / 32);
    let mut row = vec![0f32; COLS];
    let mut want = vec![0f32; 7 * COLS];
    for (i, p) in (2..9).enumerate() {
        let r = tables[0][p / BLOCK] as usize * BLOCK + p % BLOCK;
        dequantize_rows(
            &words[r * w..(r + 1) * w],
            &scales[r * g..(r + 1) * g],
            &biases[r * g..(r + 1) * g],
            COLS,
            spec,
            &mut row,
        );
        for h in 0..HEADS {
            want[(h * 7 + i) * DIM..(h * 7 + i + 1) * DIM].copy_from_slice(&row[h * DIM..(h + 1) * DIM]);
        }
    }
    assert_eq!(got.to_vec::<f32>().unwrap(), want, "dequantize_paged against dequantize_rows");
    // Decode attention of both sequences: each row attention over its positions read back.
    let q = Array::from_slice(&values(2 * 4 * DIM, 3), &[2, 4, DIM]).unwrap();
    let seqs: Vec<PagedSeq> = tables.iter().zip(lens).map(|(t, len)| PagedSeq::new(t, len)).collect();
    let out =
        nuvec::paged_decode_attention_quantized(&q, &k, &v, &seqs, BLOCK, 0.25, None).unwrap().to_vec::<f32>().unwrap();
    for (i, s) in seqs.iter().enumerate() {
        let ks = nuvec::dequantize_paged(&k, HEADS, s.table, BLOCK, 0, s.len).unwrap();
        let vs = nuvec::dequantize_paged(&v, HEADS, s.table, BLOCK, 0, s.len).unwrap();
        let alone = nuvec::attention(&q.slice_rows(i, i + 1).unwrap(), &ks, &vs, s.len, 0.25).unwrap();
        assert_eq!(out[i * 4 * DIM..(i + 1) * 4 * DIM], alone.to_vec::<f32>().unwrap()[..], "sequence {i}");
    }
    // Sliding windows of 6 positions: each row attention over its window's positions alone, the
    // blocks wholly before the window never read (given back: marked u32::MAX).
    let freed: [&[u32]; 2] = [&[u32::MAX, 1, 3], &[0, 5]];
    let seqs: Vec<PagedSeq> = freed.iter().zip(lens).map(|(t, len)| PagedSeq::windowed(t, len, 6)).collect();
    let out =
        nuvec::paged_decode_attention_quantized(&q, &k, &v, &seqs, BLOCK, 0.25, None).unwrap().to_vec::<f32>().unwrap();
    for (i, s) in seqs.iter().enumerate() {
        let ks = nuvec::dequantize_paged(&k, HEADS, tables[i], BLOCK, s.first, s.len).unwrap();
        let vs = nuvec::dequantize_paged(&v, HEADS, tables[i], BLOCK, s.first, s.len).unwrap();
        let alone = nuvec::attention(&q.slice_rows(i, i + 1).unwrap(), &ks, &vs, s.attended(), 0.25).unwrap();
        assert_eq!(out[i * 4 * DIM..(i + 1) * 4 * DIM], alone.to_vec::<f32>().unwrap()[..], "window of sequence {i}");
    }
}

#[test]
fn bad_inputs_are_refused_naming_them() {
    let spec = spec(4, 32);
    let mut s = store(spec);
    let rows = Array::from_slice(&values(2 * COLS, 4), &[2, COLS]).unwrap();
    let err = |e: nuvec::Error| e.to_string();
    assert!(err(nuvec::quantize_rows_into(&rows, &mut s, &[1]).unwrap_err()).contains("1 slots for 2 rows"));
    assert!(err(nuvec::quantize_rows_into(&rows, &mut s, &[1, ROWS]).unwrap_err()).contains(&format!("slot {ROWS}")));
    let narrow = Array::from_slice(&values(2 * 32, 4), &[2, 32]).unwrap();
    assert!(
        err(nuvec::quantize_rows_into(&narrow, &mut s, &[0, 1]).unwrap_err()).contains("rows must be float [n, 64]")
    );
    let e = err(nuvec::dequantize_paged(&s, HEADS, &[0, 1], BLOCK, 3, 9).unwrap_err());
    assert!(e.contains("positions 3..9 through a table of 2 blocks"), "{e}");
    let e = err(backend(Device::Cpu).copy_rows_within(&mut s.packed, 0, 2, 4).unwrap_err());
    assert!(e.contains("do not overlap"), "{e}");
    let q = Array::from_slice(&values(3 * DIM, 5), &[1, 3, DIM]).unwrap();
    let seqs = [PagedSeq::new(&[0], 2)];
    let e = err(nuvec::paged_decode_attention_quantized(&q, &s, &s, &seqs, BLOCK, 1.0, None).unwrap_err());
    assert!(e.contains("not a whole number of its heads"), "{e}");
}
