//! Weight matrices: dense, or quantized in MLX's layouts.
//!
//! Affine quantization (MLX's default) stores, per row, groups of `group_size` values as unsigned
//! `bits`-wide integers packed LSB-first into a little-endian bit stream held in `u32` words,
//! with one scale and one bias per group: `w = scale * q + bias`.

use crate::{Array, DType, Error, Result};

/// The quantization formats MLX writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantMode {
    /// `w = scale * q + bias` per group; scales and biases in a float dtype.
    Affine,
}

impl QuantMode {
    /// Parses MLX's `mode` string.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "affine" => Ok(QuantMode::Affine),
            "mxfp4" | "mxfp8" | "nvfp4" => {
                Err(Error::Unsupported(format!("quantization mode {name} is not built yet")))
            }
            other => Err(Error::Unsupported(format!(
                "quantization mode {other:?} is not one of affine, mxfp4, mxfp8, nvfp4"
            ))),
        }
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
        }
        Ok(())
    }

    /// [`QuantSpec::validate`], further limited to what MLX reads and writes (no group 16).
    pub fn validate_mlx(&self) -> std::result::Result<(), String> {
        self.validate()?;
        if !Self::MLX_AFFINE_GROUPS.contains(&self.group_size) {
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
    /// One bias per group, same shape and dtype as `scales`.
    pub biases: Array,
    /// The format.
    pub spec: QuantSpec,
}

impl Quantized {
    /// Checks the parts against each other and against the logical `cols`.
    pub fn new(packed: Array, scales: Array, biases: Array, spec: QuantSpec, cols: usize) -> Result<Self> {
        spec.validate().map_err(|m| Error::shape("quantized", m))?;
        let rows = packed.dim(0);
        let bad = |m: String| Err(Error::shape("quantized", m));
        if packed.dtype() != DType::U32 || packed.shape().len() != 2 {
            return bad(format!(
                "packed weight must be uint32 [rows, words], got {} {:?}",
                packed.dtype(),
                packed.shape()
            ));
        }
        if !cols.is_multiple_of(spec.group_size) || !(cols * spec.bits).is_multiple_of(32) {
            return bad(format!(
                "{cols} columns do not split into groups of {} at {} bits",
                spec.group_size, spec.bits
            ));
        }
        if packed.dim(1) != cols * spec.bits / 32 {
            return bad(format!(
                "packed weight has {} words per row; {cols} columns at {} bits need {}",
                packed.dim(1),
                spec.bits,
                cols * spec.bits / 32
            ));
        }
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
        Ok(Quantized { packed, scales, biases, spec })
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

    /// Bytes the matrix occupies.
    pub fn nbytes(&self) -> usize {
        match self {
            Matrix::Dense(a) => a.nbytes(),
            Matrix::Quantized(q) => q.packed.nbytes() + q.scales.nbytes() + q.biases.nbytes(),
        }
    }
}
