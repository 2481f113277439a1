//! One decode step captured as a CUDA graph and replayed at later positions ([`StepGraph`]).
//!
//! A step of batch 1 launches the same kernels in the same order at every position; only a few
//! launch sites take the position (or the token) as an argument: the one-token embedding
//! (`gather_rows`' row), rope (`rope_f32`, `rope_qk_f32`), the cache writes (`write_axis1*`,
//! `write_kv_rows_f32`) and attention (`attention_split_f32`'s kv length and chunk,
//! `attention_f32`'s kv length).
//!
//! Step scalars (the common case): every [`StepGraph`] owns a small device buffer, `[delta,
//! token]` ([`STEP_DELTA`], [`STEP_TOKEN`]: positions since the captured step, and the step's
//! token). While a capture runs, the launch sites above pass its address
//! ([`State::step_scalars`]) to their kernels, which then add `delta` to their captured position
//! argument (the embedding reads the token as its one id); each site also registers a check
//! ([`State::guard`]) that says whether a step is still one the graph computes as the eager path
//! would. A replay runs the checks, writes the two scalars (two 4-byte memsets on the stream) and
//! launches the graph: no node's parameters change. The split attention kernel recomputes the
//! eager chunk from the device kv length, and is launched with the largest split count the
//! cache can need; its extra splits write empty partials the merge skips (attention.cu), so the
//! results stay the eager ones, bit for bit.
//!
//! Patches (the fallback, for kernels without a step argument: `attention_f32`): the site
//! records its graph node (the capture's last node) and a closure from the step's position and
//! token to its grid and whole argument list ([`State::record`]); a replay sets those nodes'
//! parameters from the host (`cuGraphExecKernelNodeSetParams`) before launching.
//!
//! Memory while capturing: buffers are cut from the capture's arena, one allocation made
//! before the capture and kept by the graph (nothing is reused within a step). Allocations
//! through the driver would be the graph's memory nodes, and a memory node between two kernels
//! turns their programmatic edge (PDL: the next kernel's blocks launch while the one before
//! drains) into a full dependency: replays then ran ~5 % slower than eager launches (twelfth
//! session, H200). Past the arena (sized by the largest capture so far) allocations go to the
//! driver as before; a buffer made before the capture and
//! dropped during it is not freed (the graph may read it on every replay) but kept by the
//! [`StepGraph`] until it drops; a buffer made during the capture that outlives it (its
//! memory exists only inside the graph) fails the capture and is never freed. Uploads and
//! downloads fail while capturing (a replay would read the host memory of the capture).

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::ThreadId;

use cudarc::driver::sys::{self, CUstreamCaptureMode, CUstreamCaptureStatus};
use cudarc::driver::{CudaGraph, CudaSlice, DevicePtr, LaunchConfig};

use super::{state, DeviceBuffer, State};
use crate::{Array, DType, Device, Error, Result};

/// A kernel argument, as the kernel's parameter type.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KArg {
    U64(u64),
    I32(i32),
    I64(i64),
    F32(f32),
}

impl KArg {
    /// The value in the low bytes of a 64-bit slot (the driver reads each parameter's own size
    /// from its slot; little-endian hosts only, as every CUDA host is).
    fn word(self) -> u64 {
        match self {
            KArg::U64(v) => v,
            KArg::I32(v) => v as u32 as u64,
            KArg::I64(v) => v as u64,
            KArg::F32(v) => v.to_bits() as u64,
        }
    }
}

impl From<u64> for KArg {
    fn from(v: u64) -> Self {
        KArg::U64(v)
    }
}
impl From<i32> for KArg {
    fn from(v: i32) -> Self {
        KArg::I32(v)
    }
}
impl From<i64> for KArg {
    fn from(v: i64) -> Self {
        KArg::I64(v)
    }
}
impl From<f32> for KArg {
    fn from(v: f32) -> Self {
        KArg::F32(v)
    }
}

/// Where a replayed step is: positions after the captured one, and its token.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepPos {
    pub(crate) delta: usize,
    pub(crate) token: u32,
}

/// A position-dependent launch: its grid and arguments at a step, `None` when this graph
/// cannot compute that step as the eager path would (the caller then runs it eagerly).
pub(crate) type Remake = Box<dyn Fn(StepPos) -> Option<(LaunchConfig, Vec<KArg>)> + Send>;

