//! Weight matrices: dense, or quantized in MLX's layouts.
//!
//! Affine quantization (MLX's default) stores, per row, groups of `group_size` values as unsigned
//! `bits`-wide integers packed LSB-first into a little-endian bit stream held in `u32` words,
//! with one scale and one bias per group: `w = scale * q + bias`.
//!
//! The floating-point modes (mxfp4, mxfp8, nvfp4) store each value as a small float code, packed
//! LSB-first in `u32` words like affine values, with one `u8` scale per group and no biases:
//! `w = value(code) * scale(byte)`; see [`crate::fpquant`] for the codes and scales.

use crate::{Array, DType, Error, Result};

/// The quantization formats MLX writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantMode {
    /// `w = scale * q + bias` per group; scales and biases in a float dtype.
    Affine,
    // Floating-point modes (fpquant): fixed bits and group size each, `u8` scales, no biases.
    /// OCP microscaling fp4: e2m1 codes, groups of 32, a power-of-two (e8m0) scale each.
    Mxfp4,
    /// OCP microscaling fp8: e4m3 codes, groups of 32, a power-of-two (e8m0) scale each.
    Mxfp8,
    /// NVIDIA fp4: e2m1 codes, groups of 16, an e4m3 scale each (and optionally one f32 global
    /// scale per matrix, which mlx-lm writes only for mixture-of-experts projections).
    Nvfp4,
}

impl QuantMode {
    /// Parses MLX's `mode` string.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "affine" => Ok(QuantMode::Affine),
            "mxfp4" => Ok(QuantMode::Mxfp4),
            "mxfp8" => Ok(QuantMode::Mxfp8),
            "nvfp4" => Ok(QuantMode::Nvfp4),
            other => Err(Error::Unsupported(format!(
                "quantization mode {other:?} is not one of affine, mxfp4, mxfp8, nvfp4"
            ))),
        }
    }

    /// MLX's name of the mode (`"affine"`, `"mxfp4"`, ...), as config.json writes it.
    pub fn name(self) -> &'static str {
        match self {
            QuantMode::Affine => "affine",
            QuantMode::Mxfp4 => "mxfp4",
            QuantMode::Mxfp8 => "mxfp8",
            QuantMode::Nvfp4 => "nvfp4",
        }
    }

    /// The only `(bits, group_size)` a floating-point mode allows; `None` for affine.
    pub fn fixed_shape(self) -> Option<(usize, usize)> {
        match self {
            QuantMode::Affine => None,
            QuantMode::Mxfp4 => Some((4, 32)),
            QuantMode::Mxfp8 => Some((8, 32)),
            QuantMode::Nvfp4 => Some((4, 16)),
        }
    }

    /// Whether the mode stores a bias per group (only affine does).
    pub fn has_biases(self) -> bool {
        self == QuantMode::Affine
    }

    /// The `(bits, group_size)` MLX uses when a config or flag leaves them out: 4 and 64 for
    /// affine, the mode's fixed pair otherwise.
    pub fn defaults(self) -> (usize, usize) {
        self.fixed_shape().unwrap_or((4, 64))
    }
}

/// How a matrix is quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantSpec {
    /// The format.
    pub mode: QuantMode,
    /// Bits per value.
    pub bits: usize,
    /// Values sharing one scale (and bias).
    pub group_size: usize,
}

impl QuantSpec {
    /// Affine bits MLX supports.
    pub const AFFINE_BITS: [usize; 6] = [2, 3, 4, 5, 6, 8];
    /// Affine group sizes the kernels support: MLX's ([`QuantSpec::MLX_AFFINE_GROUPS`]) and 16,
    /// which GGUF's Q2_K, Q3_K and Q6_K blocks are equivalent to.
    pub const AFFINE_GROUPS: [usize; 4] = [16, 32, 64, 128];
    /// Affine group sizes MLX itself accepts (mlx 0.32.4's `mx.quantize` refuses 16): what
    /// config.json, `kv_group_size` and `nuvec convert`'s output may use.
    pub const MLX_AFFINE_GROUPS: [usize; 3] = [32, 64, 128];

