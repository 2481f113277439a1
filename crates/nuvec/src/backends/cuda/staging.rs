//! Small copies to the device through page-locked staging memory.
//!
//! A copy from pageable host memory makes the driver wait for the stream before it starts (CUDA's
//! "API synchronization behavior"), so a step's tables uploaded while earlier kernels are still
//! queued held the host until the device caught up: the host could not run ahead of the device,
//! and a Batcher step enqueued before the previous one was read waited for it at its first
//! upload. Bytes copied first into page-locked memory go to the device without that wait. The
//! staging buffers are a ring; a buffer is written again only after the copy that last read it
//! has run (its event), which a ring of [`SLOTS`] almost never has to wait for.

use cudarc::driver::{CudaEvent, CudaStream, PinnedHostSlice};

use super::knobs::Switch;
use super::{driver_err, State};
use crate::Result;

/// Staging buffers in the ring.
const SLOTS: usize = 64;

/// Uploads up to this many bytes are staged (step tables, token ids); larger ones (weights, at
/// load) copy from pageable memory as before.
pub(crate) const MOST_STAGED: usize = 1 << 20;

struct Slot {
    host: Option<PinnedHostSlice<u8>>,
    /// Recorded on the device stream after the copy that read this slot last.
    done: CudaEvent,
}

/// The ring of one device (see the module docs).
pub(crate) struct Staging {
    slots: Vec<Slot>,
    next: usize,
}

impl Staging {
    pub(crate) fn new(stream: &CudaStream) -> Result<Self> {
        let ctx = stream.context();
        let slots = (0..SLOTS)
            .map(|_| Ok(Slot { host: None, done: ctx.new_event(None).map_err(driver_err("creating an event"))? }))
            .collect::<Result<Vec<_>>>()?;
        Ok(Staging { slots, next: 0 })
    }

    /// Enqueues a copy of `bytes` (at most [`MOST_STAGED`]) to device address `dst` on `st`'s
    /// stream; `bytes` may be dropped as soon as this returns.
    pub(crate) fn copy(&mut self, st: &State, bytes: &[u8], dst: u64) -> Result<()> {
        let slot = &mut self.slots[self.next];
        self.next = (self.next + 1) % SLOTS;
        // An event never recorded counts as complete.
        slot.done.synchronize().map_err(driver_err("waiting for a staged copy"))?;
        if slot.host.as_ref().is_none_or(|h| h.len() < bytes.len()) {
            let len = bytes.len().next_power_of_two().max(4096);
            // SAFETY: page-locked bytes that each copy below writes before the device reads them.
            let host = unsafe { st.stream.context().alloc_pinned_with_flags::<u8>(len, 0) }
                .map_err(driver_err("allocating page-locked staging memory"))?;
            slot.host = Some(host);
        }
        let host = slot.host.as_mut().expect("allocated above");
        let at = host.as_mut_ptr().map_err(driver_err("waiting for page-locked staging memory"))?;
        // SAFETY: `at` points to at least `bytes.len()` bytes of the slot, which no copy reads any
        // more (its event was waited on above) and nothing else writes; the ranges are distinct.
        let staged = unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), at, bytes.len());
            std::slice::from_raw_parts(at as *const u8, bytes.len())
        };
        // SAFETY: `dst` holds at least `bytes.len()` bytes (the caller's buffer); the slot stays
        // allocated and unwritten until `done`, recorded right after, has run.
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, staged, st.stream.cu_stream()) }
            .map_err(driver_err("copying to the device"))?;
        slot.done.record(&st.stream).map_err(driver_err("recording a staged copy"))
    }
}

/// `set_staged_uploads`' choice.
static CHOSEN: Switch = Switch::unset();

/// Turns staged uploads on or off for the rest of the process (the bytes that arrive are the
/// same either way).
pub fn set_staged_uploads(on: bool) {
    CHOSEN.set(on);
}

impl State {
    /// Whether small uploads to this device go through the staging ring: the last
    /// [`set_staged_uploads`], else the device's `NUVEC_STAGED_UPLOADS` (off unless "1", see
    /// docs/batching.md).
    pub(crate) fn staged_uploads(&self) -> bool {
        CHOSEN.or(self.knobs.staged_uploads)
    }
}
