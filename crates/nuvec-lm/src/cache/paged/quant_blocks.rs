//! The keys or the values of one layer's blocks quantized (MLX's affine format along the head
//! dimension, with the algorithm and f32 scales of [`crate::cache::QuantizedKvCache`]): a row
//! per physical position, each row every head's words, scales and biases, as `Quantized`
//! arrays on the model's device. The backend quantizes them where they are and reads them back
//! ([`nuvec::quantize_rows_into`], [`nuvec::dequantize_paged`]), bit for bit the host's values.

use nuvec::{Array, DType, Device, QuantSpec, Quantized};

use crate::{Error, Result};

/// Every position of one layer's blocks, quantized.
#[derive(Debug)]
pub(crate) struct QuantBlocks {
    heads: usize,
    rows: Quantized,
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
        let zeros = |width, dtype| Array::zeros_on(&[positions, width], dtype, device);
        let rows = Quantized::new(
            zeros(words, DType::U32)?,
            zeros(groups, DType::F32)?,
            zeros(groups, DType::F32)?,
            spec,
            heads * dim,
        )?;
        Ok(QuantBlocks { heads, rows })
    }

    /// The device the rows are on.
    pub(crate) fn device(&self) -> Device {
        self.rows.packed.device()
    }

    /// The rows, for ops that read them in place.
    pub(crate) fn rows(&self) -> &Quantized {
        &self.rows
    }

    /// Quantizes `rows [n, heads, dim]` into physical positions `at..at + n`.
    pub(crate) fn write(&mut self, at: usize, rows: &Array) -> Result<()> {
        let n = rows.dim(0);
        let slots: Vec<usize> = (at..at + n).collect();
        self.write_slots(&slots, &rows.reshape(&[n, self.rows.cols()])?)
    }

    /// Quantizes `rows [n, heads * dim]`, row `i` into physical position `slots[i]` (a decode
    /// step's rows, one per sequence).
    pub(crate) fn write_slots(&mut self, slots: &[usize], rows: &Array) -> Result<()> {
        Ok(nuvec::quantize_rows_into(rows, &mut self.rows, slots)?)
    }

    /// Copies positions `from..from + n` to `to..to + n`.
    pub(crate) fn copy(&mut self, from: usize, to: usize, n: usize) -> Result<()> {
        let backend = nuvec::backend(self.device());
        for part in [&mut self.rows.packed, &mut self.rows.scales, &mut self.rows.biases] {
            backend.copy_rows_within(part, from, to, n)?;
        }
        Ok(())
    }

    /// Sequence positions `from..to` through `table` (blocks of `block_size`), dequantized to
    /// f32 `[heads, to - from, dim]` (the layout attention reads), on the rows' device.
    pub(crate) fn dequantize(&self, table: &[u32], block_size: usize, from: usize, to: usize) -> Result<Array> {
        Ok(nuvec::dequantize_paged(&self.rows, self.heads, table, block_size, from, to)?)
    }
}
