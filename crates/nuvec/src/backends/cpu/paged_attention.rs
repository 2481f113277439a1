//! Decode attention of many sequences over one paged cache, reading the blocks in place.
//!
//! Each sequence's query is split exactly as a decode of that sequence alone splits it (the
//! same key chunks per KV head, the same partials combined in the same order; a sliding
//! window's keys as a decode over the window's positions alone), and each task
//! runs the same inner kernel over its key and value rows where they lie in their blocks: so a
//! sequence's row is bit for bit what [`super::attention`] gives it over its positions
//! gathered, and batching never changes a token. What changes is the
//! parallel region: one for every sequence's tasks instead of one (plus two gathers and two
//! transposes) per sequence.

use super::attention::{combine, decode_part, decode_splits, split_chunks, with_partials, with_starts, Sinks};
use super::f32s;
use super::kv_rows::KvRows;
use super::pool;
use crate::backend::{check_paged, paged_decode_attention_composed, PagedSeq};
use crate::{Array, DType, Result};

/// Where one sequence's tasks and partials start, and how its keys are split.
struct Plan {
    first_task: usize,
    chunk: usize,
    splits: usize,
}

pub(crate) fn paged_decode_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    seqs: &[PagedSeq<'_>],
    block_size: usize,
    scale: f32,
    sinks: Sinks,
) -> Result<Array> {
    let (n, hq, hkv, d, _) = check_paged(q, k, v, seqs, block_size, sinks)?;
    if scale <= 0.0 {
        // The split-K decode kernel takes the maximum before scaling; the general path
        // handles a non-positive scale.
        return paged_decode_attention_composed(&super::CpuBackend, q, k, v, seqs, block_size, scale, sinks);
    }
    let qd = f32s("paged_decode_attention", q)?;
    let (kr, vr) = (KvRows::of("paged_decode_attention", k)?, KvRows::of("paged_decode_attention", v)?);
    let width = hkv * d;
    decode_sequences(qd, seqs, [n, hq, hkv, d], scale, sinks, |seq, kvh, keys, qs, part| {
        with_starts(|starts| {
            // This KV head's rows of the positions `keys`, in order, where they lie in their blocks.
            let row = |j: usize| (seq.table[j / block_size] as usize * block_size + j % block_size) * width + kvh * d;
            starts.extend(keys.map(row));
            decode_part(qs, kr, vr, starts, d, scale, part);
        })
    })
}

