//! `Array`: an n-dimensional array on a device.
//!
//! Arrays are values: cloning shares the bytes, and an op returns a new array. Ops go through
//! the array's device backend; on the CPU they run at once, on an asynchronous device they would
//! be enqueued, which is why reading values (`to_vec`) is the only place that may wait.

use std::sync::Arc;

use half::{bf16, f16};

use crate::buffer::Bytes;
use crate::{DType, Device, Error, Result};

/// A Rust type that is the element of some [`DType`].
pub trait Element: bytemuck::Pod + Send + Sync {
    /// Its dtype.
    const DTYPE: DType;
}

macro_rules! element {
    ($t:ty, $d:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    };
}
element!(f32, F32);
element!(f16, F16);
element!(bf16, BF16);
element!(i32, I32);
element!(u32, U32);
element!(u8, U8);

/// An n-dimensional array.
#[derive(Debug, Clone)]
pub struct Array {
    shape: Vec<usize>,
    dtype: DType,
    device: Device,
    bytes: Arc<Bytes>,
    /// Where this array's elements start in `bytes` (non-zero for a view into a larger array).
    offset: usize,
}

impl Array {
    pub(crate) fn from_bytes(bytes: Bytes, shape: Vec<usize>, dtype: DType) -> Result<Self> {
        let want = shape.iter().product::<usize>() * dtype.size();
        if bytes.as_bytes().len() != want {
            return Err(Error::shape(
                "array",
                format!("{} bytes do not hold {shape:?} of {dtype}", bytes.as_bytes().len()),
            ));
        }
        Ok(Array { shape, dtype, device: Device::Cpu, bytes: Arc::new(bytes), offset: 0 })
    }

    /// An array holding a copy of `data`, with `shape`.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize]) -> Result<Self> {
        Self::from_bytes(Bytes::copy_of(bytemuck::cast_slice(data)), shape.to_vec(), T::DTYPE)
    }

    /// An array of zeros.
    pub fn zeros(shape: &[usize], dtype: DType) -> Self {
        let len = shape.iter().product::<usize>() * dtype.size();
        Array { shape: shape.to_vec(), dtype, device: Device::Cpu, bytes: Arc::new(Bytes::zeroed(len)), offset: 0 }
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The size of dimension `axis`; negative counts from the end.
    pub fn dim(&self, axis: isize) -> usize {
        let n = self.shape.len() as isize;
        self.shape[(if axis < 0 { n + axis } else { axis }) as usize]
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device it lives on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// True when it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes it occupies.
    pub fn nbytes(&self) -> usize {
        self.len() * self.dtype.size()
    }

    /// The same elements seen with another shape of the same size.
    pub fn reshape(&self, shape: &[usize]) -> Result<Self> {
        if shape.iter().product::<usize>() != self.len() {
            return Err(Error::shape("reshape", format!("{:?} cannot become {shape:?}", self.shape)));
        }
        Ok(Array { shape: shape.to_vec(), ..self.clone() })
    }

    /// Entry `i` of the first axis, as a view sharing this array's memory (no copy): an
    /// expert's matrix out of a stacked `[experts, rows, cols]` tensor, say.
    pub fn index_first(&self, i: usize) -> Result<Array> {
        let Some((&n, rest)) = self.shape.split_first() else {
            return Err(Error::shape("index_first", "a 0-d array has no first axis"));
        };
        if i >= n {
            return Err(Error::shape("index_first", format!("index {i} out of {n}")));
        }
        let stride = rest.iter().product::<usize>() * self.dtype.size();
        Ok(Array { shape: rest.to_vec(), offset: self.offset + i * stride, ..self.clone() })
    }

    /// The elements as `T`, copied to the host (waits for pending work on the device).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        Ok(self.host::<T>()?.to_vec())
    }

    /// The elements converted to f32 on the host, whatever the float dtype.
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        match self.dtype {
            DType::F32 => self.to_vec::<f32>(),
            DType::F16 => Ok(self.host::<f16>()?.iter().map(|v| v.to_f32()).collect()),
            DType::BF16 => Ok(self.host::<bf16>()?.iter().map(|v| v.to_f32()).collect()),
            DType::I32 => Ok(self.host::<i32>()?.iter().map(|&v| v as f32).collect()),
            DType::U32 => Ok(self.host::<u32>()?.iter().map(|&v| v as f32).collect()),
            DType::U8 => Ok(self.host::<u8>()?.iter().map(|&v| v as f32).collect()),
        }
    }

    /// The elements as a host slice of `T` (the CPU backend's view).
    pub(crate) fn host<T: Element>(&self) -> Result<&[T]> {
        if T::DTYPE != self.dtype {
            return Err(Error::shape("host", format!("array is {}, read as {}", self.dtype, T::DTYPE)));
        }
        bytemuck::try_cast_slice(self.raw_bytes()).map_err(|e| Error::shape("host", format!("misaligned bytes: {e}")))
    }

    /// Writable host elements; copies first if the bytes are shared or mapped.
    pub(crate) fn host_mut<T: Element>(&mut self) -> Result<&mut [T]> {
        if T::DTYPE != self.dtype {
            return Err(Error::shape("host_mut", format!("array is {}, written as {}", self.dtype, T::DTYPE)));
        }
        if self.offset != 0 || Arc::get_mut(&mut self.bytes).is_none() {
            self.bytes = Arc::new(Bytes::copy_of(self.raw_bytes()));
            self.offset = 0;
        }
        let bytes = Arc::get_mut(&mut self.bytes).expect("unique after the copy above");
        bytemuck::try_cast_slice_mut(bytes.as_mut_bytes())
            .map_err(|e| Error::shape("host_mut", format!("misaligned bytes: {e}")))
    }

    pub(crate) fn raw_bytes(&self) -> &[u8] {
        &self.bytes.as_bytes()[self.offset..self.offset + self.nbytes()]
    }
}
