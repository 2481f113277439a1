//! A copy to the host that is started now and read later ([`crate::PendingRead`]): the bytes
//! go to page-locked host memory on the device stream, in stream order, and reading waits only
//! for that copy (an event recorded right after it), not for whatever was enqueued after it. The
//! Batcher starts one for a step's greedy picks before it enqueues the next step, so that it reads
//! them while the next step runs.
//!
//! The event is this module's own: cudarc records a page-locked slice's event only where it
//! tracks events, which this backend turns off (`State::new`), so the slice's own wait returns at
//! once. Each copy has page-locked memory of its own, freed when it is dropped. (Buffers kept for
//! later copies of the same length read back an earlier copy's bytes on an H100, for want of that
//! event; freeing page-locked memory may wait for the device, which a pipelined Batcher would
//! rather not: see docs/batching.md.)

use cudarc::driver::{CudaEvent, PinnedHostSlice};

use super::{driver_err, DeviceBuffer};
use crate::Result;

/// Bytes on their way to the host.
pub(crate) struct PendingDownload {
    host: PinnedHostSlice<u8>,
    /// Recorded on the stream right after the copy.
    done: CudaEvent,
}

impl std::fmt::Debug for PendingDownload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PendingDownload({} bytes)", self.host.len())
    }
}

impl DeviceBuffer {
    /// Starts copying bytes `offset..offset + len` to the host after the work enqueued so far.
    pub(crate) fn download_later(&self, offset: usize, len: usize) -> Result<PendingDownload> {
        self.st.not_capturing("a copy to the host")?;
        self.settle()?;
        let stream = self.slice.stream();
        let ctx = stream.context();
        // SAFETY: the buffer is written whole by the copy below before `PendingDownload::wait`
        // reads it (`done`, recorded after the copy, is waited on first). Flags 0: cached host
        // memory, which the host reads back quickly (write-combined would not).
        let mut host = unsafe { ctx.alloc_pinned_with_flags::<u8>(len.max(1), 0) }
            .map_err(driver_err("allocating page-locked host memory"))?;
        if len > 0 {
            let src = self.slice.slice(offset..offset + len);
            // Into the page-locked slice itself: an asynchronous copy (into pageable memory cudarc
            // would wait for the stream).
            stream.memcpy_dtoh(&src, &mut host).map_err(driver_err("copying to the host"))?;
        }
        let done = ctx.new_event(None).map_err(driver_err("creating an event"))?;
        done.record(stream).map_err(driver_err("recording a copy to the host"))?;
        Ok(PendingDownload { host, done })
    }
}

impl PendingDownload {
    /// The bytes, once the copy is done (it waits for nothing enqueued after the copy).
    pub(crate) fn wait(&self, len: usize) -> Result<Vec<u8>> {
        self.done.synchronize().map_err(driver_err("waiting for a copy to the host"))?;
        let bytes = self.host.as_slice().map_err(driver_err("reading a copy to the host"))?;
        Ok(bytes[..len].to_vec())
    }
}
