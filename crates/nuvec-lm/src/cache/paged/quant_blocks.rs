//! The keys or the values of one layer's blocks quantized (MLX's affine format along the head
//! dimension, with the algorithm and f32 scales of [`crate::cache::QuantizedKvCache`]), in host
//! memory: a row per physical position, each row every head's words, scales and biases.

use nuvec::quantize::{dequantize_rows, quantize_affine};
use nuvec::{Array, DType, QuantSpec};

use crate::cache::store::scatter_heads;
use crate::{Error, Result};

/// Every position of one layer's blocks, quantized.
#[derive(Debug)]
pub(crate) struct QuantBlocks {
    spec: QuantSpec,
    heads: usize,
    dim: usize,
    words: Vec<u32>,
    scales: Vec<f32>,
    biases: Vec<f32>,
}

impl QuantBlocks {
    /// Room for `positions` rows of `heads` heads of `dim` features (zeros).
    pub(crate) fn new(positions: usize, heads: usize, dim: usize, spec: QuantSpec) -> Result<Self> {
        if !dim.is_multiple_of(spec.group_size) {
            return Err(Error::Invalid(format!(
                "kv_group_size = {} does not divide the head dimension {dim}; give a group size that does",
                spec.group_size
            )));
        }
        let (words, groups) = (heads * dim * spec.bits / 32, heads * dim / spec.group_size);
        Ok(QuantBlocks {
            spec,
            heads,
            dim,
            words: vec![0; positions * words],
            scales: vec![0.0; positions * groups],
            biases: vec![0.0; positions * groups],
        })
    }

    fn row_words(&self) -> usize {
        self.heads * self.dim * self.spec.bits / 32
    }

    fn row_groups(&self) -> usize {
        self.heads * self.dim / self.spec.group_size
    }

    /// Quantizes `rows [n, heads, dim]` into physical positions `at..at + n`.
    pub(crate) fn write(&mut self, at: usize, rows: &Array) -> Result<()> {
        let n = rows.dim(0);
        let (w, g) = (self.row_words(), self.row_groups());
        if (at + n) * g > self.scales.len() {
            return Err(Error::Invalid(format!(
                "{n} quantized rows written at position {at} of a store of {}",
                self.scales.len() / g
            )));
        }
        let data = rows.to_f32_vec()?;
        let q = quantize_affine(&data, n * self.heads, self.dim, self.spec, DType::F32)?;
        self.words[at * w..(at + n) * w].copy_from_slice(&q.packed.to_vec::<u32>()?);
        self.scales[at * g..(at + n) * g].copy_from_slice(&q.scales.to_f32_vec()?);
        self.biases[at * g..(at + n) * g].copy_from_slice(&q.biases.to_f32_vec()?);
        Ok(())
    }

    /// Copies positions `from..from + n` to `to..to + n`.
    pub(crate) fn copy(&mut self, from: usize, to: usize, n: usize) {
        let (w, g) = (self.row_words(), self.row_groups());
        self.words.copy_within(from * w..(from + n) * w, to * w);
        self.scales.copy_within(from * g..(from + n) * g, to * g);
        self.biases.copy_within(from * g..(from + n) * g, to * g);
    }

    /// The physical positions of `runs` (`(first, count)` each), one run after another,
    /// dequantized to f32 `[heads, positions, dim]` (the layout attention reads): each run
    /// dequantized into a scratch row block, then its heads copied to their places
    /// ([`scatter_heads`]).
    pub(crate) fn dequantize(&self, runs: &[(usize, usize)]) -> Result<Array> {
        let (w, g, width, dim) = (self.row_words(), self.row_groups(), self.heads * self.dim, self.dim);
        let n: usize = runs.iter().map(|r| r.1).sum();
        let longest = runs.iter().map(|r| r.1).max().unwrap_or(0);
        let mut out = vec![0f32; n * width];
        let mut rows = vec![0f32; longest * width];
        let mut at = 0;
        for &(start, len) in runs {
            let words = &self.words[start * w..(start + len) * w];
            let (scales, biases) =
                (&self.scales[start * g..(start + len) * g], &self.biases[start * g..(start + len) * g]);
            let rows = &mut rows[..len * width];
            dequantize_rows(words, scales, biases, dim, self.spec, rows);
            scatter_heads(rows, dim, n, at, &mut out);
            at += len;
        }
        Ok(Array::from_slice(&out, &[self.heads, n, dim])?)
    }
}