/// The split-K decode of sequences `seqs` (queries `qd [n, hq, d]`): each sequence's attended
/// keys of each KV head split as a decode of it alone over them splits them, `task(seq, kvh, keys, qs, part)`
/// leaving in `part` the partial of the group of query heads `qs` over positions `keys` (as
/// [`decode_part`] does), the tasks run in the pool, then each sequence's partials combined in
/// order into its row of `[n, hq * d]`.
pub(super) fn decode_sequences(
    qd: &[f32],
    seqs: &[PagedSeq<'_>],
    [n, hq, hkv, d]: [usize; 4],
    scale: f32,
    sinks: Sinks,
    task: impl Fn(&PagedSeq<'_>, usize, std::ops::Range<usize>, &[f32], &mut [f32]) + Sync,
) -> Result<Array> {
    let group = hq / hkv;
    let stride = group * (d + 2);
    let mut tasks = 0;
    let plans: Vec<Plan> = seqs
        .iter()
        .map(|s| {
            let keys = s.attended();
            let (chunk, splits) = split_chunks(keys, decode_splits([hq, d, hkv, keys], keys));
            let plan = Plan { first_task: tasks, chunk, splits };
            tasks += hkv * splits;
            plan
        })
        .collect();
    let run = |t: usize, part: &mut [f32]| {
        let i = plans.partition_point(|p| p.first_task <= t) - 1;
        let (plan, seq) = (&plans[i], &seqs[i]);
        let local = t - plan.first_task;
        let (kvh, c) = (local / plan.splits, local % plan.splits);
        let keys = seq.first + c * plan.chunk..(seq.first + (c + 1) * plan.chunk).min(seq.len);
        let qs = &qd[(i * hq + kvh * group) * d..(i * hq + (kvh + 1) * group) * d];
        task(seq, kvh, keys, qs, part);
    };
    let mut out = Array::zeros(&[n, hq * d], DType::F32);
    let o = out.host_mut::<f32>()?;
    with_partials(|partials| {
        // Every task writes its whole part: the buffer's old contents are never read.
        partials.resize(tasks * stride, 0.0);
        pool::for_chunks(&mut partials[..], stride, |start, part| run(start / stride, part));
        for (plan, o) in plans.iter().zip(o.chunks_exact_mut(hq * d)) {
            let mine = &partials[plan.first_task * stride..(plan.first_task + hkv * plan.splits) * stride];
            combine(mine, o, [hq, d, hkv], plan.splits, scale, sinks);
        }
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::simd::tests::randoms;
    use super::super::CpuBackend;
    use super::*;
    use crate::Backend;

    /// Every sequence's row equals, bit for bit, the attention of that sequence alone over its
    /// blocks gathered (what a decode of it alone computes): in f32, f16 and bf16, with and
    /// without sinks, for lengths that split the keys and ones that do not, blocks in any order.
    #[test]
    fn each_row_is_the_solo_decode_bit_for_bit() {
        let (hq, hkv, d, bs, blocks) = (6usize, 2usize, 64usize, 16usize, 64usize);
        let width = hkv * d;
        let (kd, vd) = (randoms(blocks * bs * width, 31), randoms(blocks * bs * width, 32));
        // Lengths from one position to most of the store; tables drawn out of order.
        let lens = [1usize, 15, 16, 17, 100, 333, 700];
        let mut next = 0u32;
        let tables: Vec<Vec<u32>> = lens
            .iter()
            .map(|&len| {
                (0..len.div_ceil(bs) + 1)
                    .map(|_| {
                        next = (next + 37) % blocks as u32;
                        next
                    })
                    .collect()
            })
            .collect();
        let whole: Vec<PagedSeq> = tables.iter().zip(lens).map(|(t, len)| PagedSeq::new(t, len)).collect();
        // The same sequences seeing windows of 40 and 16 positions, each table's blocks before
        // its window given back (entries no read may touch).
        let freed = |window: usize| -> Vec<Vec<u32>> {
            let firsts = lens.map(|len: usize| len.saturating_sub(window) / bs);
            tables.iter().zip(firsts).map(|(t, f)| [vec![u32::MAX; f], t[f..].to_vec()].concat()).collect()
        };
        let (freed40, freed16) = (freed(40), freed(16));
        fn windowed<'t>(tables: &'t [Vec<u32>], lens: &[usize], window: usize) -> Vec<PagedSeq<'t>> {
            tables.iter().zip(lens).map(|(t, &len)| PagedSeq::windowed(t, len, window)).collect()
        }
        let q = Array::from_slice(&randoms(lens.len() * hq * d, 33), &[lens.len(), hq, d]).unwrap();
        let sinks = [-2.0f32, 0.0, 0.5, 1.0, 3.0, 40.0];
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let k = Array::from_slice(&kd, &[1, blocks * bs, width]).unwrap().astype(dtype).unwrap();
            let v = Array::from_slice(&vd, &[1, blocks * bs, width]).unwrap().astype(dtype).unwrap();
            for (seqs, what) in [
                (whole.clone(), "whole"),
                (windowed(&freed40, &lens, 40), "window 40"),
                (windowed(&freed16, &lens, 16), "window 16"),
            ] {
                for sinks in [None, Some(&sinks[..])] {
                    let fused = paged_decode_attention(&q, &k, &v, &seqs, bs, 0.125, sinks).unwrap();
                    let solo =
                        paged_decode_attention_composed(&CpuBackend, &q, &k, &v, &seqs, bs, 0.125, sinks).unwrap();
                    assert_eq!(fused.shape(), [lens.len(), hq * d]);
                    let (a, b) = (fused.host::<f32>().unwrap(), solo.host::<f32>().unwrap());
                    for (i, (x, y)) in a.chunks(hq * d).zip(b.chunks(hq * d)).enumerate() {
                        let same = x.iter().zip(y).all(|(x, y)| x.to_bits() == y.to_bits());
                        let sunk = sinks.is_some();
                        assert!(same, "{dtype} {what} sinks {sunk}: sequence {i} (len {}) differs", lens[i]);
                    }
                }
            }
            // A window is attention over the window's positions alone: the whole-sequence
            // decode of a sequence whose blocks hold only those positions, from position 0.
            let seqs = windowed(&freed40, &lens, 40);
            let fused = paged_decode_attention(&q, &k, &v, &seqs, bs, 0.125, None).unwrap();
            for (i, s) in seqs.iter().enumerate() {
                let rows: Vec<usize> = (s.first..s.len).map(|p| s.table[p / bs] as usize * bs + p % bs).collect();
                let pick = |a: &[f32]| -> Vec<f32> {
                    let mut out = vec![0f32; (rows.len().div_ceil(bs) * bs) * width];
                    for (j, &r) in rows.iter().enumerate() {
                        out[j * width..(j + 1) * width].copy_from_slice(&a[r * width..(r + 1) * width]);
                    }
                    out
                };
                let (kw, vw) = (pick(&kd), pick(&vd));
                let shape = [kw.len() / width, width];
                let k1 = Array::from_slice(&kw, &shape).unwrap().astype(dtype).unwrap();
                let v1 = Array::from_slice(&vw, &shape).unwrap().astype(dtype).unwrap();
                let table: Vec<u32> = (0..shape[0] as u32 / bs as u32).collect();
                let alone = [PagedSeq::new(&table, rows.len())];
                let qi = q.slice_rows(i, i + 1).unwrap();
                let one = paged_decode_attention(&qi, &k1, &v1, &alone, bs, 0.125, None).unwrap();
                let row = &fused.host::<f32>().unwrap()[i * hq * d..(i + 1) * hq * d];
                assert_eq!(row, one.host::<f32>().unwrap(), "{dtype}: window of sequence {i}");
            }
        }
        // The backend entry point runs the same kernel.
        let k = Array::from_slice(&kd, &[blocks * bs, width]).unwrap();
        let v = Array::from_slice(&vd, &[blocks * bs, width]).unwrap();
        let via = CpuBackend.paged_decode_attention(&q, &k, &v, &whole, bs, 0.125, None).unwrap();
        let direct = paged_decode_attention(&q, &k, &v, &whole, bs, 0.125, None).unwrap();
        assert_eq!(via.host::<f32>().unwrap(), direct.host::<f32>().unwrap());
    }

    #[test]
    fn bad_tables_and_shapes_are_errors() {
        let (hq, hkv, d, bs, blocks) = (4usize, 2usize, 8usize, 4usize, 3usize);
        let k = Array::zeros(&[blocks * bs, hkv * d], DType::F32);
        let q = Array::zeros(&[1, hq, d], DType::F32);
        let run = |table: &[u32], len: usize, q: &Array, sinks: Option<&[f32]>| {
            let seqs = [PagedSeq::new(table, len)];
            paged_decode_attention(q, &k, &k, &seqs, bs, 0.5, sinks).map(|_| ()).unwrap_err().to_string()
        };
        assert!(run(&[0], 5, &q, None).contains("holds 5 positions"));
        assert!(run(&[3], 1, &q, None).contains("store of 3 blocks"));
        assert!(run(&[0], 0, &q, None).contains("holds 0 positions"));
        // A window's first position inside what the sequence holds, its blocks in the store;
        // blocks before it may be anything.
        let windowed = |table: &[u32], len: usize, first: usize| {
            let seqs = [PagedSeq { table, len, first }];
            paged_decode_attention(&q, &k, &k, &seqs, bs, 0.5, None).map(|_| ())
        };
        assert!(windowed(&[0, 1], 6, 6).unwrap_err().to_string().contains("attending from 6"));
        assert!(windowed(&[u32::MAX, 1], 6, 3).unwrap_err().to_string().contains("store of 3 blocks"));
        windowed(&[u32::MAX, 1], 6, 4).unwrap();
        assert!(run(&[0], 1, &q, Some(&[0.0])).contains("sinks"));
        let q3 = Array::zeros(&[1, 3, d], DType::F32);
        assert!(run(&[0], 1, &q3, None).contains("kv_heads"));
        let two = Array::zeros(&[2, hq, d], DType::F32);
        assert!(run(&[0], 1, &two, None).contains("1 sequences for 2 queries"));
    }
}
