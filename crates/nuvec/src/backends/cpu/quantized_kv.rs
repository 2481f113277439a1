//! A paged cache's quantized rows in host memory (`Quantized` arrays of `[positions,
//! kv_heads * head_dim]`): rows quantized into their slots, a sequence's positions read back
//! through its block table, and the decode of many sequences attending them in place. Each
//! decode task dequantizes its own key and value rows into a scratch block and runs the f32
//! decode kernel over it, so a sequence's row is bit for bit attention over its positions read
//! back, and the dequantization runs in the pool's threads, only over the rows each task reads.

use std::cell::RefCell;

use super::attention::{decode_part, with_starts, Sinks};
use super::f32s;
use super::kv_rows::KvRows;
use super::paged_attention::decode_sequences;
use crate::backend::{
    check_paged_quantized, check_quantized_paged, check_quantized_rows, check_rows_within,
    paged_decode_attention_quantized_composed, PagedSeq,
};
use crate::quantize::{dequantize_rows, quantize_affine};
use crate::{Array, DType, Quantized, Result};

thread_local! {
    /// A decode task's key and value rows, dequantized.
    static ROWS: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// [`crate::Backend::quantize_rows_into`]: `quantize_affine` of the rows (groups never cross a
/// row), each row's words, scales and biases copied into its slot.
pub(crate) fn quantize_rows_into(rows: &Array, store: &mut Quantized, slots: &[usize]) -> Result<()> {
    let n = check_quantized_rows(rows, store, slots)?;
    let (cols, spec) = (store.cols(), store.spec);
    let q = quantize_affine(&rows.to_f32_vec()?, n, cols, spec, DType::F32)?;
    let (w, g) = (cols * spec.bits / 32, cols / spec.group_size);
    copy_to_slots(q.packed.host::<u32>()?, store.packed.host_mut::<u32>()?, w, slots);
    copy_to_slots(q.scales.host::<f32>()?, store.scales.host_mut::<f32>()?, g, slots);
    copy_to_slots(q.biases.host::<f32>()?, store.biases.host_mut::<f32>()?, g, slots);
    Ok(())
}

/// [`crate::Backend::copy_rows_within`]: a copy within the host bytes.
pub(crate) fn copy_rows_within(a: &mut Array, from: usize, to: usize, n: usize) -> Result<()> {
    let row = check_rows_within(a, from, to, n)?;
    a.host_bytes_mut()?.copy_within(from * row..(from + n) * row, to * row);
    Ok(())
}

/// Row `i` of `rows` (each `width` values) into row `slots[i]` of `out`.
fn copy_to_slots<T: Copy>(rows: &[T], out: &mut [T], width: usize, slots: &[usize]) {
    for (row, &slot) in rows.chunks_exact(width).zip(slots) {
        out[slot * width..(slot + 1) * width].copy_from_slice(row);
    }
}

/// One store's rows as the kernels read them: words, scales and biases, and their widths.
#[derive(Clone, Copy)]
struct Rows<'a> {
    words: &'a [u32],
    scales: &'a [f32],
    biases: &'a [f32],
    store: &'a Quantized,
}

impl<'a> Rows<'a> {
    fn of(store: &'a Quantized) -> Result<Self> {
        Ok(Rows { words: store.packed.host()?, scales: store.scales.host()?, biases: store.biases.host()?, store })
    }

    /// Values `first .. first + n` of row `row` (whole groups) dequantized into `out`.
    fn dequantize(&self, row: usize, first: usize, n: usize, out: &mut [f32]) {
        let (spec, cols) = (self.store.spec, self.store.cols());
        let (w, g) = (cols * spec.bits / 32, cols / spec.group_size);
        let (w0, g0) = (row * w + first * spec.bits / 32, row * g + first / spec.group_size);
        let (words, groups) = (n * spec.bits / 32, n / spec.group_size);
        let (s, b) = (&self.scales[g0..g0 + groups], &self.biases[g0..g0 + groups]);
        dequantize_rows(&self.words[w0..w0 + words], s, b, n, spec, out);
    }
}

/// [`crate::Backend::dequantize_paged`]: each position's row dequantized (`dequantize_rows`), its
/// heads copied to their places.
pub(crate) fn dequantize_paged(
    store: &Quantized,
    heads: usize,
    table: &[u32],
    block_size: usize,
    from: usize,
    to: usize,
) -> Result<Array> {
    let positions = check_quantized_paged(store, heads, table, block_size, from, to)?;
    let (n, cols) = (to - from, store.cols());
    let dim = cols / heads;
    let rows = Rows::of(store)?;
    let mut out = Array::zeros(&[heads, n, dim], DType::F32);
    let o = out.host_mut::<f32>()?;
    let mut row = vec![0f32; cols];
    for (i, &p) in positions.iter().enumerate() {
        rows.dequantize(p as usize, 0, cols, &mut row);
        for (h, head) in row.chunks_exact(dim).enumerate() {
            o[(h * n + i) * dim..][..dim].copy_from_slice(head);
        }
    }
    Ok(out)
}

/// [`crate::Backend::paged_decode_attention_quantized`]: the f32 paged decode's tasks and
/// splits, each task over its rows dequantized (head sizes a multiple of the group size: a
/// head's values are whole groups; others go through the composed path).
#[allow(clippy::too_many_arguments)]
pub(crate) fn paged_decode_attention_quantized(
    q: &Array,
    k: &Quantized,
    v: &Quantized,
    seqs: &[PagedSeq<'_>],
    block_size: usize,
    scale: f32,
    sinks: Sinks,
) -> Result<Array> {
    let (n, hq, hkv, d, _) = check_paged_quantized(q, k, v, seqs, block_size, sinks)?;
    if scale <= 0.0 || !d.is_multiple_of(k.spec.group_size) {
        // The split-K kernel takes the maximum before scaling; the general path handles a
        // non-positive scale.
        return paged_decode_attention_quantized_composed(&super::CpuBackend, q, k, v, seqs, block_size, scale, sinks);
    }
    let qd = f32s("paged_decode_attention_quantized", q)?;
    let (kr, vr) = (Rows::of(k)?, Rows::of(v)?);
    decode_sequences(qd, seqs, [n, hq, hkv, d], scale, sinks, |seq, kvh, keys, qs, part| {
        let mut run = |kd: &mut Vec<f32>, vd: &mut Vec<f32>| {
            let len = keys.len();
            kd.resize(len * d, 0.0);
            vd.resize(len * d, 0.0);
            for (j, (kr_out, vr_out)) in keys.clone().zip(kd.chunks_exact_mut(d).zip(vd.chunks_exact_mut(d))) {
                let row = seq.table[j / block_size] as usize * block_size + j % block_size;
                kr.dequantize(row, kvh * d, d, kr_out);
                vr.dequantize(row, kvh * d, d, vr_out);
            }
            with_starts(|starts| {
                starts.extend((0..len).map(|j| j * d));
                decode_part(qs, KvRows::F32(kd), KvRows::F32(vd), starts, d, scale, part);
            })
        };
        ROWS.with(|cell| match cell.try_borrow_mut() {
            Ok(mut rows) => {
                let (kd, vd) = &mut *rows;
                run(kd, vd)
            }
            Err(_) => run(&mut vec![], &mut vec![]),
        })
    })
}
