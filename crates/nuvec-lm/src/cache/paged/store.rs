//! One layer's keys and values of every block: one array each, `[1, blocks * block_size,
//! kv_heads * head_dim]` (positions first, as the projections produce them; made on first use),
//! or, in a quantized cache, a quantized row per position ([`QuantBlocks`]).

use nuvec::{Array, DType, Device, Matrix, QuantSpec, Quantized};

use super::quant_blocks::QuantBlocks;
use crate::{Error, Result};

/// How a [`LayerStore`] holds keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KvForm {
    /// Arrays of this element type.
    Plain(DType),
    /// Rows quantized so; a sequence's first pass keeps its rows in the plain
    /// type for its own attention, as mlx-lm's plain cache holds them before it is quantized.
    Quantized(QuantSpec, DType),
}

/// The tensors of one attention layer of a [`super::PagedCache`].
#[derive(Debug)]
pub(crate) struct LayerStore {
    block_size: usize,
    blocks: usize,
    form: KvForm,
    /// Keys and values, and the heads and head size they were made for.
    arrays: Option<(Array, Array, [usize; 2])>,
    /// Keys and values of a quantized store.
    quantized: Option<(QuantBlocks, QuantBlocks, [usize; 2])>,
}

impl LayerStore {
    pub(crate) fn new(blocks: usize, block_size: usize, form: KvForm) -> Self {
        LayerStore { block_size, blocks, form, arrays: None, quantized: None }
    }

    /// For a quantized store, the type a first pass's rows are rounded to before anything
    /// reads them (the model's plain cache type); `None` for a plain store.
    pub(crate) fn first_pass_dtype(&self) -> Option<DType> {
        match self.form {
            KvForm::Quantized(_, plain) => Some(plain),
            KvForm::Plain(_) => None,
        }
    }

    /// Makes the arrays for `heads` heads of `dim` features on `device` at the first write, and
    /// refuses a later write of another shape.
    fn ready(&mut self, heads: usize, dim: usize, device: Device) -> Result<()> {
        let dtype = match self.form {
            KvForm::Plain(dtype) => dtype,
            KvForm::Quantized(..) => {
                return Err(Error::Invalid("a quantized paged layer has no arrays to write in place".into()))
            }
        };
        match &self.arrays {
            Some((k, _, shape)) if *shape == [heads, dim] && k.device() == device => Ok(()),
            Some((_, _, shape)) => Err(Error::Invalid(format!(
                "a paged layer made for {} heads of {} features on its first write was given {heads} of {dim}",
                shape[0], shape[1]
            ))),
            None => {
                let shape = [1, self.blocks * self.block_size, heads * dim];
                let keys = Array::zeros_on(&shape, dtype, device)?;
                let values = Array::zeros_on(&shape, dtype, device)?;
                self.arrays = Some((keys, values, [heads, dim]));
                Ok(())
            }
        }
    }

    /// Makes a quantized store's rows for `heads` heads of `dim` features at the first write,
    /// and refuses a later write of another shape.
    fn ready_quantized(&mut self, spec: QuantSpec, heads: usize, dim: usize, device: Device) -> Result<()> {
        match &self.quantized {
            Some((k, _, shape)) if *shape == [heads, dim] && k.device() == device => Ok(()),
            Some((_, _, shape)) => Err(Error::Invalid(format!(
                "a paged layer made for {} heads of {} features on its first write was given {heads} of {dim}",
                shape[0], shape[1]
            ))),
            None => {
                let positions = self.blocks * self.block_size;
                let keys = QuantBlocks::new(positions, heads, dim, spec, device)?;
                let values = QuantBlocks::new(positions, heads, dim, spec, device)?;
                self.quantized = Some((keys, values, [heads, dim]));
                Ok(())
            }
        }
    }

    /// Writes `keys, values [n, heads, dim]` at physical position `at` (within one block).
    pub(crate) fn write(&mut self, at: usize, keys: &Array, values: &Array) -> Result<()> {
        let (n, heads, dim) = (keys.dim(0), keys.dim(1), keys.dim(2));
        if let KvForm::Quantized(spec, _) = self.form {
            self.ready_quantized(spec, heads, dim, keys.device())?;
            let (k, v, _) = self.quantized.as_mut().expect("made above");
            k.write(at, keys)?;
            return v.write(at, values);
        }
        self.ready(heads, dim, keys.device())?;
        let (k, v, _) = self.arrays.as_mut().expect("made above");
        k.write_axis1(&keys.reshape(&[1, n, heads * dim])?, at)?;
        v.write_axis1(&values.reshape(&[1, n, heads * dim])?, at)?;
        Ok(())
    }

