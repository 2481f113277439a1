//! `Array`: an n-dimensional array on a device.
//!
//! Arrays are values: cloning shares the bytes, and an op returns a new array. Ops go through
//! the array's device backend; on the CPU they run at once, on an asynchronous device they would
//! be enqueued, which is why reading values (`to_vec`) is the only place that may wait.

use std::sync::Arc;

use half::{bf16, f16};

use crate::buffer::Bytes;
use crate::{DType, Device, Error, Matrix, Quantized, Result};

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
        #[cfg(feature = "cuda")]
        if self.device != Device::Cpu {
            return self.to_device(Device::Cpu)?.to_vec();
        }
        Ok(self.host::<T>()?.to_vec())
    }

    /// Columns `start..end` of a 2-D array, copied (a device array's through the host): a
    /// rank's slice of a weight's inputs when a model is split across ranks.
    pub fn columns(&self, start: usize, end: usize) -> Result<Array> {
        let [rows, cols] = self.shape[..] else {
            return Err(Error::shape("columns", format!("{:?} is not a matrix", self.shape)));
        };
        if start > end || end > cols {
            return Err(Error::shape("columns", format!("columns {start}..{end} of {cols}")));
        }
        #[cfg(feature = "cuda")]
        if self.device != Device::Cpu {
            return self.to_device(Device::Cpu)?.columns(start, end)?.to_device(self.device);
        }
        let size = self.dtype.size();
        let bytes = self.raw_bytes();
        let mut out = Vec::with_capacity(rows * (end - start) * size);
        for r in 0..rows {
            out.extend_from_slice(&bytes[(r * cols + start) * size..(r * cols + end) * size]);
        }
        Self::from_bytes(Bytes::copy_of(&out), vec![rows, end - start], self.dtype)
    }

    /// The elements converted to f32 on the host, whatever the float dtype.
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        #[cfg(feature = "cuda")]
        if self.device != Device::Cpu {
            return self.to_device(Device::Cpu)?.to_f32_vec();
        }
        match self.dtype {
            DType::F32 => self.to_vec::<f32>(),
            DType::F16 => Ok(self.host::<f16>()?.iter().map(|v| v.to_f32()).collect()),
            DType::BF16 => Ok(self.host::<bf16>()?.iter().map(|v| v.to_f32()).collect()),
            DType::I32 => Ok(self.host::<i32>()?.iter().map(|&v| v as f32).collect()),
            DType::U32 => Ok(self.host::<u32>()?.iter().map(|&v| v as f32).collect()),
            DType::U8 => Ok(self.host::<u8>()?.iter().map(|&v| v as f32).collect()),
        }
    }

    /// The same values in the float dtype `dtype` (f32, f16 or bf16; narrowing rounds to nearest
    /// even, as MLX's casts do), on the same device. Between float dtypes on a CUDA device the
    /// conversion runs there; otherwise it runs on the host (for caches and checkpoints, not for
    /// per-token work).
    pub fn astype(&self, dtype: DType) -> Result<Array> {
        if dtype == self.dtype {
            return Ok(self.clone());
        }
        // On a GPU the conversion runs there (a cache of f16 or bf16 takes each step's f32 rows so).
        #[cfg(feature = "cuda")]
        if let (Device::Cuda(ordinal), true) = (self.device, self.dtype.is_float()) {
            return crate::backends::cuda::CudaBackend::get(ordinal).cast(self, dtype);
        }
        let wide = self.to_f32_vec()?;
        let host = match dtype {
            DType::F32 => Array::from_slice(&wide, &self.shape)?,
            DType::F16 => Array::from_slice(&wide.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>(), &self.shape)?,
            DType::BF16 => {
                Array::from_slice(&wide.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>(), &self.shape)?
            }
            other => return Err(Error::shape("astype", format!("{} to {other}: only float dtypes", self.dtype))),
        };
        host.to_device(self.device)
    }

    /// The elements as a host slice of `T` (the CPU backend's view).
    pub(crate) fn host<T: Element>(&self) -> Result<&[T]> {
        if T::DTYPE != self.dtype {
            return Err(Error::shape("host", format!("array is {}, read as {}", self.dtype, T::DTYPE)));
        }
        #[cfg(feature = "cuda")]
        self.check_host("host")?;
        bytemuck::try_cast_slice(self.raw_bytes()).map_err(|e| Error::shape("host", format!("misaligned bytes: {e}")))
    }

    /// Writable host elements; copies first if the bytes are shared or mapped.
    pub(crate) fn host_mut<T: Element>(&mut self) -> Result<&mut [T]> {
        if T::DTYPE != self.dtype {
            return Err(Error::shape("host_mut", format!("array is {}, written as {}", self.dtype, T::DTYPE)));
        }
        #[cfg(feature = "cuda")]
        self.check_host("host_mut")?;
        if self.offset != 0 || Arc::get_mut(&mut self.bytes).is_none() {
            self.bytes = Arc::new(Bytes::copy_of(self.raw_bytes()));
            self.offset = 0;
        }
        let bytes = Arc::get_mut(&mut self.bytes).expect("unique after the copy above");
        bytemuck::try_cast_slice_mut(bytes.as_mut_bytes())
            .map_err(|e| Error::shape("host_mut", format!("misaligned bytes: {e}")))
    }

    /// Writable host bytes, whatever the dtype (copies first, as [`Array::host_mut`]).
    pub(crate) fn host_bytes_mut(&mut self) -> Result<&mut [u8]> {
        #[cfg(feature = "cuda")]
        self.check_host("host_bytes_mut")?;
        if self.offset != 0 || Arc::get_mut(&mut self.bytes).is_none() {
            self.bytes = Arc::new(Bytes::copy_of(self.raw_bytes()));
            self.offset = 0;
        }
        let len = self.nbytes();
        let bytes = Arc::get_mut(&mut self.bytes).expect("unique after the copy above");
        Ok(&mut bytes.as_mut_bytes()[..len])
    }

    /// The storage and where this array starts in it.
    pub(crate) fn bytes_view(&self) -> (&Bytes, usize) {
        (&self.bytes, self.offset)
    }

    pub(crate) fn raw_bytes(&self) -> &[u8] {
        &self.bytes.as_bytes()[self.offset..self.offset + self.nbytes()]
    }

    /// A copy on `device` (the same array when it is already there). Host to GPU and back copy
    /// the bytes; reading a GPU array's values waits for the work pending on it.
    pub fn to_device(&self, device: Device) -> Result<Array> {
        if device == self.device {
            return Ok(self.clone());
        }
        #[cfg(feature = "cuda")]
        {
            let host = match &*self.bytes {
                Bytes::Cuda(buf) => {
                    let mut bytes = Bytes::zeroed(self.nbytes());
                    buf.download(self.offset, bytes.as_mut_bytes())?;
                    Array::from_bytes(bytes, self.shape.clone(), self.dtype)?
                }
                _ => self.clone(),
            };
            match device {
                Device::Cpu => Ok(host),
                Device::Cuda(i) => {
                    let buf = crate::backends::cuda::DeviceBuffer::upload(
                        crate::backends::cuda::state(i)?,
                        host.raw_bytes(),
                    )?;
                    Ok(Array::from_device_buffer(buf, self.shape.clone(), self.dtype, device))
                }
            }
        }
        #[cfg(not(feature = "cuda"))]
        unreachable!("the CPU is the only device without the cuda feature")
    }

    /// An array of zeros on `device`.
    pub fn zeros_on(shape: &[usize], dtype: DType, device: Device) -> Result<Self> {
        match device {
            Device::Cpu => Ok(Self::zeros(shape, dtype)),
            #[cfg(feature = "cuda")]
            Device::Cuda(i) => {
                let len = shape.iter().product::<usize>() * dtype.size();
                let buf = crate::backends::cuda::DeviceBuffer::zeroed(crate::backends::cuda::state(i)?, len)?;
                Ok(Array::from_device_buffer(buf, shape.to_vec(), dtype, device))
            }
        }
    }

    /// An array holding a copy of `data`, with `shape`, on `device`.
    pub fn from_slice_on<T: Element>(data: &[T], shape: &[usize], device: Device) -> Result<Self> {
        Self::from_slice(data, shape)?.to_device(device)
    }
}