/// Whether a launch reading the step scalars computes a step as the eager path would.
pub(crate) type Guard = Box<dyn Fn(StepPos) -> bool + Send>;

/// Index (in i32 words) of the positions since the captured step in the step scalars.
pub(crate) const STEP_DELTA: u64 = 0;
/// Index (in i32 words) of the step's token (read as a u32 id) in the step scalars.
pub(crate) const STEP_TOKEN: u64 = 1;
/// Bytes of the step scalars buffer (two i32 used, padded to 16).
const STEP_BYTES: usize = 16;

struct Patch {
    /// `CUgraphNode` of the captured kernel.
    node: usize,
    /// Its `CUfunction`.
    func: usize,
    remake: Remake,
}

/// What a capture in progress has gathered (`State::capture`).
pub(crate) struct Capture {
    epoch: u64,
    thread: ThreadId,
    patches: Vec<Patch>,
    guards: Vec<Guard>,
    /// Device address of the capture's step scalars.
    step: u64,
    /// Buffers made before the capture and dropped during it.
    deferred: Vec<CudaSlice<u8>>,
    /// Buffers made during the capture and alive.
    live: usize,
    /// Where its buffers are cut from (see the module notes).
    arena: Option<Arena>,
    /// Bytes the capture asked for in all (the arena's and the driver's).
    asked: usize,
    /// Why the capture cannot succeed (something no error return could report).
    poisoned: Option<String>,
}

static EPOCHS: AtomicU64 = AtomicU64::new(1);

/// The first capture's arena (an 8B's step asks for ~17 MB); later ones take what the largest
/// capture asked for.
pub(super) const FIRST_ARENA_BYTES: usize = 32 << 20;
/// Alignment of buffers cut from an arena (what the driver's allocations give).
const ARENA_ALIGN: usize = 256;

/// A capture's arena: one allocation made before the capture, handed out front to back
/// (nothing is reused within a step).
struct Arena {
    slice: CudaSlice<u8>,
    /// Device address of its first byte.
    base: u64,
    /// Bytes handed out.
    used: usize,
}

impl Arena {
    /// The next `cut` bytes' device address (`cut` a multiple of ARENA_ALIGN), if they fit.
    fn cut(&mut self, cut: usize) -> Option<u64> {
        if self.used + cut > self.slice.len() {
            return None;
        }
        self.used += cut;
        Some(self.base + (self.used - cut) as u64)
    }

    /// Whether device address `addr` lies in the arena.
    fn holds(&self, addr: u64) -> bool {
        addr >= self.base && addr < self.base + self.slice.len() as u64
    }
}

impl State {
    /// The epoch of the capture running on this device, 0 when none.
    pub(crate) fn capturing(&self) -> u64 {
        self.capture_epoch.load(Ordering::Acquire)
    }

    fn capture_slot(&self) -> std::sync::MutexGuard<'_, Option<Capture>> {
        self.capture.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fresh buffer during a capture (a graph allocation node), tagged with its epoch; `None`
    /// when no capture runs.
    pub(super) fn capture_alloc_if_capturing(&self, len: usize) -> Option<Result<(CudaSlice<u8>, u64)>> {
        if self.capturing() == 0 {
            return None;
        }
        let mut slot = self.capture_slot();
        let cap = slot.as_mut()?;
        if cap.thread != std::thread::current().id() {
            cap.poisoned = Some("another thread used the device during the capture".into());
        }
        let cut = len.max(1).next_multiple_of(ARENA_ALIGN);
        cap.asked += cut;
        if let Some(addr) = cap.arena.as_mut().and_then(|a| a.cut(cut)) {
            cap.live += 1;
            // SAFETY: [addr, addr + len) lies inside the arena, a live allocation of this
            // device that the capture and then its graph own; a slice cut from it is never
            // freed (`release` leaks it), and nothing else is cut from the same bytes.
            let slice = unsafe { self.stream.upgrade_device_ptr::<u8>(addr, len.max(1)) };
            return Some(Ok((slice, cap.epoch)));
        }
        // SAFETY: the bytes are written before they are read (callers fill the whole buffer, or
        // zero it); u8 has no invalid values.
        let slice = match unsafe { self.stream.alloc::<u8>(len.max(1)) } {
            Ok(s) => s,
            Err(e) => return Some(Err(Error::Device(format!("cuda: allocating {len} bytes during a capture: {e:?}")))),
        };
        cap.live += 1;
        Some(Ok((slice, cap.epoch)))
    }