    /// Checks the combination against what the kernels support, with a message naming the bad
    /// value.
    pub fn validate(&self) -> std::result::Result<(), String> {
        match self.mode {
            QuantMode::Affine => {
                if !Self::AFFINE_BITS.contains(&self.bits) {
                    return Err(format!("bits = {} is not one of 2,3,4,5,6,8", self.bits));
                }
                if !Self::AFFINE_GROUPS.contains(&self.group_size) {
                    return Err(format!("group_size = {} is not one of 16,32,64,128", self.group_size));
                }
            }
            // fpquant: each floating-point mode has exactly one shape.
            QuantMode::Mxfp4 | QuantMode::Mxfp8 | QuantMode::Nvfp4 => {
                let (bits, group) = self.mode.fixed_shape().expect("floating-point modes have a fixed shape");
                if (self.bits, self.group_size) != (bits, group) {
                    return Err(format!(
                        "mode {} needs bits = {bits} and group_size = {group}, got bits = {}, group_size = {}",
                        self.mode.name(),
                        self.bits,
                        self.group_size
                    ));
                }
            }
        }
        Ok(())
    }

    /// [`QuantSpec::validate`], further limited to what MLX reads and writes (no affine group 16;
    /// nvfp4's groups of 16 are MLX's own).
    pub fn validate_mlx(&self) -> std::result::Result<(), String> {
        self.validate()?;
        if self.mode == QuantMode::Affine && !Self::MLX_AFFINE_GROUPS.contains(&self.group_size) {
            return Err(format!("group_size = {} is not one of 32,64,128", self.group_size));
        }
        Ok(())
    }
}

/// A quantized matrix of `rows` x `cols` logical values.
#[derive(Debug, Clone)]
pub struct Quantized {
    /// Packed values, `u32` `[rows, cols * bits / 32]`.
    pub packed: Array,
    /// One scale per group, `[rows, cols / group_size]`.
    pub scales: Array,
    /// One bias per group, same shape and dtype as `scales`; an empty `f32 [0]` array for the
    /// floating-point modes, which have none.
    pub biases: Array,
    /// The format.
    pub spec: QuantSpec,
    /// nvfp4 only: the matrix's f32 global scale, when the checkpoint has one (every value is
    /// then multiplied by `global_scale / (448 * 6)`).
    pub global_scale: Option<f32>,
}

impl Quantized {
    /// Checks the parts against each other and against the logical `cols`.
    pub fn new(packed: Array, scales: Array, biases: Array, spec: QuantSpec, cols: usize) -> Result<Self> {
        if !spec.mode.has_biases() {
            return Err(Error::shape(
                "quantized",
                format!("mode {} has no biases: build it with Quantized::new_fp", spec.mode.name()),
            ));
        }
        let rows = check_packed(&packed, spec, cols)?;
        let bad = |m: String| Err(Error::shape("quantized", m));
        let groups = [rows, cols / spec.group_size];
        if scales.shape() != groups || biases.shape() != groups {
            return bad(format!("scales {:?} and biases {:?} must both be {groups:?}", scales.shape(), biases.shape()));
        }
        if !scales.dtype().is_float() || scales.dtype() != biases.dtype() {
            return bad(format!(
                "scales ({}) and biases ({}) must share one float dtype",
                scales.dtype(),
                biases.dtype()
            ));
        }
        Ok(Quantized { packed, scales, biases, spec, global_scale: None })
    }

    /// A matrix in a floating-point mode (mxfp4, mxfp8, nvfp4): `packed` codes, one `u8` scale
    /// per group, and for nvfp4 an optional global scale.
    pub fn new_fp(
        packed: Array,
        scales: Array,
        global_scale: Option<f32>,
        spec: QuantSpec,
        cols: usize,
    ) -> Result<Self> {
        if spec.mode.has_biases() {
            return Err(Error::shape("quantized", "affine matrices have biases: build them with Quantized::new"));
        }
        let rows = check_packed(&packed, spec, cols)?;
        let groups = [rows, cols / spec.group_size];
        if scales.shape() != groups || scales.dtype() != DType::U8 {
            return Err(Error::shape(
                "quantized",
                format!(
                    "{} scales must be uint8 {groups:?}, got {} {:?}",
                    spec.mode.name(),
                    scales.dtype(),
                    scales.shape()
                ),
            ));
        }
        if let Some(g) = global_scale {
            if spec.mode != QuantMode::Nvfp4 || !g.is_finite() {
                return Err(Error::shape(
                    "quantized",
                    format!("a global scale ({g}) needs mode nvfp4 and a finite value, got mode {}", spec.mode.name()),
                ));
            }
        }
        let biases = Array::from_slice::<f32>(&[], &[0])?;
        Ok(Quantized { packed, scales, biases, spec, global_scale })
    }

