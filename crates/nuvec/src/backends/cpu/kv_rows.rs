//! Key and value rows held in f32, f16 or bf16. A cache in half precision halves its memory and
//! the bytes attention reads per token; the kernels still compute in f32, widening rows as they
//! read them (exactly: every f16 and bf16 value is an f32 value).

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

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
            KvRows::F16(x) => {
                scratch.resize(range.len(), 0.0);
                x[range].convert_to_f32_slice(scratch);
                scratch
            }
            KvRows::Bf16(x) => {
                scratch.resize(range.len(), 0.0);
                x[range].convert_to_f32_slice(scratch);
                scratch
            }
        }
    }

    pub(crate) fn is_f32(&self) -> bool {
        matches!(self, KvRows::F32(_))
    }
}

/// `dst[..] = src` narrowed to `dst`'s dtype (f32 copies; f16 and bf16 round to nearest even,
/// as MLX's casts do).
pub(crate) fn store_f32s(dst: &mut Array, at: usize, src: &[f32]) -> Result<()> {
    let range = at..at + src.len();
    match dst.dtype() {
        DType::F32 => dst.host_mut::<f32>()?[range].copy_from_slice(src),
        DType::F16 => dst.host_mut::<f16>()?[range].convert_from_f32_slice(src),
        DType::BF16 => dst.host_mut::<bf16>()?[range].convert_from_f32_slice(src),
        other => return Err(Error::shape("write_axis1", format!("cannot store into a {other} array"))),
    }
    Ok(())
}
