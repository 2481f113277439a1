//! [`PendingRead`]: an array's values on their way to the host.

#[cfg(feature = "cuda")]
use crate::buffer::Bytes;
use crate::{Array, DType, Element, Error, Result};

/// The values of an array, copied to the host from the moment [`Array::read_later`] was called:
/// [`PendingRead::wait`] waits for that copy only, not for work enqueued on the device after it.
/// On the CPU the values are there at once.
#[derive(Debug)]
pub struct PendingRead {
    dtype: DType,
    from: Source,
}

#[derive(Debug)]
enum Source {
    Host(Array),
    #[cfg(feature = "cuda")]
    /// The copy, and its length in bytes.
    Device(crate::backends::cuda::PendingDownload, usize),
}

impl Array {
    /// Starts copying the elements to the host after the work enqueued so far, for
    /// [`PendingRead::wait`] to take later: a step's results can then be read while the next
    /// step, enqueued in between, runs on the device.
    pub fn read_later(&self) -> Result<PendingRead> {
        let dtype = self.dtype();
        match self.bytes_view() {
            #[cfg(feature = "cuda")]
            (Bytes::Cuda(buf), offset) => {
                let download = buf.download_later(offset, self.nbytes())?;
                Ok(PendingRead { dtype, from: Source::Device(download, self.nbytes()) })
            }
            _ => Ok(PendingRead { dtype, from: Source::Host(self.clone()) }),
        }
    }
}

impl PendingRead {
    /// The elements as `T` (the array's dtype), once the copy is done.
    pub fn wait<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(Error::shape(
                "read_later",
                format!("waited on as {} for an array of {}", T::DTYPE, self.dtype),
            ));
        }
        match &self.from {
            Source::Host(a) => a.to_vec(),
            #[cfg(feature = "cuda")]
            Source::Device(d, len) => {
                let bytes = d.wait(*len)?;
                let mut out = vec![T::zeroed(); len / std::mem::size_of::<T>()];
                bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(&bytes);
                Ok(out)
            }
        }
    }
}