    /// Logical rows.
    pub fn rows(&self) -> usize {
        self.packed.dim(0)
    }

    /// Logical columns.
    pub fn cols(&self) -> usize {
        self.packed.dim(1) * 32 / self.spec.bits
    }
}

/// Checks `packed` against the spec and the logical `cols`; returns its rows.
fn check_packed(packed: &Array, spec: QuantSpec, cols: usize) -> Result<usize> {
    spec.validate().map_err(|m| Error::shape("quantized", m))?;
    let bad = |m: String| Err(Error::shape("quantized", m));
    if packed.dtype() != DType::U32 || packed.shape().len() != 2 {
        return bad(format!("packed weight must be uint32 [rows, words], got {} {:?}", packed.dtype(), packed.shape()));
    }
    if !cols.is_multiple_of(spec.group_size) || !(cols * spec.bits).is_multiple_of(32) {
        return bad(format!("{cols} columns do not split into groups of {} at {} bits", spec.group_size, spec.bits));
    }
    if packed.dim(1) != cols * spec.bits / 32 {
        return bad(format!(
            "packed weight has {} words per row; {cols} columns at {} bits need {}",
            packed.dim(1),
            spec.bits,
            cols * spec.bits / 32
        ));
    }
    Ok(packed.dim(0))
}

/// A weight matrix `[rows (out), cols (in)]` as a linear layer or embedding table stores it.
#[derive(Debug, Clone)]
pub enum Matrix {
    /// Plain floats (f32, f16 or bf16).
    Dense(Array),
    /// Quantized.
    Quantized(Quantized),
}

impl Matrix {
    /// Output features (or table rows).
    pub fn rows(&self) -> usize {
        match self {
            Matrix::Dense(a) => a.dim(0),
            Matrix::Quantized(q) => q.rows(),
        }
    }

    /// Input features (or embedding width).
    pub fn cols(&self) -> usize {
        match self {
            Matrix::Dense(a) => a.dim(1),
            Matrix::Quantized(q) => q.cols(),
        }
    }

    /// Output features `rows` (a rank's share of a projection's outputs).
    pub fn rows_part(&self, rows: std::ops::Range<usize>) -> Result<Matrix> {
        if rows.start > rows.end || rows.end > self.rows() {
            return Err(Error::shape("rows_part", format!("rows {rows:?} of {}", self.rows())));
        }
        let part = |a: &Array| a.slice_rows(rows.start, rows.end);
        Ok(match self {
            Matrix::Dense(a) => Matrix::Dense(part(a)?),
            Matrix::Quantized(q) => Matrix::Quantized(Quantized {
                packed: part(&q.packed)?,
                scales: part(&q.scales)?,
                biases: if q.spec.mode.has_biases() { part(&q.biases)? } else { q.biases.clone() },
                ..q.clone()
            }),
        })
    }

    /// Output features of each of `ranges`, stacked in order (a rank's share of a projection
    /// whose outputs are several parts, each split alike: queries, keys and values in one).
    pub fn rows_parts(&self, ranges: &[std::ops::Range<usize>]) -> Result<Matrix> {
        if let [range] = ranges {
            return self.rows_part(range.clone());
        }
        let parts = ranges.iter().map(|r| self.rows_part(r.clone())).collect::<Result<Vec<_>>>()?;
        Ok(match self {
            Matrix::Dense(_) => {
                let arrays: Vec<&Array> =
                    parts.iter().filter_map(|m| if let Matrix::Dense(a) = m { Some(a) } else { None }).collect();
                Matrix::Dense(stack_rows(&arrays)?)
            }
            Matrix::Quantized(q) => {
                let qs: Vec<&Quantized> =
                    parts.iter().filter_map(|m| if let Matrix::Quantized(q) = m { Some(q) } else { None }).collect();
                let field = |of: fn(&Quantized) -> &Array| stack_rows(&qs.iter().map(|q| of(q)).collect::<Vec<_>>());
                Matrix::Quantized(Quantized {
                    packed: field(|q| &q.packed)?,
                    scales: field(|q| &q.scales)?,
                    biases: if q.spec.mode.has_biases() { field(|q| &q.biases)? } else { q.biases.clone() },
                    ..q.clone()
                })
            }
        })
    }

