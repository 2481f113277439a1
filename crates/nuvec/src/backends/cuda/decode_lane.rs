//! The prefill weight decoder's own stream: quantized weights are decoded to bf16 tiles there
//! while the device stream multiplies the tile before (issue 7).
//!
//! A bf16 prefill GEMM reads its weight as bf16 tiles that a decoder kernel writes first (16 GB
//! written per forward pass of an 8B: a fifth to a quarter of a 512-token prefill, 7 % of a
//! 4096-token one, by ncu on the H200). The
//! weights never change, so a tile's decoding depends on nothing the device stream computes; only
//! its buffer must not be overwritten while a GEMM still reads it. The lane holds two tile buffers
//! (slots) and a stream; for each tile the lane's stream waits until the GEMM that last read the
//! slot has finished, decodes into it and records `ready`; the device stream waits for `ready`,
//! runs the GEMM and records `free`. So tile i + 1 is decoded while GEMM i runs, and a weight's
//! first tile while the kernels before its linear run (attention, norms). Everything the lane's
//! stream does is joined into the device stream (through `ready`) before anything enqueued on
//! the device stream after it, so the single-stream ordering that the rest of the backend relies
//! on (frees, the caching allocator) still holds: a weight freed later is freed after its last
//! decoding.
//!
//! What it buys is modest (the CUDA journal, `git show 83079a1:docs/cuda.md`, eighth session:
//! random 8B prefill 512 +1.7 %, 4096 and a 1B unchanged): cuBLAS's GEMMs hold every SM (a
//! 384-thread CTA with all the registers), so the decoder overlaps only their tails and the short
//! kernels between them.
//!
//! `NUVEC_DECODE_STREAM=0` (or [`set_decode_stream`]) decodes on the device stream instead (the
//! previous behaviour; the results are the same bit for bit).

use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr};

use super::knobs::Switch;
use super::{driver_err, State};
use crate::Result;

/// Tile buffers the lane cycles through: the one being decoded and the one being multiplied.
const SLOTS: usize = 2;

struct Slot {
    /// Allocated on the lane's stream (so dropping it frees it in that stream's order).
    buf: Option<CudaSlice<u8>>,
    /// Recorded on the lane's stream when this slot's tile is decoded.
    ready: CudaEvent,
    /// Recorded on the device stream right after the GEMM that reads this slot.
    free: CudaEvent,
}

/// The lane of one device (see the module docs).
pub(crate) struct DecodeLane {
    stream: Arc<CudaStream>,
    slots: Vec<Slot>,
    next: usize,
}

impl DecodeLane {
    fn new(st: &State) -> Result<Self> {
        let ctx = st.stream.context();
        let stream = ctx.new_stream().map_err(driver_err("creating the weight decoder's stream"))?;
        let mut slots = Vec::with_capacity(SLOTS);
        for _ in 0..SLOTS {
            slots.push(Slot {
                buf: None,
                ready: ctx.new_event(None).map_err(driver_err("creating an event"))?,
                free: ctx.new_event(None).map_err(driver_err("creating an event"))?,
            });
        }
        Ok(DecodeLane { stream, slots, next: 0 })
    }

    /// The stream the decoder kernels go on.
    pub(crate) fn stream(&self) -> &CudaStream {
        &self.stream
    }

    /// The next slot, at least `bytes` long, once the GEMM that last read it is done (in the
    /// lane's stream order): its device address. [`Self::ready`] and [`Self::done`] then refer
    /// to it.
    pub(crate) fn begin(&mut self, bytes: usize) -> Result<u64> {
        let i = self.next;
        self.next = (i + 1) % SLOTS;
        let slot = &mut self.slots[i];
        // An event never recorded counts as complete, so the first use waits for nothing.
        self.stream.wait(&slot.free).map_err(driver_err("ordering a decoded tile after its GEMM"))?;
        if slot.buf.as_ref().is_none_or(|b| b.len() < bytes) {
            // Dropping the old buffer frees it on the lane's stream, after the wait above.
            slot.buf = None;
            // SAFETY: a u8 buffer that the decoder kernel writes whole before the GEMM reads it.
            let buf = unsafe { self.stream.alloc::<u8>(bytes) }.map_err(driver_err("allocating a weight tile"))?;
            slot.buf = Some(buf);
        }
        let buf = slot.buf.as_ref().expect("allocated above");
        let (ptr, _sync) = buf.device_ptr(&self.stream);
        Ok(ptr)
    }

    /// The slot [`Self::begin`] handed out last.
    fn current(&self) -> &Slot {
        &self.slots[(self.next + SLOTS - 1) % SLOTS]
    }

    /// The current slot is decoded: the device stream waits for it before the GEMM that reads it.
    pub(crate) fn ready(&self, st: &State) -> Result<()> {
        let slot = self.current();
        slot.ready.record(&self.stream).map_err(driver_err("recording a decoded tile"))?;
        st.stream.wait(&slot.ready).map_err(driver_err("waiting for a decoded tile"))
    }

    /// The GEMM reading the current slot is enqueued: the slot is free once the device stream
    /// gets here.
    pub(crate) fn done(&self, st: &State) -> Result<()> {
        self.current().free.record(&st.stream).map_err(driver_err("recording a tile's GEMM"))
    }
}

/// `set_decode_stream`'s choice.
static CHOSEN: Switch = Switch::unset();

/// Turns the decode lane on or off for the rest of the process (prefill results are the same
/// bit for bit either way; this is for measuring, and for the test that checks that sameness).
pub fn set_decode_stream(on: bool) {
    CHOSEN.set(on);
}

/// Whether prefill decodes weights on the lane: the last [`set_decode_stream`], else the
/// device's `NUVEC_DECODE_STREAM` (on unless "0").
fn enabled(st: &State) -> bool {
    CHOSEN.or(st.knobs.decode_stream)
}

impl State {
    /// The device's decode lane, made on first use; `None` while a CUDA graph capture runs (a
    /// capture records one stream) or when the lane is turned off.
    pub(crate) fn decode_lane(&self) -> Result<Option<MutexGuard<'_, DecodeLane>>> {
        if !enabled(self) || self.capturing() != 0 {
            return Ok(None);
        }
        if self.decode_lane.get().is_none() {
            // Two threads may both make one; the one not kept is dropped unused.
            let _ = self.decode_lane.set(Mutex::new(DecodeLane::new(self)?));
        }
        let lane = self.decode_lane.get().expect("set above");
        Ok(Some(lane.lock().unwrap_or_else(|p| p.into_inner())))
    }
}
