//! The keys or the values of one layer's blocks quantized (MLX's affine format along the head
//! dimension, with the algorithm and f32 scales of [`crate::cache::QuantizedKvCache`]): a row
//! per physical position, each row every head's words, scales and biases, as `Quantized`
//! arrays on the model's device. The backend quantizes them where they are and reads them back
//! ([`nuvec::quantize_rows_into`], [`nuvec::dequantize_paged`]), bit for bit the host's values.

use nuvec::{Array, DType, Device, QuantSpec, Quantized};

use crate::cache::QuantRows;
use crate::{Error, Result};

/// Every position of one layer's blocks, quantized (also the rows of an unpaged
/// [`crate::cache::QuantizedKvCache`]).
#[derive(Debug, Clone)]
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

    /// The positions there is room for.
    pub(crate) fn positions(&self) -> usize {
        self.rows.rows()
    }

    /// The same rows with room for `positions` (at least `held`): the first `held` copied, the
    /// rest zeros. Through the host (a growth comes once per many positions), where rows of any
    /// element type are copied alike.
    pub(crate) fn grown(&self, held: usize, positions: usize) -> Result<Self> {
        let device = self.device();
        fn part<T: Copy + Default + nuvec::Element>(a: &Array, held: usize, positions: usize) -> Result<Array> {
            let width = a.dim(1);
            let mut rows: Vec<T> = if held == 0 { vec![] } else { a.to_vec::<T>()? };
            rows.truncate(held * width);
            rows.resize(positions * width, T::default());
            Ok(Array::from_slice(&rows, &[positions, width])?)
        }
        let r = &self.rows;
        let (packed, scales, biases) = (
            part::<u32>(&r.packed, held, positions)?,
            part::<f32>(&r.scales, held, positions)?,
            part::<f32>(&r.biases, held, positions)?,
        );
        let on = |a: Array| a.to_device(device);
        let rows = Quantized::new(on(packed)?, on(scales)?, on(biases)?, r.spec, r.cols())?;
        Ok(QuantBlocks { heads: self.heads, rows })
    }

    /// The rows on `device`.
    pub(crate) fn to_device(&self, device: Device) -> Result<Self> {
        let r = &self.rows;
        let moved = |a: &Array| a.to_device(device);
        let rows = Quantized::new(moved(&r.packed)?, moved(&r.scales)?, moved(&r.biases)?, r.spec, r.cols())?;
        Ok(QuantBlocks { heads: self.heads, rows })
    }

    /// The first `held` positions as [`QuantRows`] (on the host: a prompt-cache file's).
    pub(crate) fn held(&self, held: usize) -> Result<QuantRows> {
        let r = &self.rows;
        let take = |a: &Array| -> Result<Array> { Ok(a.to_device(Device::Cpu)?.slice_rows(0, held)?) };
        let parts = [take(&r.packed)?, take(&r.scales)?, take(&r.biases)?];
        QuantRows::from_parts(r.spec, [&parts[0], &parts[1], &parts[2]], [self.heads, r.cols() / self.heads])
    }

    /// Rows holding `rows`' positions (on the host), room for exactly those.
    pub(crate) fn from_rows(rows: &QuantRows) -> Result<Self> {
        let ([packed, scales, biases], [heads, dim]) = rows.to_parts()?;
        Ok(QuantBlocks { heads, rows: Quantized::new(packed, scales, biases, rows.spec, heads * dim)? })
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
