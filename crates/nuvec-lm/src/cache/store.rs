//! How a cache holds positions: plain f32 arrays `[kv_heads, positions, head_dim]`, or rows
//! quantized in MLX's affine format. The rotating cache's ring logic runs on either.

use nuvec::quantize::{dequantize_rows, quantize_affine};
use nuvec::{Array, DType, QuantSpec};

use super::ops::{concat_axis1, slice_axis1};
use crate::{Error, Result};

/// Positions of keys or values, sliced, joined and overwritten along the positions axis.
pub trait Store: Clone + std::fmt::Debug + Sized {
    /// What turning new f32 positions into this store needs (the quantization, for rows).
    type Context: Clone + std::fmt::Debug + PartialEq;
    /// New positions `a [kv_heads, L, head_dim]` in this store's form.
    fn ingest(a: &Array, context: &Self::Context) -> Result<Self>;
    /// Positions held.
    fn len(&self) -> usize;
    /// True when no position is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Positions `start..end`.
    fn slice(&self, start: usize, end: usize) -> Result<Self>;
    /// Position `at` alone, a copy that shares nothing with `self` (so that writing `self`
    /// afterwards copies nothing).
    fn position(&self, at: usize) -> Result<Self> {
        self.slice(at, at + 1)
    }
    /// `parts` one after another.
    fn concat(parts: &[Self]) -> Result<Self>;
    /// Overwrites positions `at..` with `src`.
    fn write(&mut self, src: &Self, at: usize) -> Result<()>;
    /// Overwrites position `at` with one position `src`, in a ring whose positions from `keep`
    /// on are reused in turn (what a CUDA graph's replays of the write go on to do).
    fn write_ring(&mut self, src: &Self, at: usize, _keep: usize) -> Result<()> {
        self.write(src, at)
    }
    /// Everything as f32 `[kv_heads, positions, head_dim]`.
    fn to_array(&self) -> Result<Array>;
}

/// Plain arrays stored in the element type the context names (f32, f16 or bf16).
impl Store for Array {
    type Context = DType;

    fn ingest(a: &Array, dtype: &DType) -> Result<Self> {
        Ok(a.astype(*dtype)?)
    }

    fn len(&self) -> usize {
        self.dim(1)
    }

    fn slice(&self, start: usize, end: usize) -> Result<Self> {
        slice_axis1(self, start, end)
    }

    /// Each head's row at `at`, gathered (slicing along the positions would transpose the
    /// whole buffer twice).
    fn position(&self, at: usize) -> Result<Self> {
        let (heads, n, dim) = (self.dim(0), self.dim(1), self.dim(2));
        if at >= n {
            return Err(Error::Invalid(format!("position {at} of a cache holding {n}")));
        }
        let rows: Vec<u32> = (0..heads).map(|h| (h * n + at) as u32).collect();
        let table = nuvec::Matrix::Dense(self.reshape(&[heads * n, dim])?);
        Ok(table.embed(&rows)?.astype(self.dtype())?.reshape(&[heads, 1, dim])?)
    }

    fn concat(parts: &[Self]) -> Result<Self> {
        concat_axis1(parts)
    }

    fn write(&mut self, src: &Self, at: usize) -> Result<()> {
        Ok(self.write_axis1(src, at)?)
    }

    fn write_ring(&mut self, src: &Self, at: usize, keep: usize) -> Result<()> {
        Ok(self.write_axis1_ring(src, at, keep)?)
    }

    fn to_array(&self) -> Result<Array> {
        Ok(self.clone())
    }
}

/// Copies `rows` (positions `at..`, each every head's `dim` values one after another, as they
/// are dequantized) into `out` `[heads, n, dim]` (the layout attention reads), so that the whole
/// is never transposed afterwards.
pub(crate) fn scatter_heads(rows: &[f32], dim: usize, n: usize, at: usize, out: &mut [f32]) {
    let width = out.len() / n.max(1);
    for (i, row) in rows.chunks_exact(width).enumerate() {
        for (h, head) in row.chunks_exact(dim).enumerate() {
            out[(h * n + at + i) * dim..][..dim].copy_from_slice(head);
        }
    }
}

/// One position's keys or values for every head, quantized.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) words: Vec<u32>,
    pub(crate) scales: Vec<f32>,
    pub(crate) biases: Vec<f32>,
}

/// Positions quantized one by one (MLX's affine format along the head dimension).
#[derive(Debug, Clone)]
pub struct QuantRows {
    pub(crate) spec: QuantSpec,
    pub(crate) heads: usize,
    pub(crate) dim: usize,
    pub(crate) rows: Vec<Row>,
}