impl Matrix {
    /// The device its parts live on (a quantized matrix's packed values decide).
    pub fn device(&self) -> Device {
        match self {
            Matrix::Dense(a) => a.device(),
            Matrix::Quantized(q) => q.packed.device(),
        }
    }

    /// A copy with every part on `device`.
    pub fn to_device(&self, device: Device) -> Result<Matrix> {
        Ok(match self {
            Matrix::Dense(a) => Matrix::Dense(a.to_device(device)?),
            Matrix::Quantized(q) => Matrix::Quantized(Quantized {
                packed: q.packed.to_device(device)?,
                scales: q.scales.to_device(device)?,
                // The floating-point modes' biases are empty: nothing to move.
                biases: if q.biases.is_empty() { q.biases.clone() } else { q.biases.to_device(device)? },
                spec: q.spec,
                global_scale: q.global_scale,
            }),
        })
    }
}

/// Device-memory access for the CUDA backend.
#[cfg(feature = "cuda")]
impl Array {
    pub(crate) fn from_device_buffer(
        buf: crate::backends::cuda::DeviceBuffer,
        shape: Vec<usize>,
        dtype: DType,
        device: Device,
    ) -> Array {
        debug_assert_eq!(buf.len(), shape.iter().product::<usize>() * dtype.size());
        Array { shape, dtype, device, bytes: Arc::new(Bytes::Cuda(buf)), offset: 0 }
    }