    /// Input features `cols` (a rank's share of a projection's inputs); a quantized matrix
    /// splits only at whole groups and whole packed words.
    pub fn cols_part(&self, cols: std::ops::Range<usize>) -> Result<Matrix> {
        if cols.start > cols.end || cols.end > self.cols() {
            return Err(Error::shape("cols_part", format!("columns {cols:?} of {}", self.cols())));
        }
        Ok(match self {
            Matrix::Dense(a) => Matrix::Dense(a.columns(cols.start, cols.end)?),
            Matrix::Quantized(q) => {
                let (bits, group) = (q.spec.bits, q.spec.group_size);
                let whole = |c: usize| c.is_multiple_of(group) && (c * bits).is_multiple_of(32);
                if !whole(cols.start) || !whole(cols.end) {
                    return Err(Error::shape(
                        "cols_part",
                        format!("columns {cols:?} cut a group of {group} ({bits}-bit values)"),
                    ));
                }
                let groups = |a: &Array| a.columns(cols.start / group, cols.end / group);
                Matrix::Quantized(Quantized {
                    packed: q.packed.columns(cols.start * bits / 32, cols.end * bits / 32)?,
                    scales: groups(&q.scales)?,
                    biases: if q.spec.mode.has_biases() { groups(&q.biases)? } else { q.biases.clone() },
                    ..q.clone()
                })
            }
        })
    }

    /// Bytes the matrix occupies.
    pub fn nbytes(&self) -> usize {
        match self {
            Matrix::Dense(a) => a.nbytes(),
            Matrix::Quantized(q) => q.packed.nbytes() + q.scales.nbytes() + q.biases.nbytes(),
        }
    }
}

/// The rows of 2-D `parts` (the same columns and type) stacked in order.
fn stack_rows(parts: &[&Array]) -> Result<Array> {
    let first = parts.first().ok_or_else(|| Error::shape("stack_rows", "no parts".to_string()))?;
    let cols = first.dim(1);
    let total = parts.iter().map(|p| p.dim(0)).sum();
    let mut out = Array::zeros_on(&[1, total, cols], first.dtype(), first.device())?;
    let mut at = 0;
    for p in parts {
        if p.dim(0) > 0 {
            out.write_axis1(&p.reshape(&[1, p.dim(0), cols])?, at)?;
        }
        at += p.dim(0);
    }
    out.reshape(&[total, cols])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quantize::{dequantize, quantize_affine};

    /// Columns `cols` of each of `rows` rows of the row-major `w`.
    fn columns_of(w: &[f32], width: usize, cols: std::ops::Range<usize>) -> Vec<f32> {
        w.chunks(width).flat_map(|row| row[cols.clone()].to_vec()).collect()
    }

    #[test]
    fn a_matrix_parts_hold_its_rows_and_whole_groups_of_columns() {
        let (rows, cols) = (6, 256);
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
        let spec = QuantSpec { mode: QuantMode::Affine, bits: 3, group_size: 32 };
        let q = quantize_affine(&w, rows, cols, spec, DType::BF16).unwrap();
        let whole = dequantize(&q).unwrap();
        let m = Matrix::Quantized(q);
        let Matrix::Quantized(part) = m.cols_part(64..192).unwrap() else { unreachable!() };
        assert_eq!((part.rows(), part.cols()), (rows, 128));
        assert_eq!(dequantize(&part).unwrap(), columns_of(&whole, cols, 64..192));
        let Matrix::Quantized(part) = m.rows_part(2..5).unwrap() else { unreachable!() };
        assert_eq!(dequantize(&part).unwrap(), whole[2 * cols..5 * cols]);
        let e = m.cols_part(16..48).unwrap_err().to_string();
        assert!(e.contains("cut a group of 32"), "{e}");
        let dense = Matrix::Dense(Array::from_slice(&w, &[rows, cols]).unwrap());
        let Matrix::Dense(part) = dense.cols_part(3..10).unwrap() else { unreachable!() };
        assert_eq!(part.to_vec::<f32>().unwrap(), columns_of(&w, cols, 3..10));
        assert!(dense.rows_part(4..7).is_err());
        // Rows of several parts, stacked: 0..1 and 3..5, quantized and dense.
        let Matrix::Quantized(part) = m.rows_parts(&[0..1, 3..5]).unwrap() else { unreachable!() };
        assert_eq!(dequantize(&part).unwrap(), [&whole[..cols], &whole[3 * cols..5 * cols]].concat());
        let Matrix::Dense(part) = dense.rows_parts(&[4..6, 1..2]).unwrap() else { unreachable!() };
        assert_eq!(part.to_vec::<f32>().unwrap(), [&w[4 * cols..6 * cols], &w[cols..2 * cols]].concat());
    }
}