    /// Frees or keeps a dropped buffer of epoch `epoch` (0: made outside any capture).
    pub(super) fn release(&self, slice: CudaSlice<u8>, epoch: u64, written: bool) {
        if written {
            self.graph_written_dropped.fetch_add(1, Ordering::AcqRel);
        }
        if epoch == 0 && self.capturing() == 0 {
            return self.recycle(slice);
        }
        let mut slot = self.capture_slot();
        match slot.as_mut() {
            Some(cap) if epoch == 0 => cap.deferred.push(slice),
            Some(cap) if epoch == cap.epoch => {
                cap.live -= 1;
                if cap.arena.as_ref().is_some_and(|a| a.holds(slice.device_ptr(&self.stream).0)) {
                    // The arena's bytes stay the graph's.
                    slice.leak();
                    return;
                }
                drop(slot);
                // Enqueued on the capturing stream: a free node of the graph.
                drop(slice);
            }
            None if epoch == 0 => {
                drop(slot);
                self.recycle(slice);
            }
            // Made inside a capture that has ended: its address exists only in that graph (the
            // capture failed for it), so it is never handed to the driver.
            _ => std::mem::forget(slice),
        }
    }

    /// Fails while capturing: `what` (an upload, a download, a wait) cannot be in a graph.
    pub(super) fn not_capturing(&self, what: &str) -> Result<()> {
        if self.capturing() == 0 {
            return Ok(());
        }
        let message = format!("{what} cannot be captured in a CUDA graph");
        if let Some(cap) = self.capture_slot().as_mut() {
            cap.poisoned.get_or_insert(message.clone());
        }
        Err(Error::Device(format!("cuda:{}: {message}", self.ordinal)))
    }

    /// The device address of the running capture's step scalars (`[delta, token]`, i32), 0 when
    /// no capture runs: kernels given 0 take their arguments as they are (the eager path).
    pub(crate) fn step_scalars(&self) -> u64 {
        if self.capturing() == 0 {
            return 0;
        }
        self.capture_slot().as_ref().map_or(0, |cap| cap.step)
    }

    /// Registers the check of a launch that reads the step scalars (a no-op when no capture
    /// runs): a replay at a step it refuses runs nothing.
    pub(crate) fn guard(&self, check: Guard) {
        if self.capturing() == 0 {
            return;
        }
        if let Some(cap) = self.capture_slot().as_mut() {
            cap.guards.push(check);
        }
    }

    /// Records the kernel just launched as kernel `name` as position-dependent (a no-op when
    /// no capture runs).
    pub(crate) fn record(&self, op: &str, name: &str, remake: Remake) -> Result<()> {
        if self.capturing() == 0 {
            return Ok(());
        }
        let func = self.func(name)?.cu_function() as usize;
        let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let (mut id, mut graph, mut deps, mut edges, mut n) =
            (0u64, std::ptr::null_mut(), std::ptr::null(), std::ptr::null(), 0usize);
        // SAFETY: the stream is this device's live stream; every out-pointer is a local of the
        // type the driver writes.
        let r = unsafe {
            sys::cuStreamGetCaptureInfo_v3(
                self.stream.cu_stream(),
                &mut status,
                &mut id,
                &mut graph,
                &mut deps,
                &mut edges,
                &mut n,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS
            || status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
            || n != 1
            || deps.is_null()
        {
            return Err(Error::Device(format!(
                "{op}: cannot find the captured {name} node on cuda:{} ({r:?}, {status:?}, {n} dependencies)",
                self.ordinal
            )));
        }
        // SAFETY: the driver returned one dependency at `deps`, valid until the next call on the
        // stream.
        let node = unsafe { *deps } as usize;
        if let Some(cap) = self.capture_slot().as_mut() {
            cap.patches.push(Patch { node, func, remake });
        }
        Ok(())
    }
}

/// One batch-1 decode step captured as a CUDA graph, replayable at later positions with other
/// tokens. Made by [`StepGraph::capture`]; see the module notes for what it may capture.
///
/// A replay moves every recorded position argument (cache offsets, rope offsets, kv lengths) on
/// by the positions since the captured step: a step whose ops take positions otherwise (a
/// rotating cache's ring index) must not be captured. Attention over 64 or more queries refuses
/// to be captured.
///
/// Use one device from one thread while capturing (another thread's work on the device would
/// fail the capture). A replay writes the buffers the captured step wrote (a model's caches):
/// the caller must keep them, unmoved, for as long as it replays; a replay refuses (returns
/// `None`) once any buffer written during any capture has been dropped.
pub struct StepGraph {
    graph: CudaGraph,
    st: &'static State,
    patches: Vec<Patch>,
    guards: Vec<Guard>,
    /// The step scalars the graph's kernels read (`[delta, token]`), written before each launch.
    step: DeviceBuffer,
    /// Position and token of the captured step.
    base: usize,
    /// The step's output, written by every launch.
    out: Array,
    /// Buffers the capture may read, dropped by their owners during it, and its arena.
    kept: Vec<CudaSlice<u8>>,
    /// `State::graph_written_dropped` when the capture ended.
    written_mark: u64,
}

impl std::fmt::Debug for StepGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StepGraph(cuda:{}, position {}, {} patched nodes)", self.st.ordinal, self.base, self.patches.len())
    }
}

