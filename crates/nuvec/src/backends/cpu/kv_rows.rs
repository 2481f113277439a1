//! Key and value rows held in f32, f16 or bf16. A cache in half precision halves its memory and
//! the bytes attention reads per token; the kernels still compute in f32, widening rows as they
//! read them (exactly: every f16 and bf16 value is an f32 value).

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::simd;
use crate::{Array, DType, Error, Result};

/// The rows of a keys or values array `[kv_heads, capacity, dim]`.
#[derive(Clone, Copy)]
pub(crate) enum KvRows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Bf16(&'a [bf16]),
}

impl<'a> KvRows<'a> {
    pub(crate) fn of(op: &'static str, a: &'a Array) -> Result<Self> {
        Ok(match a.dtype() {
            DType::F32 => KvRows::F32(a.host()?),
            DType::F16 => KvRows::F16(a.host()?),
            DType::BF16 => KvRows::Bf16(a.host()?),
            other => return Err(Error::shape(op, format!("keys and values must be f32, f16 or bf16, got {other}"))),
        })
    }

    /// The elements `range` as f32: borrowed when already f32, else widened into `scratch`.
    pub(crate) fn f32s<'s>(&self, range: std::ops::Range<usize>, scratch: &'s mut Vec<f32>) -> &'s [f32]
    where
        'a: 's,
    {
        match self {
            KvRows::F32(x) => &x[range],
            _ => {
                scratch.clear();
                self.extend_f32(range, scratch);
                scratch
            }
        }
    }

    /// Appends the elements `range` to `out` as f32.
    pub(crate) fn extend_f32(&self, range: std::ops::Range<usize>, out: &mut Vec<f32>) {
        let at = out.len();
        out.resize(at + range.len(), 0.0);
        let dst = &mut out[at..];
        match self {
            KvRows::F32(x) => dst.copy_from_slice(&x[range]),
            KvRows::F16(x) => simd::widen(&x[range], dst),
            KvRows::Bf16(x) => simd::widen(&x[range], dst),
        }
    }

    pub(crate) fn is_f32(&self) -> bool {
        matches!(self, KvRows::F32(_))
    }
}

/// The writable rows of a keys or values array, taken once per write.
pub(crate) enum KvRowsMut<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
    Bf16(&'a mut [bf16]),
}

impl<'a> KvRowsMut<'a> {
    pub(crate) fn of(op: &'static str, a: &'a mut Array) -> Result<Self> {
        Ok(match a.dtype() {
            DType::F32 => KvRowsMut::F32(a.host_mut()?),
            DType::F16 => KvRowsMut::F16(a.host_mut()?),
            DType::BF16 => KvRowsMut::Bf16(a.host_mut()?),
            other => return Err(Error::shape(op, format!("cannot store into a {other} array"))),
        })
    }

    /// Elements `at..at + src.len()` = `src` narrowed to this dtype (f32 copies; f16 and bf16
    /// round to nearest even, as MLX's casts do).
    pub(crate) fn store(&mut self, at: usize, src: &[f32]) {
        let range = at..at + src.len();
        match self {
            KvRowsMut::F32(d) => d[range].copy_from_slice(src),
            KvRowsMut::F16(d) => d[range].convert_from_f32_slice(src),
            KvRowsMut::Bf16(d) => d[range].convert_from_f32_slice(src),
        }
    }
}