    /// Copies block `from`'s keys and values into block `to` (nothing to copy before the first
    /// write).
    pub(crate) fn copy_block(&mut self, from: u32, to: u32) -> Result<()> {
        let bs = self.block_size;
        let blocks = self.blocks;
        if let Some((k, v, _)) = self.quantized.as_mut() {
            for q in [k, v] {
                q.copy(from as usize * bs, to as usize * bs, bs)?;
            }
            return Ok(());
        }
        let Some((k, v, [heads, dim])) = self.arrays.as_mut() else { return Ok(()) };
        let width = *heads * *dim;
        for a in [k, v] {
            let rows = Matrix::Dense(a.reshape(&[blocks, bs * width])?).embed(&[from])?;
            a.write_axis1(&rows.reshape(&[1, bs, width])?, to as usize * bs)?;
        }
        Ok(())
    }

    /// Whether a decode step can read this layer's keys and values where they are (one op over
    /// every sequence): a plain store, or a quantized one written before.
    pub(crate) fn reads_in_place(&self) -> bool {
        matches!(self.form, KvForm::Plain(_)) || self.quantized.is_some()
    }

    /// A quantized store's keys and values.
    pub(crate) fn quantized_rows(&self) -> Option<(&Quantized, &Quantized)> {
        let (k, v, _) = self.quantized.as_ref()?;
        Some((k.rows(), v.rows()))
    }

    /// Quantizes `keys, values [n, heads * dim]` (f32), row `i` into physical position
    /// `slots[i]`, in a quantized store.
    pub(crate) fn write_quantized_slots(&mut self, slots: &[usize], keys: &Array, values: &Array) -> Result<()> {
        let Some((k, v, _)) = self.quantized.as_mut() else {
            return Err(Error::Invalid("a decode step's quantized rows for a store that has none yet".into()));
        };
        k.write_slots(slots, keys)?;
        v.write_slots(slots, values)
    }

    /// The keys and values of every block for writing, made for `heads` heads of `dim` features
    /// on `device` at the first write.
    pub(crate) fn arrays_mut(&mut self, heads: usize, dim: usize, device: Device) -> Result<(&mut Array, &mut Array)> {
        self.ready(heads, dim, device)?;
        let (k, v, _) = self.arrays.as_mut().expect("made by ready");
        Ok((k, v))
    }

    /// The keys and values of every block, `[1, blocks * block_size, heads * dim]` each.
    pub(crate) fn arrays(&self) -> Result<(&Array, &Array)> {
        match self.arrays.as_ref() {
            Some((k, v, _)) => Ok((k, v)),
            None => Err(Error::Invalid("a paged layer read before anything was written to it".into())),
        }
    }

    /// Positions `from..to` of the sequence whose blocks are `table`, as keys and values
    /// `[heads, to - from, dim]`: the blocks holding them gathered, the ends cut, one transpose.
    pub(crate) fn gather_range(&self, table: &[u32], from: usize, to: usize) -> Result<(Array, Array)> {
        if let Some((k, v, _)) = self.quantized.as_ref() {
            return Ok((
                k.dequantize(table, self.block_size, from, to)?,
                v.dequantize(table, self.block_size, from, to)?,
            ));
        }
        let Some((k, v, [heads, dim])) = self.arrays.as_ref() else {
            return Err(Error::Invalid("a paged layer read before anything was written to it".into()));
        };
        let bs = self.block_size;
        let blocks = &table[from / bs..to.div_ceil(bs)];
        let skip = from / bs * bs;
        let one = |a: &Array| -> Result<Array> {
            let rows = Matrix::Dense(a.reshape(&[self.blocks, bs * heads * dim])?).embed(blocks)?;
            let rows = rows.reshape(&[blocks.len() * bs, *heads, *dim])?.slice_rows(from - skip, to - skip)?;
            Ok(rows.transpose01()?)
        };
        Ok((one(k)?, one(v)?))
    }

    /// The blocks of `table`, in order, as keys and values `[heads, table.len() * block_size,
    /// dim]` (the layout attention reads): one row gather and one transpose each.
    pub(crate) fn gather(&self, table: &[u32]) -> Result<(Array, Array)> {
        if self.quantized.is_some() {
            return self.gather_range(table, 0, table.len() * self.block_size);
        }
        let Some((k, v, [heads, dim])) = self.arrays.as_ref() else {
            return Err(Error::Invalid("a paged layer read before anything was written to it".into()));
        };
        let bs = self.block_size;
        let one = |a: &Array| -> Result<Array> {
            let rows = Matrix::Dense(a.reshape(&[self.blocks, bs * heads * dim])?).embed(table)?;
            Ok(rows.reshape(&[table.len() * bs, *heads, *dim])?.transpose01()?)
        };
        Ok((one(k)?, one(v)?))
    }
}

/// The physical positions of sequence positions `from..to` through `table`: `(first, count)`,
/// one run per block.
pub(crate) fn runs(table: &[u32], block_size: usize, from: usize, to: usize) -> Vec<(usize, usize)> {
    let mut out = vec![];
    let mut pos = from;
    while pos < to {
        let within = pos % block_size;
        let n = (block_size - within).min(to - pos);
        out.push((table[pos / block_size] as usize * block_size + within, n));
        pos += n;
    }
    out
}
