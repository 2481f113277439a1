//! A copy to the host that is started now and read later ([`crate::PendingRead`]): the bytes
//! go to page-locked host memory on the device stream, in stream order, and reading waits only
//! for that copy, not for whatever was enqueued after it. The Batcher starts one for a step's
//! greedy picks before it enqueues the next step, so that it reads them while the next step runs.
//!
//! The page-locked buffers are kept for later copies of the same length rather than freed
//! (a Batcher's steps of one batch size read the same length): freeing page-locked memory may
//! wait for the device, which would make the reader wait for the next step after all.

use std::sync::Mutex;

use cudarc::driver::PinnedHostSlice;

use super::{driver_err, DeviceBuffer, State};
use crate::Result;

/// Page-locked buffers kept at most for later copies.
const KEPT: usize = 8;

/// Bytes on their way to the host.
pub(crate) struct PendingDownload {
    /// Taken back into the pool when dropped.
    host: Option<PinnedHostSlice<u8>>,
    st: &'static State,
}

/// A device's page-locked buffers not in use.
#[derive(Default)]
pub(crate) struct DownloadPool(Mutex<Vec<PinnedHostSlice<u8>>>);

impl std::fmt::Debug for PendingDownload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PendingDownload({} bytes)", self.host.as_ref().map_or(0, |h| h.len()))
    }
}

impl DeviceBuffer {
    /// Starts copying bytes `offset..offset + len` to the host after the work enqueued so far.
    pub(crate) fn download_later(&self, offset: usize, len: usize) -> Result<PendingDownload> {
        self.st.not_capturing("a copy to the host")?;
        self.settle()?;
        let stream = self.slice.stream();
        // Of exactly the copy's length: cudarc copies as many bytes as the host slice holds.
        let size = len.max(1);
        let kept = {
            let mut pool = self.st.downloads.0.lock().unwrap_or_else(|p| p.into_inner());
            pool.iter().position(|h| h.len() == size).map(|i| pool.swap_remove(i))
        };
        let mut host = match kept {
            Some(h) => h,
            // SAFETY: the buffer is written whole by the copy below before `PendingDownload::wait`
            // reads it (the slice's event, recorded after the copy, is waited on first). Flags 0:
            // cached host memory, which the host reads back quickly (write-combined would not).
            None => unsafe { stream.context().alloc_pinned_with_flags::<u8>(size, 0) }
                .map_err(driver_err("allocating page-locked host memory"))?,
        };
        if len > 0 {
            let src = self.slice.slice(offset..offset + len);
            // Into the page-locked slice itself: cudarc then records the slice's event after the
            // copy instead of waiting for the stream (which it does for pageable memory).
            stream.memcpy_dtoh(&src, &mut host).map_err(driver_err("copying to the host"))?;
        }
        Ok(PendingDownload { host: Some(host), st: self.st })
    }
}

impl PendingDownload {
    /// The first `len` bytes, once the copy is done (it waits for nothing enqueued after the
    /// copy).
    pub(crate) fn wait(&self, len: usize) -> Result<Vec<u8>> {
        let host = self.host.as_ref().expect("held until dropped");
        let bytes = host.as_slice().map_err(driver_err("waiting for a copy to the host"))?;
        Ok(bytes[..len].to_vec())
    }
}

impl Drop for PendingDownload {
    fn drop(&mut self) {
        if let Some(host) = self.host.take() {
            let mut pool = self.st.downloads.0.lock().unwrap_or_else(|p| p.into_inner());
            if pool.len() < KEPT {
                pool.push(host);
            }
        }
    }
}
