//! The greedy pick's ops over whole logits rows: `argmax_gap` and a constraint's `mask_rows`,
//! read in place and rows spread over the pool (and `sample_rows`, the certified draw, the same
//! way). A batch of 64 rows of a 128k vocabulary is 8 M
//! values a step: the trait's defaults copy them to a vector first and walk each row three
//! times, which cost a constrained batch on this backend more than its forward pass.

use super::{f32s, pool};
use crate::backend::{check_mask_rows, check_sample_rows, sample_row};
use crate::{Array, DType, Error, Result};

/// Lanes of the running maxima, so that the loop compiles to vector max instructions.
const LANES: usize = 16;

/// The largest value of `v` (NaNs skipped; `-inf` when empty or all NaN).
fn max_of(v: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = v.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = if x > *a { x } else { *a };
        }
    }
    let tail = chunks.remainder().iter().fold(f32::NEG_INFINITY, |a, &x| if x > a { x } else { a });
    acc.iter().fold(tail, |a, &x| if x > a { x } else { a })
}

/// Whether every value of `v` is finite.
fn all_finite(v: &[f32]) -> bool {
    let mut ok = [true; LANES];
    let mut chunks = v.chunks_exact(LANES);
    for c in &mut chunks {
        for (o, &x) in ok.iter_mut().zip(c) {
            *o &= x.abs() <= f32::MAX;
        }
    }
    ok.iter().all(|&o| o) && chunks.remainder().iter().all(|x| x.is_finite())
}

/// [`crate::backend::argmax_gap_row`] in three vectorized passes: the maximum, its first index,
/// the maximum before it.
fn argmax_gap_row(row: &[f32]) -> (u32, f32, f32) {
    if row[0].is_nan() {
        // A leading NaN is the first maximum, as `argmax` finds it.
        return (0, row[0], f32::NAN);
    }
    let top = max_of(row);
    // `top` is -inf when every other value is NaN or -inf: the first -inf, row[0], is the pick.
    let best = row.iter().position(|&v| v == top).unwrap_or(0);
    if !all_finite(row) {
        return (best as u32, row[best], f32::NAN);
    }
    (best as u32, row[best], row[best] - max_of(&row[..best]))
}

pub(crate) fn argmax_gap(x: &Array) -> Result<Array> {
    if x.shape().is_empty() || x.dim(-1) == 0 {
        return Err(Error::shape("argmax_gap", format!("rows of {:?}", x.shape())));
    }
    let n = x.dim(-1);
    let values = f32s("argmax_gap", x)?;
    let mut out = vec![0u32; values.len() / n * 3];
    pool::for_chunks(&mut out, 3, |at, o| {
        let row = at / 3;
        let (index, max, gap) = argmax_gap_row(&values[row * n..(row + 1) * n]);
        o.copy_from_slice(&[index, max.to_bits(), gap.to_bits()]);
    });
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("checked above") = 3;
    Array::from_slice(&out, &shape)
}

/// `row` with the entries whose bit is clear in `mask` replaced by `fill`, into `out`.
fn mask_row(out: &mut [f32], row: &[f32], mask: &[u32], fill: f32) {
    for ((o, v), &w) in out.chunks_mut(32).zip(row.chunks(32)).zip(mask) {
        match w {
            u32::MAX => o.copy_from_slice(v),
            0 => o.fill(fill),
            w => {
                for (i, (o, &v)) in o.iter_mut().zip(v).enumerate() {
                    *o = if w >> i & 1 == 1 { v } else { fill };
                }
            }
        }
    }
}

pub(crate) fn mask_rows(x: &Array, bits: &[u32], fill: f32) -> Result<Array> {
    let n = check_mask_rows(x, bits)?;
    let values = f32s("mask_rows", x)?;
    let words = n.div_ceil(32);
    // Written in place: a batch's logits are tens of megabytes, copied once more otherwise.
    let mut masked = Array::zeros(x.shape(), DType::F32);
    pool::for_chunks(masked.host_mut::<f32>()?, n, |at, o| {
        mask_row(o, &values[at..at + n], &bits[at / n * words..][..words], fill);
    });
    Ok(masked)
}