impl QuantRows {
    /// `a [kv_heads, L, head_dim]` quantized position by position with MLX's algorithm.
    pub fn quantize(a: &Array, spec: QuantSpec) -> Result<Self> {
        let (h, l, d) = (a.dim(0), a.dim(1), a.dim(2));
        if !d.is_multiple_of(spec.group_size) {
            return Err(Error::Invalid(format!(
                "kv_group_size = {} does not divide the head dimension {d}",
                spec.group_size
            )));
        }
        // [heads, L, dim] -> [L, heads, dim]: one quantized row group per position.
        let data = a.transpose01()?.to_f32_vec()?;
        let (words, groups) = (d * spec.bits / 32, d / spec.group_size);
        let q = quantize_affine(&data, l * h, d, spec, DType::F32)?;
        let (packed, scales, biases) = (q.packed.to_vec::<u32>()?, q.scales.to_f32_vec()?, q.biases.to_f32_vec()?);
        let rows = (0..l)
            .map(|p| Row {
                words: packed[p * h * words..(p + 1) * h * words].to_vec(),
                scales: scales[p * h * groups..(p + 1) * h * groups].to_vec(),
                biases: biases[p * h * groups..(p + 1) * h * groups].to_vec(),
            })
            .collect();
        Ok(QuantRows { spec, heads: h, dim: d, rows })
    }
}

impl Store for QuantRows {
    type Context = QuantSpec;

    fn ingest(a: &Array, spec: &QuantSpec) -> Result<Self> {
        Self::quantize(a, *spec)
    }

    fn len(&self) -> usize {
        self.rows.len()
    }

    fn slice(&self, start: usize, end: usize) -> Result<Self> {
        Ok(QuantRows { rows: self.rows[start..end].to_vec(), ..self.clone_empty() })
    }

    fn concat(parts: &[Self]) -> Result<Self> {
        let mut out = parts[0].clone_empty();
        out.rows = parts.iter().flat_map(|p| p.rows.iter().cloned()).collect();
        Ok(out)
    }

    fn write(&mut self, src: &Self, at: usize) -> Result<()> {
        if at + src.rows.len() > self.rows.len() {
            return Err(Error::Invalid(format!(
                "cannot write {} positions at {at} of {}",
                src.rows.len(),
                self.rows.len()
            )));
        }
        self.rows[at..at + src.rows.len()].clone_from_slice(&src.rows);
        Ok(())
    }

    /// `[heads, positions, dim]`: each position dequantized into a scratch row, its heads copied
    /// to their places ([`scatter_heads`]).
    fn to_array(&self) -> Result<Array> {
        let (h, d, n) = (self.heads, self.dim, self.rows.len());
        let mut out = vec![0f32; n * h * d];
        let mut scratch = vec![0f32; h * d];
        for (p, row) in self.rows.iter().enumerate() {
            dequantize_rows(&row.words, &row.scales, &row.biases, d, self.spec, &mut scratch);
            scatter_heads(&scratch, d, n, p, &mut out);
        }
        Ok(Array::from_slice(&out, &[h, n, d])?)
    }
}

impl QuantRows {
    fn clone_empty(&self) -> Self {
        QuantRows { spec: self.spec, heads: self.heads, dim: self.dim, rows: vec![] }
    }
}

impl QuantRows {
    /// The rows as `[positions, heads * words]` words and `[positions, heads * groups]` scales and
    /// biases, with `[heads, dim]`: what a prompt-cache file stores.
    pub fn to_parts(&self) -> Result<([Array; 3], [usize; 2])> {
        let n = self.rows.len();
        let (w, g) = (self.heads * self.dim * self.spec.bits / 32, self.heads * self.dim / self.spec.group_size);
        let words: Vec<u32> = self.rows.iter().flat_map(|r| r.words.iter().copied()).collect();
        let scales: Vec<f32> = self.rows.iter().flat_map(|r| r.scales.iter().copied()).collect();
        let biases: Vec<f32> = self.rows.iter().flat_map(|r| r.biases.iter().copied()).collect();
        Ok((
            [
                Array::from_slice(&words, &[n, w])?,
                Array::from_slice(&scales, &[n, g])?,
                Array::from_slice(&biases, &[n, g])?,
            ],
            [self.heads, self.dim],
        ))
    }

    /// Rows from [`QuantRows::to_parts`]'s arrays, checked against `spec` and the shape.
    pub fn from_parts(spec: QuantSpec, [words, scales, biases]: [&Array; 3], [heads, dim]: [usize; 2]) -> Result<Self> {
        let (w, g) = (heads * dim * spec.bits / 32, heads * dim / spec.group_size.max(1));
        let n = words.dim(0);
        let fits = |a: &Array, cols: usize| a.shape() == [n, cols];
        if !fits(words, w) || !fits(scales, g) || !fits(biases, g) {
            return Err(Error::Invalid(format!(
                "quantized rows do not fit {heads} heads of {dim} at {} bits",
                spec.bits
            )));
        }
        let (words, scales, biases) = (words.to_vec::<u32>()?, scales.to_f32_vec()?, biases.to_f32_vec()?);
        let rows = (0..n)
            .map(|p| Row {
                words: words[p * w..(p + 1) * w].to_vec(),
                scales: scales[p * g..(p + 1) * g].to_vec(),
                biases: biases[p * g..(p + 1) * g].to_vec(),
            })
            .collect();
        Ok(QuantRows { spec, heads, dim, rows })
    }
}
