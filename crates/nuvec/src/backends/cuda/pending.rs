//! A copy to the host that is started now and read later ([`crate::PendingRead`]): the bytes
//! go to page-locked host memory on the device stream, in stream order, and reading waits only
//! for that copy (an event recorded right after it), not for whatever was enqueued after it. The
//! Batcher starts one for a step's greedy picks before it enqueues the next step, so that it reads
//! them while the next step runs.
//!
//! The event is this module's own: cudarc records a page-locked slice's event only where it
//! tracks events, which this backend turns off (`State::new`), so the slice's own wait returns at
//! once. The page-locked buffers (with their events) are kept for later copies of the same length
//! rather than freed (a Batcher's steps of one batch size read the same length): allocating or
//! freeing page-locked memory may wait for the device, which would make the reader wait for the
//! next step after all. A buffer dropped before its copy ran is safe to hand out again: the next
//! copy into it is enqueued behind that one on the same stream.

use std::sync::Mutex;

use cudarc::driver::{CudaEvent, PinnedHostSlice};

use super::{driver_err, DeviceBuffer, State};
use crate::Result;

/// Page-locked buffers kept at most for later copies.
const KEPT: usize = 8;

/// Bytes on their way to the host.
pub(crate) struct PendingDownload {
    /// The buffer and the event recorded after the copy into it; taken back into the pool when
    /// dropped.
    host: Option<(PinnedHostSlice<u8>, CudaEvent)>,
    st: &'static State,
}

/// A device's page-locked buffers not in use.
#[derive(Default)]
pub(crate) struct DownloadPool(Mutex<Vec<(PinnedHostSlice<u8>, CudaEvent)>>);

impl std::fmt::Debug for PendingDownload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PendingDownload({} bytes)", self.host.as_ref().map_or(0, |(h, _)| h.len()))
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
            pool.iter().position(|(h, _)| h.len() == size).map(|i| pool.swap_remove(i))
        };
        let (mut host, done) = match kept {
            Some(kept) => kept,
            None => {
                let ctx = stream.context();
                // SAFETY: the buffer is written whole by the copy below before
                // `PendingDownload::wait` reads it (`done`, recorded after the copy, is waited on
                // first). Flags 0: cached host memory, which the host reads back quickly
                // (write-combined would not).
                let host = unsafe { ctx.alloc_pinned_with_flags::<u8>(size, 0) }
                    .map_err(driver_err("allocating page-locked host memory"))?;
                (host, ctx.new_event(None).map_err(driver_err("creating an event"))?)
            }
        };
        if len > 0 {
            let src = self.slice.slice(offset..offset + len);
            // Into the page-locked slice itself: an asynchronous copy (into pageable memory cudarc
            // would wait for the stream).
            stream.memcpy_dtoh(&src, &mut host).map_err(driver_err("copying to the host"))?;
        }
        done.record(stream).map_err(driver_err("recording a copy to the host"))?;
        Ok(PendingDownload { host: Some((host, done)), st: self.st })
    }
}

impl PendingDownload {
    /// The first `len` bytes, once the copy is done (it waits for nothing enqueued after the
    /// copy).
    pub(crate) fn wait(&self, len: usize) -> Result<Vec<u8>> {
        let (host, done) = self.host.as_ref().expect("held until dropped");
        done.synchronize().map_err(driver_err("waiting for a copy to the host"))?;
        let bytes = host.as_slice().map_err(driver_err("reading a copy to the host"))?;
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