    /// An error unless the array lives on the host.
    fn check_host(&self, op: &'static str) -> Result<()> {
        if self.device == Device::Cpu {
            return Ok(());
        }
        Err(Error::Device(format!(
            "{op}: the array is on {}, not in host memory; copy it with to_device(Device::Cpu)",
            self.device
        )))
    }

    /// The device address of the first element, for a kernel that reads the values (a norm's
    /// output whose scale is still pending is scaled first: `DeviceBuffer::settle`).
    pub(crate) fn cuda_ptr(&self) -> Result<u64> {
        if let Bytes::Cuda(buf) = &*self.bytes {
            buf.settle()?;
        }
        self.cuda_addr()
    }

    /// The device address of the first element, for alignment checks only (nothing is settled).
    pub(crate) fn cuda_addr(&self) -> Result<u64> {
        match &*self.bytes {
            Bytes::Cuda(buf) => Ok(buf.ptr() + self.offset as u64),
            _ => Err(Error::Device(format!("the array is on {}, not on a CUDA device", self.device))),
        }
    }

    /// The device address of the first element, for writing: the bytes are copied first when
    /// they are shared with another array (or this is a view), as `host_mut` does.
    pub(crate) fn cuda_ptr_mut(&mut self) -> Result<u64> {
        let Bytes::Cuda(buf) = &*self.bytes else {
            return Err(Error::Device(format!("the array is on {}, not on a CUDA device", self.device)));
        };
        buf.settle()?; // a partial write keeps the other values
        if self.offset != 0 || Arc::get_mut(&mut self.bytes).is_none() {
            let Bytes::Cuda(buf) = &*self.bytes else { unreachable!("checked above") };
            let copy = buf.copy_range(self.offset, self.nbytes())?;
            self.bytes = Arc::new(Bytes::Cuda(copy));
            self.offset = 0;
        }
        match Arc::get_mut(&mut self.bytes) {
            Some(Bytes::Cuda(buf)) => {
                buf.invalidate();
                Ok(buf.ptr())
            }
            _ => unreachable!("a unique device buffer after the copy above"),
        }
    }

    /// Records `bytes` (written by the launch that wrote this array) as `form` of this array
    /// (`DeviceBuffer::set_derived`).
    pub(crate) fn set_derived(&self, form: crate::backends::cuda::Derived, bytes: crate::backends::cuda::DeviceBuffer) {
        if let Bytes::Cuda(buf) = &*self.bytes {
            buf.set_derived(form, bytes);
        }
    }

    /// Marks this array's bytes as a norm's output with its scale pending in the parts just
    /// recorded (`DeviceBuffer::set_pending_norm`).
    pub(crate) fn set_pending_norm(&self) {
        if let Bytes::Cuda(buf) = &*self.bytes {
            buf.set_pending_norm();
        }
    }

    /// The device address of the integer parts holding this array's pending norm scale
    /// (`set_pending_norm`), when its bytes are such a norm's output not yet settled and the
    /// array views all of them; a kernel that applies the scale itself reads the bytes through
    /// [`Array::cuda_addr`] then.
    pub(crate) fn pending_norm_parts(&self) -> Option<u64> {
        match &*self.bytes {
            Bytes::Cuda(buf) if buf.is_pending_norm() => self.derived(crate::backends::cuda::Derived::IntParts),
            _ => None,
        }
    }

    /// The device address of `form` of this array, when it was recorded for its bytes and the
    /// array views all of them (a reshape does; a window into a larger array does not).
    pub(crate) fn derived(&self, form: crate::backends::cuda::Derived) -> Option<u64> {
        match &*self.bytes {
            Bytes::Cuda(buf) if self.offset == 0 && self.nbytes() == buf.len() => buf.derived(form),
            _ => None,
        }
    }

    /// A view of `shape` starting `byte_offset` bytes into this array (no copy).
    pub(crate) fn window(&self, shape: Vec<usize>, byte_offset: usize) -> Array {
        Array { shape, offset: self.offset + byte_offset, ..self.clone() }
    }
}

// CUDA graphs
impl Array {
    /// An identity of the storage this array views (equal for arrays sharing one buffer, e.g. a
    /// cache and the views fetched from it; an address, so a freed buffer's id may come back for
    /// a new one). A replayed step graph checks with it that a cache still holds the buffers
    /// it captured.
    pub fn storage_id(&self) -> usize {
        Arc::as_ptr(&self.bytes) as *const u8 as usize
    }
}