impl Drop for StepGraph {
    fn drop(&mut self) {
        // Back to the allocator (work already enqueued, the graph's launches included, comes
        // before any reuse on the one stream), or kept by a capture running now.
        for slice in self.kept.drain(..) {
            self.st.release(slice, 0, false);
        }
    }
}

// SAFETY: the graph and its executable are only used through `&mut self` (replay) or by drop,
// so calls on them are serialized as the driver requires; the node and function handles are
// plain driver handles valid in any thread of the process.
unsafe impl Send for StepGraph {}

impl StepGraph {
    /// Runs `f` (one decode step at position `pos` with `token`, on device `ordinal`, giving
    /// an f32 output of `out_shape`) under a stream capture, then instantiates the graph and
    /// launches it once. Returns the step's output and the graph. On any error the capture is
    /// ended and nothing of it runs: the caller must treat the step as not done (what `f`
    /// changed on the host, e.g. cache offsets, is the caller's to undo). `f`'s errors are the
    /// caller's own type; the capture's own failures are [`Error::Device`] converted to it.
    pub fn capture<E: From<Error> + std::fmt::Display>(
        ordinal: usize,
        pos: usize,
        token: u32,
        out_shape: &[usize],
        f: impl FnOnce() -> std::result::Result<Array, E>,
    ) -> std::result::Result<(Array, StepGraph), E> {
        let st = state(ordinal)?;
        let out_len = out_shape.iter().product::<usize>();
        let out = Array::from_device_buffer(
            DeviceBuffer::alloc(st, out_len * 4)?,
            out_shape.to_vec(),
            DType::F32,
            Device::Cuda(ordinal),
        );
        // The step scalars of the captured step itself: delta 0, its token.
        let step = DeviceBuffer::zeroed(st, STEP_BYTES)?;
        write_step(st, step.ptr(), 0, token)?;
        let slice = st.take_or_alloc(st.capture_arena_bytes.load(Ordering::Relaxed))?;
        let base = slice.device_ptr(&st.stream).0;
        let arena = Arena { slice, base, used: 0 };
        {
            let mut slot = st.capture_slot();
            if slot.is_some() {
                return Err(Error::Device(format!("cuda:{ordinal}: a capture is already running")).into());
            }
            let epoch = EPOCHS.fetch_add(1, Ordering::Relaxed);
            *slot = Some(Capture {
                epoch,
                thread: std::thread::current().id(),
                patches: Vec::new(),
                guards: Vec::new(),
                step: step.ptr(),
                deferred: Vec::new(),
                live: 0,
                arena: Some(arena),
                asked: 0,
                poisoned: None,
            });
            st.stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(|e| {
                *slot = None;
                Error::Device(format!("cuda:{ordinal}: starting a capture: {e:?}"))
            })?;
            st.capture_epoch.store(epoch, Ordering::Release);
        }
        // The step, then its output copied into `out` (made before the capture); the step's own
        // output is freed inside the graph.
        let unwinding = EndOnUnwind(st);
        let ran = match f() {
            Ok(y) => finish_step(st, ordinal, &out, out_shape, y).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        std::mem::forget(unwinding);
        // Always end the capture, whatever happened.
        st.capture_epoch.store(0, Ordering::Release);
        let ended = st.stream.end_capture(sys::CUgraphInstantiate_flags(0));
        let Some(cap) = st.capture_slot().take() else {
            return Err(Error::Device(format!("cuda:{ordinal}: the capture's record vanished")).into());
        };
        // The next capture's arena holds what this one asked for.
        st.capture_arena_bytes.fetch_max(cap.asked.next_multiple_of(1 << 20), Ordering::Relaxed);
        // Kept with the buffers the capture may read (`kept`). If the capture fails its graph
        // never runs and the arena goes back to the allocator, unless buffers cut from it are
        // still alive (never, by construction; they are then leaked with it).
        let fail = |why: String, cap: Capture| -> Error {
            for slice in cap.deferred {
                st.recycle(slice);
            }
            if let Some(arena) = cap.arena {
                if cap.live == 0 {
                    st.recycle(arena.slice);
                } else {
                    arena.slice.leak();
                }
            }
            Error::Device(format!("cuda:{ordinal}: capturing a decode step: {why}"))
        };
        // The first thing no capture can do is the cause; what `f` made of it comes second.
        if let Some(why) = cap.poisoned.clone() {
            return Err(fail(why, cap).into());
        }
        if let Err(e) = ran {
            return Err(fail(e, cap).into());
        }
        if cap.live != 0 {
            let why = format!("{} buffer(s) made during the capture outlive it", cap.live);
            return Err(fail(why, cap).into());
        }
        let graph = match ended {
            Ok(Some(g)) => g,
            Ok(None) => return Err(fail("the capture gave no graph".into(), cap).into()),
            Err(e) => return Err(fail(format!("ending the capture: {e:?}"), cap).into()),
        };
        let mut g = StepGraph {
            graph,
            st,
            patches: cap.patches,
            guards: cap.guards,
            step,
            base: pos,
            out,
            kept: cap.deferred.into_iter().chain(cap.arena.map(|a| a.slice)).collect(),
            written_mark: st.graph_written_dropped.load(Ordering::Acquire),
        };
        // The captured parameters and the step scalars are the step's own: the first launch
        // needs no patching.
        let y = g.launch_and_copy()?;
        Ok((y, g))
    }

    /// Number of kernel nodes whose parameters each replay sets from the host (the fallback for
    /// kernels that cannot read the step scalars; 0 on the Llama/Qwen decode path).
    pub fn patched_nodes(&self) -> usize {
        self.patches.len()
    }

    /// Number of launch sites that read the step scalars (position-dependent kernels that a
    /// replay moves on without touching their nodes).
    pub fn step_scalar_sites(&self) -> usize {
        self.guards.len()
    }

    /// Position of the captured step.
    pub fn base_position(&self) -> usize {
        self.base
    }

    /// The step at position `pos` with `token`: its output (a new array), or `None` when this
    /// graph cannot compute that step as the eager path would (a position before the captured
    /// one, a launch site that refuses it, a buffer written by a capture dropped since). Then
    /// nothing ran; the caller runs the step eagerly.
    pub fn replay(&mut self, pos: usize, token: u32) -> Result<Option<Array>> {
        if pos < self.base || self.st.graph_written_dropped.load(Ordering::Acquire) != self.written_mark {
            return Ok(None);
        }
        let at = StepPos { delta: pos - self.base, token };
        if !self.guards.iter().all(|g| g(at)) {
            return Ok(None);
        }
        let Ok(delta) = i32::try_from(at.delta) else {
            return Ok(None);
        };
        let mut launches = Vec::with_capacity(self.patches.len());
        for p in &self.patches {
            match (p.remake)(at) {
                Some(l) => launches.push(l),
                None => return Ok(None),
            }
        }
        for (p, (cfg, args)) in self.patches.iter().zip(launches) {
            let mut words: Vec<u64> = args.iter().map(|a| a.word()).collect();
            let mut ptrs: Vec<*mut c_void> = words.iter_mut().map(|w| (w as *mut u64).cast()).collect();
            let params = sys::CUDA_KERNEL_NODE_PARAMS {
                func: p.func as sys::CUfunction,
                gridDimX: cfg.grid_dim.0,
                gridDimY: cfg.grid_dim.1,
                gridDimZ: cfg.grid_dim.2,
                blockDimX: cfg.block_dim.0,
                blockDimY: cfg.block_dim.1,
                blockDimZ: cfg.block_dim.2,
                sharedMemBytes: cfg.shared_mem_bytes,
                kernelParams: ptrs.as_mut_ptr(),
                extra: std::ptr::null_mut(),
                kern: std::ptr::null_mut(),
                ctx: std::ptr::null_mut(),
            };
            // SAFETY: the executable and the node come from the same capture and are alive
            // (owned by `self`); `kernelParams` points at one slot per parameter of `func`
            // (the argument list the launch site recorded for this kernel, in order), which the
            // driver copies before returning; pointer arguments are the captured step's
            // buffers (see the type's notes on keeping them).
            let r = unsafe {
                sys::cuGraphExecKernelNodeSetParams_v2(self.graph.cu_graph_exec(), p.node as sys::CUgraphNode, &params)
            };
            if r != sys::CUresult::CUDA_SUCCESS {
                return Err(Error::Device(format!(
                    "cuda:{}: setting a replayed kernel's parameters: {r:?}",
                    self.st.ordinal
                )));
            }
        }
        write_step(self.st, self.step.ptr(), delta, token)?;
        self.launch_and_copy().map(Some)
    }

    /// Launches the graph and copies its output into a new array (so that arrays handed out
    /// earlier keep their values).
    fn launch_and_copy(&mut self) -> Result<Array> {
        let ordinal = self.st.ordinal;
        self.graph.launch().map_err(|e| Error::Device(format!("cuda:{ordinal}: launching a step graph: {e:?}")))?;
        let len = self.out.len() * 4;
        let y = Array::from_device_buffer(
            DeviceBuffer::alloc(self.st, len)?,
            self.out.shape().to_vec(),
            DType::F32,
            Device::Cuda(ordinal),
        );
        copy_device(self.st, y.cuda_ptr()?, self.out.cuda_ptr()?, len)?;
        Ok(y)
    }
}

/// Ends a capture when `f` panics (forgotten when it returns), so that the stream is never
/// left capturing.
struct EndOnUnwind(&'static State);

impl Drop for EndOnUnwind {
    fn drop(&mut self) {
        let st = self.0;
        st.capture_epoch.store(0, Ordering::Release);
        // The graph, if any, is dropped unlaunched.
        let _ = st.stream.end_capture(sys::CUgraphInstantiate_flags(0));
        let cap = st.capture_slot().take();
        if let Some(cap) = cap {
            for slice in cap.deferred {
                st.recycle(slice);
            }
        }
    }
}

/// Checks the captured step's output `y` and copies it into `out` (inside the capture; `y` is
/// freed there).
fn finish_step(st: &State, ordinal: usize, out: &Array, out_shape: &[usize], y: Array) -> Result<()> {
    if y.shape() != out_shape || y.dtype() != DType::F32 || y.device() != Device::Cuda(ordinal) {
        return Err(Error::Device(format!(
            "captured step gave {} {:?} on {}, expected f32 {out_shape:?} on cuda:{ordinal}",
            y.dtype(),
            y.shape(),
            y.device()
        )));
    }
    copy_device(st, out.cuda_ptr()?, y.cuda_ptr()?, out.len() * 4)
}

/// Enqueues the writes of the step scalars at `step` (a [`STEP_BYTES`] device buffer): `delta`
/// and `token`, one 4-byte memset each on the device's stream (ordered before the graph's
/// launch that reads them, and after the previous launch that read them).
fn write_step(st: &State, step: u64, delta: i32, token: u32) -> Result<()> {
    for (index, word) in [(STEP_DELTA, delta as u32), (STEP_TOKEN, token)] {
        // SAFETY: `step` is a live allocation of this device of STEP_BYTES bytes (owned by the
        // StepGraph or the capture making it), and both words lie inside it.
        let r = unsafe { sys::cuMemsetD32Async(step + 4 * index, word, 1, st.stream.cu_stream()) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(Error::Device(format!("cuda:{}: writing a graph's step scalars: {r:?}", st.ordinal)));
        }
    }
    Ok(())
}

/// Enqueues a copy of `len` bytes between two device addresses.
pub(crate) fn copy_device(st: &State, dst: u64, src: u64, len: usize) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: both addresses are live allocations of this device of at least `len` bytes (the
    // callers' arrays, checked against `len`), ordered on the device's stream.
    unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, len, st.stream.cu_stream()) }
        .map_err(|e| Error::Device(format!("cuda:{}: copying on the device: {e:?}", st.ordinal)))
}
