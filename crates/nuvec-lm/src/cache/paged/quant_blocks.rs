//! The keys or the values of one layer's blocks quantized (MLX's affine format along the head
//! dimension, with the algorithm and f32 scales of [`crate::cache::QuantizedKvCache`]): a row
//! per physical position, each row every head's words, scales and biases. On the CPU they are
//! host vectors; on a GPU, arrays there, quantized and read by the device
//! ([`nuvec::quantize_rows_into`], [`nuvec::dequantize_paged`]), bit for bit the host's values.

use nuvec::quantize::{dequantize_rows, quantize_affine};
use nuvec::{Array, DType, Device, QuantSpec, Quantized};

use super::store::runs;
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
    /// The rows on a GPU (the vectors above are then empty).
    device: Option<Quantized>,
}

impl QuantBlocks {
    /// Room for `positions` rows of `heads` heads of `dim` features (zeros) on `device`.
    pub(crate) fn new(positions: usize, heads: usize, dim: usize, spec: QuantSpec, device: Device) -> Result<Self> {
        if !dim.is_multiple_of(spec.group_size) {
            return Err(Error::Invalid(format!(
                "kv_group_size = {} does not divide the head dimension {dim}; give a group size that does",
                spec.group_size
            )));
        }
        let (words, groups) = (heads * dim * spec.bits / 32, heads * dim / spec.group_size);
        if device != Device::Cpu {
            let zeros = |width, dtype| Array::zeros_on(&[positions, width], dtype, device);
            let rows = Quantized::new(
                zeros(words, DType::U32)?,
                zeros(groups, DType::F32)?,
                zeros(groups, DType::F32)?,
                spec,
                heads * dim,
            )?;
            return Ok(QuantBlocks {
                spec,
                heads,
                dim,
                words: vec![],
                scales: vec![],
                biases: vec![],
                device: Some(rows),
            });
        }
        Ok(QuantBlocks {
            spec,
            heads,
            dim,
            words: vec![0; positions * words],
            scales: vec![0.0; positions * groups],
            biases: vec![0.0; positions * groups],
            device: None,
        })
    }

    /// The device the rows are on.
    pub(crate) fn device(&self) -> Device {
        self.device.as_ref().map_or(Device::Cpu, |q| q.packed.device())
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
        if let Some(q) = self.device.as_mut() {
            let slots: Vec<usize> = (at..at + n).collect();
            return Ok(nuvec::quantize_rows_into(&rows.reshape(&[n, self.heads * self.dim])?, q, &slots)?);
        }
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

    /// Quantizes `rows [n, heads * dim]`, row `i` into physical position `slots[i]` (a decode
    /// step's rows, one per sequence). Device rows only.
    pub(crate) fn write_slots(&mut self, slots: &[usize], rows: &Array) -> Result<()> {
        match self.device.as_mut() {
            Some(q) => Ok(nuvec::quantize_rows_into(rows, q, slots)?),
            None => Err(Error::Invalid("quantized rows in host memory are written a run at a time".into())),
        }
    }

    /// The rows on a GPU, for ops that read them in place.
    pub(crate) fn on_device(&self) -> Option<&Quantized> {
        self.device.as_ref()
    }

    /// Copies positions `from..from + n` to `to..to + n`.
    pub(crate) fn copy(&mut self, from: usize, to: usize, n: usize) -> Result<()> {
        if let Some(q) = self.device.as_mut() {
            let backend = nuvec::backend(q.packed.device());
            for part in [&mut q.packed, &mut q.scales, &mut q.biases] {
                backend.copy_rows_within(part, from, to, n)?;
            }
            return Ok(());
        }
        let (w, g) = (self.row_words(), self.row_groups());
        self.words.copy_within(from * w..(from + n) * w, to * w);
        self.scales.copy_within(from * g..(from + n) * g, to * g);
        self.biases.copy_within(from * g..(from + n) * g, to * g);
        Ok(())
    }

    /// Sequence positions `from..to` through `table` (blocks of `block_size`), dequantized to
    /// f32 `[heads, to - from, dim]` (the layout attention reads), on the rows' device. On the
    /// host each run of positions is dequantized into a scratch row block, then its heads copied
    /// to their places ([`scatter_heads`]).
    pub(crate) fn dequantize(&self, table: &[u32], block_size: usize, from: usize, to: usize) -> Result<Array> {
        if let Some(q) = self.device.as_ref() {
            return Ok(nuvec::dequantize_paged(q, self.heads, table, block_size, from, to)?);
        }
        let runs = runs(table, block_size, from, to);
        let (w, g, width, dim) = (self.row_words(), self.row_groups(), self.heads * self.dim, self.dim);
        let n: usize = runs.iter().map(|r| r.1).sum();
        let longest = runs.iter().map(|r| r.1).max().unwrap_or(0);
        let mut out = vec![0f32; n * width];
        let mut rows = vec![0f32; longest * width];
        let mut at = 0;
        for &(start, len) in &runs {
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