pub(crate) fn masked_argmax_gap(x: &Array, bits: &[u32], fill: f32) -> Result<Array> {
    let n = check_mask_rows(x, bits)?;
    let values = f32s("masked_argmax_gap", x)?;
    let words = n.div_ceil(32);
    thread_local! {
        /// One masked row at a time, kept by each thread of the pool: it stays in the cache,
        /// where a batch's masked rows written out are a fresh buffer of tens of megabytes.
        static ROW: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let mut out = vec![0u32; values.len() / n * 3];
    pool::for_chunks(&mut out, 3, |at, o| {
        let row = at / 3;
        ROW.with_borrow_mut(|masked| {
            masked.resize(n, 0.0);
            mask_row(masked, &values[row * n..(row + 1) * n], &bits[row * words..][..words], fill);
            let (index, max, gap) = argmax_gap_row(masked);
            o.copy_from_slice(&[index, max.to_bits(), gap.to_bits()]);
        });
    });
    Array::from_slice(&out, &[values.len() / n, 3])
}

pub(crate) fn sample_rows(x: &Array, scales: &[f32], uniforms: &[f64]) -> Result<Array> {
    let n = check_sample_rows(x, scales, uniforms)?;
    let values = f32s("sample_rows", x)?;
    let mut out = vec![0u32; scales.len() * 3];
    pool::for_chunks(&mut out, 3, |at, o| {
        // A row with scale 0 (skipped) is refused at once: (0, 0, 0).
        let row = at / 3;
        let (token, certain) = sample_row(&values[row * n..(row + 1) * n], scales[row], uniforms[row]);
        o.copy_from_slice(&[token, u32::from(certain), 0]);
    });
    Array::from_slice(&out, &[scales.len(), 3])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows with ties, NaNs and infinities where they change the answer, and long rows.
    fn rows() -> Vec<Vec<f32>> {
        let mut state = 7u32;
        let mut next = move || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1 << 24) as f32 * 8.0 - 4.0
        };
        let long: Vec<f32> = (0..1000).map(|_| next()).collect();
        let mut tie = long.clone();
        tie[700] = 9.0;
        tie[900] = 9.0;
        let (nan, inf) = (f32::NAN, f32::INFINITY);
        let with = |at: usize, v: f32| {
            let mut r = long.clone();
            r[at] = v;
            r
        };
        vec![
            long.clone(),
            tie,
            with(0, nan),
            with(500, nan),
            with(3, inf),
            with(999, -inf),
            with(0, 100.0),
            vec![nan, 1.0],
            vec![-inf, -inf],
            vec![-inf, nan, -inf],
            vec![2.0],
            vec![1.0, 3.0, 3.0, 2.0],
        ]
    }

    #[test]
    fn argmax_gap_rows_are_the_reference_bit_for_bit() {
        for row in rows() {
            let (a, b) = (argmax_gap_row(&row), crate::backend::argmax_gap_row(&row));
            assert_eq!((a.0, a.1.to_bits(), a.2.to_bits()), (b.0, b.1.to_bits(), b.2.to_bits()), "row {row:?}");
        }
    }

    #[test]
    fn argmax_gap_and_mask_rows_over_a_batch() {
        let n = 1000;
        let data: Vec<f32> = rows().into_iter().filter(|r| r.len() == n).flatten().collect();
        let m = data.len() / n;
        let x = Array::from_slice(&data, &[m, n]).unwrap();
        let expected: Vec<u32> = data
            .chunks(n)
            .flat_map(|row| {
                let (index, max, gap) = crate::backend::argmax_gap_row(row);
                [index, max.to_bits(), gap.to_bits()]
            })
            .collect();
        let got = argmax_gap(&x).unwrap();
        assert_eq!(got.shape(), &[m, 3]);
        assert_eq!(got.to_vec::<u32>().unwrap(), expected);
        let words = n.div_ceil(32);
        let bits: Vec<u32> = (0..m * words)
            .map(|i| match i % 4 {
                0 => u32::MAX,
                1 => 0,
                _ => (i as u32).wrapping_mul(2_654_435_761),
            })
            .collect();
        let expected: Vec<u32> = (0..m * n)
            .map(|i| {
                let (row, col) = (i / n, i % n);
                let kept = bits[row * words + col / 32] >> (col % 32) & 1 == 1;
                if kept { data[i] } else { -1e30 }.to_bits()
            })
            .collect();
        let got = mask_rows(&x, &bits, -1e30).unwrap();
        assert_eq!(got.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>(), expected);
        assert!(mask_rows(&x, &bits[1..], 0.0).is_err());
        // The pick over the masked rows, without writing them: the reference's over `expected`,
        // a row with every entry refused included (its first entry, the fill, wins).
        let mut bits = bits;
        bits[words..2 * words].fill(0);
        let masked: Vec<f32> = (0..m * n)
            .map(|i| {
                let (row, col) = (i / n, i % n);
                if bits[row * words + col / 32] >> (col % 32) & 1 == 1 {
                    data[i]
                } else {
                    -1e30
                }
            })
            .collect();
        let want: Vec<u32> = masked
            .chunks(n)
            .flat_map(|row| {
                let (index, max, gap) = crate::backend::argmax_gap_row(row);
                [index, max.to_bits(), gap.to_bits()]
            })
            .collect();
        let got = masked_argmax_gap(&x, &bits, -1e30).unwrap();
        assert_eq!(got.shape(), &[m, 3]);
        assert_eq!(got.to_vec::<u32>().unwrap(), want);
        assert_eq!(want[3..6], [0, (-1e30f32).to_bits(), f32::INFINITY.to_bits()]);
        assert!(masked_argmax_gap(&x, &bits[1..], 0.0).is_err());
    }

    #[test]
    fn sample_rows_are_the_reference_and_refuse_what_the_host_must_decide() {
        let (nan, inf) = (f32::NAN, f32::INFINITY);
        let long = rows().swap_remove(0);
        let mut with_neg_inf = long.clone();
        with_neg_inf[..500].fill(-inf);
        let cases: Vec<(Vec<f32>, f32, f64)> = vec![
            (long.clone(), 1.0, 0.3),
            (long.clone(), 2.5, 0.999),
            (with_neg_inf.clone(), 1.0, 0.001),
            (long.clone(), 0.0, 0.5),             // skipped
            (vec![1.0, nan, 2.0], 1.0, 0.5),      // a NaN: the host decides
            (vec![1.0, inf, 2.0], 1.0, 0.5),      // +inf
            (vec![-inf, -inf], 1.0, 0.5),         // nothing to draw
            (vec![1.0, 2.0], f32::INFINITY, 0.5), // no finite scale
            (vec![1.0, 2.0], 1.0, 1.0),           // u outside [0, 1)
            (vec![0.0, 0.0, 0.0, 0.0], 1.0, 0.5), // on a boundary: two tokens are as likely
        ];
        for (row, scale, u) in &cases {
            let x = Array::from_slice(row, &[1, row.len()]).unwrap();
            let got = sample_rows(&x, &[*scale], &[*u]).unwrap().to_vec::<u32>().unwrap();
            let expected = match *scale {
                0.0 => [0, 0, 0],
                _ => {
                    let (token, certain) = sample_row(row, *scale, *u);
                    [token, u32::from(certain), 0]
                }
            };
            assert_eq!(got, expected, "scale {scale}, u {u}, row of {}", row.len());
        }
        let certain = |i: usize| {
            sample_rows(&Array::from_slice(&cases[i].0, &[1, cases[i].0.len()]).unwrap(), &[cases[i].1], &[cases[i].2])
                .unwrap()
                .to_vec::<u32>()
                .unwrap()[1]
        };
        assert_eq!([certain(0), certain(1), certain(2)], [1, 1, 1], "ordinary rows are certain");
        for i in 4..cases.len() {
            assert_eq!(certain(i), 0, "case {i} goes to the host");
        }
        // Entries at -inf are never drawn; a small u takes one of the first that can be.
        let drawn = sample_rows(&Array::from_slice(&with_neg_inf, &[1, 1000]).unwrap(), &[1.0], &[0.001]).unwrap();
        assert!((500..510).contains(&drawn.to_vec::<u32>().unwrap()[0]));
        // Several rows at once, each its own.
        let data: Vec<f32> = [long.clone(), with_neg_inf].concat();
        let x = Array::from_slice(&data, &[2, 1000]).unwrap();
        let both = sample_rows(&x, &[1.0, 0.5], &[0.25, 0.75]).unwrap().to_vec::<u32>().unwrap();
        let one = |row: &[f32], s, u| {
            let (t, c) = sample_row(row, s, u);
            [t, u32::from(c), 0]
        };
        assert_eq!(both, [one(&long, 1.0, 0.25), one(&data[1000..], 0.5, 0.75)].concat());
        assert!(sample_rows(&x, &[1.0], &[0.5, 0.5]).is_err(), "a scale per row");
    }
}
