//! The CUDA backend (cargo feature `cuda`): CUDA C kernels compiled at run time by NVRTC, once per
//! process and device, plus cuBLAS SGEMM for the large products. The driver, NVRTC and cuBLAS are
//! loaded dynamically (cudarc's `dynamic-loading`), so a binary built without CUDA installed runs
//! wherever those libraries are found, and reports a clear error where they are not.
//!
//! Arrays on `Device::Cuda(i)` keep their bytes in one device allocation ([`DeviceBuffer`]); every
//! op is enqueued on the device's one stream and returns at once, and reading values
//! (`Array::to_vec`, `Array::to_device(Device::Cpu)`) waits for it.
//!
//! Numerics follow the CPU backend (the reference): activations f32, f32 accumulation, weights
//! f32/f16/bf16 or MLX affine-quantized (bits 2,3,4,5,6,8; groups 32,64,128) decoded in registers.

mod alloc;
// The prefill weight decoder's own stream.
mod decode_lane;
// The kernels' PTX kept on disk between processes.
mod kernel_cache;
mod knobs;
mod ops;
// CUDA graphs: a decode step captured and replayed.
mod graph;
mod pending;
mod staging;

use std::collections::HashMap;
use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

use crate::{Error, Result};

pub use alloc::{available_bytes, cached_bytes, set_cache_limit};
// Prefill weights decoded on a second stream.
pub use decode_lane::set_decode_stream;
pub use ops::CudaBackend;
pub use ops::{set_moe_gather_rows, set_moe_grouped_rows};
pub use staging::set_staged_uploads;
// Phase 4: the prefill matmul precision (bf16 tensor cores by default).
pub use ops::{matmul_precision, set_matmul_precision, MatmulPrecision};
// CUDA graphs
pub use graph::StepGraph;
pub(crate) use pending::PendingDownload;

/// Definitions every kernel source starts with (dtype helpers, bit unpacking, reductions).
pub const PRELUDE: &str = include_str!("kernels/common.cuh");

/// The kernel sources, by file name, without the [`PRELUDE`].
pub const SOURCES: [(&str, &str); 16] = [
    ("elementwise.cu", include_str!("kernels/elementwise.cu")),
    ("linear.cu", include_str!("kernels/linear.cu")),
    ("attention.cu", include_str!("kernels/attention.cu")),
    // Gemma 4
    ("gemma4.cu", include_str!("kernels/gemma4.cu")),
    // fpquant: mxfp4, mxfp8, nvfp4 weights.
    ("fp_linear.cu", include_str!("kernels/fp_linear.cu")),
    // Qwen3.5 hybrids: Gated DeltaNet.
    ("gated_delta.cu", include_str!("kernels/gated_delta.cu")),
    // gpt-oss: the clamped SwiGLU (its attention sinks are in attention.cu).
    ("gpt_oss.cu", include_str!("kernels/gpt_oss.cu")),
    // Mixture-of-experts layers: routing and the chosen experts without host reads.
    ("moe.cu", include_str!("kernels/moe.cu")),
    ("moe_router.cu", include_str!("kernels/moe_router.cu")),
    // decode fusions
    ("fused.cu", include_str!("kernels/fused.cu")),
    // Phase 4: tensor-core prefill (bf16 operands for cuBLAS).
    ("prefill.cu", include_str!("kernels/prefill.cu")),
    // Flash attention for bf16 prefill (mma.sync, sm_80+).
    ("flash_attention.cu", include_str!("kernels/flash_attention.cu")),
    // Batched decode: few-row quantized products on the tensor cores (mma.sync, sm_80+).
    ("qmma.cu", include_str!("kernels/qmma.cu")),
    // Batched decode over 4-bit weights: few-row products in integers (mma.sync, sm_80+).
    ("qimma.cu", include_str!("kernels/qimma.cu")),
    // Sampled requests' draws where the logits are.
    ("sampling.cu", include_str!("kernels/sampling.cu")),
    // A paged cache's quantized keys and values.
    ("kv_quant.cu", include_str!("kernels/kv_quant.cu")),
];

/// The value `NUVEC_NVRTC_DEFINES` (comma-separated `NAME=VALUE` kernel macros, experiments
/// only) gives macro `name`, for host code that must agree with the kernels on it.
pub(crate) fn nvrtc_define(name: &str) -> Option<String> {
    nvrtc_defines().iter().find_map(|d| d.strip_prefix(name)?.strip_prefix('=').map(str::to_string))
}

/// The kernel macros `NUVEC_NVRTC_DEFINES` sets (`NAME=VALUE` or `NAME`, comma-separated;
/// experiments only, e.g. `QG_PF_BYTES=0`).
fn nvrtc_defines() -> Vec<String> {
    crate::tuning::env("NUVEC_NVRTC_DEFINES")
        .map(|v| v.split(',').filter(|d| !d.is_empty()).map(str::to_string).collect())
        .unwrap_or_default()
}

/// The NVRTC options every source is compiled with, for a virtual architecture such as
/// `compute_90` (the device's own at run time; `compute_90a` on sm_90, for the warpgroup MMA).
/// `scripts/check-cuda-kernels.sh` compiles both.
pub fn nvrtc_options(arch: &str) -> Vec<String> {
    vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()]
}

/// Each kernel source as NVRTC compiles it: `(file name, PRELUDE + source)`.
pub fn kernel_sources() -> Vec<(&'static str, String)> {
    SOURCES.iter().map(|(name, src)| (*name, format!("{PRELUDE}\n#line 1 \"{name}\"\n{src}"))).collect()
}

/// NVRTC's version, part of the kernel cache's key (the libraries are loaded: `device_count`).
fn nvrtc_version() -> Result<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes one int through each pointer; both point at live locals.
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if status != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Device(format!("cuda: reading NVRTC's version: {status:?}")));
    }
    Ok((major, minor))
}

/// Every kernel source with its PTX for virtual architecture `arch`: from the kernel cache in
/// `dir` (kernel_cache.rs; None: no cache) where it holds them, else compiled by NVRTC, the
/// sources at once on threads of their own (NVRTC compiles distinct programs concurrently; the
/// longest source then sets the time, not the sum).
fn compiled_sources(arch: &str, dir: Option<std::path::PathBuf>) -> Result<Vec<(&'static str, String, String)>> {
    let mut options = nvrtc_options(arch);
    options.extend(nvrtc_defines().iter().map(|d| format!("-D{d}")));
    let version = nvrtc_version()?;
    let compile = |name: &'static str, src: String| -> Result<(&'static str, String, String)> {
        let key = kernel_cache::key(name, &src, &options, version);
        let ptx = kernel_cache::ptx(dir.as_deref(), name, &key, || {
            let opts = CompileOptions { options: options.clone(), name: Some(name.into()), ..Default::default() };
            let ptx = compile_ptx_with_opts(&src, opts).map_err(|e| match e {
                cudarc::nvrtc::CompileError::CompileError { log, .. } => Error::Device(format!(
                    "cuda: NVRTC could not compile {name} for {arch}:\n{}",
                    log.to_string_lossy()
                )),
                other => Error::Device(format!("cuda: NVRTC on {name}: {other:?}")),
            })?;
            Ok(ptx.to_src())
        })?;
        Ok((name, src, ptx))
    };
    std::thread::scope(|scope| {
        let jobs: Vec<_> =
            kernel_sources().into_iter().map(|(name, src)| scope.spawn(move || compile(name, src))).collect();
        jobs.into_iter()
            .map(|job| {
                job.join().unwrap_or_else(|_| Err(Error::Device("cuda: a kernel compile thread panicked".into())))
            })
            .collect()
    })
}

/// The `extern "C" __global__` kernel names a source defines.
fn kernel_names(src: &str) -> Vec<&str> {
    let marker = "extern \"C\" __global__ void ";
    src.match_indices(marker)
        .filter_map(|(i, _)| {
            let mut rest = &src[i + marker.len()..];
            // An optional `__launch_bounds__(...)` sits between `void` and the name.
            if let Some(after) = rest.strip_prefix("__launch_bounds__(") {
                rest = after.split_once(')').map(|(_, r)| r.trim_start())?;
            }
            rest.find('(').map(|end| rest[..end].trim())
        })
        .collect()
}

/// Number of CUDA devices, or an error saying why none can be used (no driver library, no
/// device, a driver error).
pub fn device_count() -> Result<usize> {
    check_libraries()?;
    let n = CudaContext::device_count().map_err(|e| Error::Device(format!("cuda: counting devices: {e:?}")))?;
    Ok(n.max(0) as usize)
}

/// Makes sure device `ordinal` is usable: context, stream, compiled kernels, cuBLAS. The first
/// call per device compiles the kernels (a fraction of a second); later calls return at once.
pub fn init(ordinal: usize) -> Result<()> {
    state(ordinal).map(|_| ())
}

fn check_libraries() -> Result<()> {
    // SAFETY: these only try to dlopen the libraries by their usual names.
    let (driver, nvrtc, cublas) = unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            cudarc::nvrtc::sys::is_culib_present(),
            cudarc::cublas::sys::is_culib_present(),
        )
    };
    let missing: Vec<&str> = [(driver, "libcuda (the NVIDIA driver)"), (nvrtc, "libnvrtc"), (cublas, "libcublas")]
        .iter()
        .filter(|(present, _)| !present)
        .map(|(_, name)| *name)
        .collect();
    if !missing.is_empty() {
        return Err(Error::Device(format!(
            "cuda: no CUDA device usable here: cannot load {} (install the NVIDIA driver and CUDA 13 \
             libraries, or add their folder to LD_LIBRARY_PATH)",
            missing.join(", ")
        )));
    }
    Ok(())
}

/// One device's context, stream, kernels and cuBLAS handle.
pub(crate) struct State {
    pub(crate) ordinal: usize,
    pub(crate) stream: Arc<CudaStream>,
    funcs: HashMap<String, CudaFunction>,
    pub(crate) blas: Mutex<CudaBlas>,
    /// Freed buffers kept for the next allocation of their size class (see `alloc.rs`).
    cache: Mutex<alloc::Cache>,
    // ---- CUDA graphs (graph.rs) ----
    /// The capture running on the stream, if any.
    capture: Mutex<Option<graph::Capture>>,
    /// Its epoch (0: none), read without the lock on every allocation.
    capture_epoch: AtomicU64,
    /// Buffers written during a capture that have been dropped since (a replay then refuses).
    graph_written_dropped: AtomicU64,
    /// Bytes of the next capture's arena (graph.rs): what the largest capture so far asked for.
    capture_arena_bytes: std::sync::atomic::AtomicUsize,
    /// Kernels launch with programmatic stream serialization (see [`State::launch_raw_on`]).
    pdl: bool,
    /// bf16 prefill attention runs the flash kernels (`kernels/flash_attention.cu`, sm_80+;
    /// `NUVEC_FLASH_ATTENTION=0` keeps the cuBLAS path).
    pub(crate) flash: bool,
    /// The prefill weight decoder's stream and tile buffers (`decode_lane.rs`), made on first use.
    decode_lane: OnceLock<Mutex<decode_lane::DecodeLane>>,
    /// Each few-row product kernel's launch facts (`ops/qmma.rs`, `ops/qimma.rs`), read at
    /// module load on sm_80+ only.
    pub(crate) qmma_kernels: HashMap<String, ops::qmma::QmmaKernel>,
    /// The last few step tables copied to the device, with their bytes (`upload_shared`).
    shared_uploads: Mutex<Vec<(Vec<u8>, Arc<DeviceBuffer>)>>,
    /// Page-locked buffers small uploads go through (`staging.rs`), made on first use.
    staging: OnceLock<Mutex<staging::Staging>>,
    /// Page-locked buffers of finished copies to the host, for the next (`pending.rs`).
    downloads: pending::DownloadPool,
    /// Counters for kernels whose last block to finish does the launch's final work
    /// (moe_router.cu's `moe_route_dense`, one per row): zero between launches, because that
    /// block sets its counter back to 0, and every launch on the one device stream waits for the
    /// kernel before it. Made with the state, outside any capture, so graphs keep its address.
    tickets: (CudaSlice<u32>, u64),
    /// The device's knobs (knobs.rs), read when it started.
    pub(crate) knobs: knobs::Knobs,
}

impl fmt::Debug for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cuda:{} ({} kernels)", self.ordinal, self.funcs.len())
    }
}

fn driver_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> Error + '_ {
    move |e| Error::Device(format!("cuda: {what}: {e:?}"))
}

/// Counters in [`State::tickets`].
pub(crate) const TICKETS: usize = 256;

impl State {
    /// The device address of the block counters ([`TICKETS`] of them).
    pub(crate) fn tickets(&self) -> u64 {
        self.tickets.1
    }

    fn new(ordinal: usize) -> Result<Self> {
        // A knob value the device cannot take fails its first use, not a later op.
        let knobs = knobs::Knobs::read(ordinal)?;
        let count = device_count()?;
        if ordinal >= count {
            return Err(Error::Device(format!(
                "cuda:{ordinal} does not exist: this machine has {count} CUDA device(s)"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver_err("creating a context"))?;
        // SAFETY: the backend orders its work itself: every allocation, copy, kernel and free goes
        // through the device stream, except the prefill weight decoder's tiles, which the decode
        // lane (decode_lane.rs) orders with its own events; cudarc's tracking has nothing to add.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver_err("creating a stream"))?;
        // Stream-ordered allocations come from the device's default memory pool, which by default
        // hands its free memory back to the driver at every synchronization (each token's logits
        // read): the next large allocation (a prefill tile, attention scores) then maps fresh pages,
        // milliseconds each. Keep the freed memory in the pool instead.
        // SAFETY: the device handle comes from the context just made; the attribute takes a u64.
        unsafe {
            let pool = cudarc::driver::result::device::get_default_mem_pool(ctx.cu_device())
                .map_err(driver_err("reading the memory pool"))?;
            let mut keep = u64::MAX;
            cudarc::driver::result::mem_pool::set_attribute(
                pool,
                cudarc::driver::sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep as *mut u64).cast(),
            )
            .map_err(driver_err("setting the memory pool's release threshold"))?;
        }
        let (major, minor) = ctx.compute_capability().map_err(driver_err("reading the compute capability"))?;
        // sm_90a's PTX for an H100 / H200: its warpgroup MMA (ops/qimma.rs, the qwg kernels),
        // which NVRTC compiles from 12.0 (an older one keeps compute_90 and the register kernels).
        let wgmma = ops::qimma::wgmma_arch(major, minor) && nvrtc_version()? >= (12, 0);
        let arch = if wgmma { "compute_90a".to_string() } else { format!("compute_{major}{minor}") };
        let sms = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver_err("reading the multiprocessor count"))?;
        let mut qmma_kernels = HashMap::new();
        let mut funcs = HashMap::new();
        for (_name, src, ptx) in compiled_sources(&arch, kernel_cache::folder())? {
            let module = ctx.load_module(Ptx::from_src(ptx)).map_err(driver_err("loading a compiled module"))?;
            for kernel in kernel_names(&src) {
                let f = module.load_function(kernel).map_err(driver_err("finding a kernel"))?;
                // The flash-attention kernels' double-buffered K/V tiles pass the default 48 KiB
                // of dynamic shared memory at head size 128, as do the few-row quantized
                // products' pipelines (all run on sm_80+ only).
                // The few-row products (qmma.cu, qimma.cu): threads and shared memory per block.
                let few_row = ops::qmma::qmma_smem_bytes(kernel)
                    .map(|smem| (ops::qmma::QM_THREADS, smem))
                    .or_else(|| ops::qimma::qimma_launch(kernel))
                    .filter(|_| wgmma || !ops::qimma::needs_wgmma(kernel));
                let big_smem = kernel
                    .strip_prefix("flash_attn_bf16_d")
                    .and_then(|d| d.parse().ok())
                    .map(ops::prefill::flash_smem_bytes)
                    .or(few_row.map(|(_, smem)| smem));
                if let Some(bytes) = big_smem.filter(|_| major >= 8) {
                    f.set_attribute(
                        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        bytes as i32,
                    )
                    .map_err(driver_err("raising a kernel's shared memory"))?;
                }
                if let Some((threads, smem)) = few_row.filter(|_| major >= 8) {
                    let per_sm = f
                        .occupancy_max_active_blocks_per_multiprocessor(threads, smem, None)
                        .map_err(driver_err("reading a kernel's occupancy"))?;
                    let slots = (sms.max(1) as usize) * (per_sm.max(1) as usize);
                    qmma_kernels.insert(kernel.to_string(), ops::qmma::QmmaKernel { slots, smem });
                }
                funcs.insert(kernel.to_string(), f);
            }
        }
        let tickets = stream.alloc_zeros::<u32>(TICKETS).map_err(driver_err("allocating the block counters"))?;
        stream.synchronize().map_err(driver_err("zeroing the block counters"))?;
        let tickets_ptr = tickets.device_ptr(&stream).0;
        let blas = CudaBlas::new(stream.clone())
            .map_err(|e| Error::Device(format!("cuda: creating a cuBLAS handle: {e:?}")))?;
        Ok(State {
            ordinal,
            stream,
            funcs,
            blas: Mutex::new(blas),
            cache: Mutex::new(alloc::Cache::new(knobs.alloc_cache_bytes)),
            capture: Mutex::new(None),
            capture_epoch: AtomicU64::new(0),
            graph_written_dropped: AtomicU64::new(0),
            capture_arena_bytes: std::sync::atomic::AtomicUsize::new(graph::FIRST_ARENA_BYTES),
            qmma_kernels,
            pdl: major >= 9 && knobs.pdl,
            flash: major >= 8 && knobs.flash_attention,
            decode_lane: OnceLock::new(),
            shared_uploads: Mutex::new(Vec::new()),
            staging: OnceLock::new(),
            downloads: pending::DownloadPool::default(),
            tickets: (tickets, tickets_ptr),
            knobs,
        })
    }

    /// Enqueues kernel `f` on `stream` (the device stream, or the decode lane's) with the
    /// argument addresses `params`. On sm_90
    /// and later (unless `NUVEC_PDL=0`) with programmatic stream serialization: the kernel may
    /// begin launching while the kernel before it finishes, which hides most of the gap between
    /// two dependent kernels of a decode step. That is safe because every nuvec kernel starts
    /// with `pdl_begin()` (common.cuh), which waits for the previous kernel to complete and its
    /// writes to be visible before anything else; work of other libraries (cuBLAS, copies) is
    /// launched without the attribute, so it waits as usual, and a kernel after it waits for it.
    ///
    /// # Safety
    /// `params` holds one pointer per kernel parameter, each to a value of the parameter's type
    /// that lives until this returns; pointer values among them address live allocations of this
    /// device sized for the launch; `stream` belongs to this device's context.
    pub(crate) unsafe fn launch_raw_on(
        &self,
        stream: &CudaStream,
        f: &CudaFunction,
        cfg: cudarc::driver::LaunchConfig,
        params: &mut [*mut std::ffi::c_void],
    ) -> std::result::Result<(), cudarc::driver::DriverError> {
        use cudarc::driver::sys;
        stream.context().bind_to_thread()?;
        let (grid, block) = (cfg.grid_dim, cfg.block_dim);
        if !self.pdl {
            // SAFETY: as the caller promises; the stream belongs to this context.
            return unsafe {
                cudarc::driver::result::launch_kernel(
                    f.cu_function(),
                    grid,
                    block,
                    cfg.shared_mem_bytes,
                    stream.cu_stream(),
                    params,
                )
            };
        }
        // SAFETY: an all-zero launch attribute value is valid (a union of integers and structs of
        // integers); the field written is the one the attribute id names.
        let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
        value.programmaticStreamSerializationAllowed = 1;
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value,
        };
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block.0,
            blockDimY: block.1,
            blockDimZ: block.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: `config` and `attr` live across the call; the function, stream and parameters
        // are as the caller promises.
        unsafe { sys::cuLaunchKernelEx(&config, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }.result()
    }

    pub(crate) fn func(&self, name: &str) -> Result<&CudaFunction> {
        self.funcs.get(name).ok_or_else(|| Error::Device(format!("cuda: kernel {name} was not compiled")))
    }
}

/// Devices whose state is found without a lock (every op asks for it, several times).
const FAST_DEVICES: usize = 16;

/// The state of device `ordinal`, made on first use and kept for the process.
pub(crate) fn state(ordinal: usize) -> Result<&'static State> {
    static FAST: [OnceLock<&'static State>; FAST_DEVICES] = [const { OnceLock::new() }; FAST_DEVICES];
    if let Some(s) = FAST.get(ordinal).and_then(OnceLock::get) {
        return Ok(s);
    }
    static STATES: OnceLock<Mutex<HashMap<usize, &'static State>>> = OnceLock::new();
    let mut states = STATES.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = states.get(&ordinal) {
        return Ok(s);
    }
    let s: &'static State = Box::leak(Box::new(State::new(ordinal)?));
    states.insert(ordinal, s);
    if let Some(slot) = FAST.get(ordinal) {
        // Made under the lock above, so no other thread set it.
        let _ = slot.set(s);
    }
    Ok(s)
}

/// A form of an f32 array's bytes that the products reading it take instead, written by the
/// kernel that made the array (so that no conversion launch runs before the product).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Derived {
    /// The integer one-row GEMVs' parts of the bytes as one f32 row (`xsplit_chunk`,
    /// kernels/common.cuh).
    IntParts,
    /// The bytes as rows of `k` values in bf16, as the bf16 register products take them
    /// (`qdec_tile_at`, kernels/common.cuh; ops/qimma.rs).
    Bf16Tiles { k: usize },
}

impl Derived {
    /// Where a buffer keeps this form (one of each kind).
    fn slot(self) -> usize {
        match self {
            Derived::IntParts => 0,
            Derived::Bf16Tiles { .. } => 1,
        }
    }
}

/// Bytes in device memory: one allocation of the device's stream (taken from the device's cache
/// of freed buffers when one of the size class is there, and handed back to it when dropped),
/// plus a host copy made only if something reads the array as raw host bytes (saving it, say).
pub(crate) struct DeviceBuffer {
    /// At least `len` bytes (its size class); taken out only by `drop`.
    slice: ManuallyDrop<CudaSlice<u8>>,
    ptr: u64,
    len: usize,
    st: &'static State,
    mirror: OnceLock<Vec<u64>>,
    /// Other forms of these bytes that the kernel writing them wrote too (see [`Derived`]),
    /// forgotten with the host copy.
    derived: [OnceLock<Box<(Derived, DeviceBuffer)>>; 2],
    /// The bytes are a norm's u = h * w with its scale pending (ops/norm_fold.rs): the integer parts
    /// holds the scale's terms, and `settle` (ops.rs) scales the bytes in place before anything
    /// reads them as values.
    pending_norm: std::sync::atomic::AtomicBool,
    /// The capture that made it (its memory is graph memory), 0 for none.
    epoch: u64,
    /// Written by a captured step (a replay writes it again): its drop stops replays.
    graph_written: bool,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceBuffer(cuda:{}, {} bytes)", self.st.ordinal, self.len)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: `slice` is taken once, here, and `self` is not used afterwards.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        self.st.release(slice, self.epoch, self.graph_written);
    }
}

/// Step tables kept by [`DeviceBuffer::upload_shared`]: a step's four (rope positions and store
/// rows, attention tables and lengths).
const SHARED_UPLOADS: usize = 4;

impl DeviceBuffer {
    /// `len` bytes, uninitialized (every kernel writing one fills it whole).
    pub(crate) fn alloc(st: &'static State, len: usize) -> Result<Self> {
        // While a capture runs, the memory comes from the driver (a graph allocation).
        let (slice, epoch) = match st.capture_alloc_if_capturing(len) {
            Some(made) => made?,
            None => (st.take_or_alloc(len)?, 0),
        };
        let ptr = {
            let (ptr, _sync) = slice.device_ptr(&st.stream);
            ptr
        };
        Ok(DeviceBuffer {
            ptr,
            slice: ManuallyDrop::new(slice),
            len,
            st,
            mirror: OnceLock::new(),
            derived: [OnceLock::new(), OnceLock::new()],
            pending_norm: std::sync::atomic::AtomicBool::new(false),
            epoch,
            graph_written: false,
        })
    }

    /// `len` zero bytes.
    pub(crate) fn zeroed(st: &'static State, len: usize) -> Result<Self> {
        let mut b = Self::alloc(st, len)?;
        if len > 0 {
            let mut dst = b.slice.slice_mut(..len);
            st.stream.memset_zeros(&mut dst).map_err(driver_err("zeroing memory"))?;
        }
        Ok(b)
    }

    /// A device copy of `bytes`: small ones through page-locked staging memory (`staging.rs`),
    /// so that the copy does not wait for the work queued before it.
    pub(crate) fn upload(st: &'static State, bytes: &[u8]) -> Result<Self> {
        st.not_capturing("a copy from the host")?;
        let mut b = Self::alloc(st, bytes.len())?;
        if bytes.is_empty() {
            return Ok(b);
        }
        if bytes.len() <= staging::MOST_STAGED && st.staged_uploads() {
            if st.staging.get().is_none() {
                let made = staging::Staging::new(&st.stream)?;
                let _ = st.staging.set(Mutex::new(made));
            }
            let mut ring = st.staging.get().expect("made above").lock().unwrap_or_else(|p| p.into_inner());
            ring.copy(st, bytes, b.ptr)?;
            return Ok(b);
        }
        let mut dst = b.slice.slice_mut(..bytes.len());
        st.stream.memcpy_htod(bytes, &mut dst).map_err(driver_err("copying to the device"))?;
        Ok(b)
    }

    /// A device copy of `bytes` that nothing writes, shared with earlier callers that asked
    /// for the same bytes: the tables a step of several sequences gives every layer (positions,
    /// store rows, block tables, lengths) are copied once per step instead of once per layer,
    /// since each copy from pageable host memory is a stream-ordered operation between kernels
    /// that costs host time and a gap on the device.
    pub(crate) fn upload_shared(st: &'static State, bytes: &[u8]) -> Result<Arc<Self>> {
        let mut kept = st.shared_uploads.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = kept.iter().position(|(b, _)| b.as_slice() == bytes) {
            let hit = kept.remove(i);
            let buf = hit.1.clone();
            kept.insert(0, hit);
            return Ok(buf);
        }
        let buf = Arc::new(Self::upload(st, bytes)?);
        kept.insert(0, (bytes.to_vec(), buf.clone()));
        kept.truncate(SHARED_UPLOADS);
        Ok(buf)
    }

    /// The device address of the first byte.
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Copies bytes `offset..offset + out.len()` to `out`, waiting for pending work.
    pub(crate) fn download(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.st.not_capturing("a copy to the host")?;
        self.settle()?;
        let stream = self.slice.stream();
        if !out.is_empty() {
            let src = self.slice.slice(offset..offset + out.len());
            stream.memcpy_dtoh(&src, out).map_err(driver_err("copying to the host"))?;
        }
        stream.synchronize().map_err(driver_err("waiting for the device"))
    }

    /// A new buffer holding bytes `offset..offset + len`.
    pub(crate) fn copy_range(&self, offset: usize, len: usize) -> Result<Self> {
        self.settle()?;
        let st = self.st;
        let mut b = Self::alloc(st, len)?;
        if len > 0 {
            let src = self.slice.slice(offset..offset + len);
            let mut dst = b.slice.slice_mut(..len);
            st.stream.memcpy_dtod(&src, &mut dst).map_err(driver_err("copying on the device"))?;
        }
        Ok(b)
    }

    /// The bytes as host memory, copied once (and again after `invalidate`). A failed copy gives
    /// no bytes, which every reader reports as a size mismatch.
    pub(crate) fn host_mirror(&self) -> &[u8] {
        let words = self.mirror.get_or_init(|| {
            let mut words = vec![0u64; self.len.div_ceil(8)];
            match self.download(0, &mut bytemuck::cast_slice_mut(&mut words)[..self.len]) {
                Ok(()) => words,
                Err(_) => Vec::new(),
            }
        });
        let bytes: &[u8] = bytemuck::cast_slice(words);
        &bytes[..self.len.min(bytes.len())]
    }

    /// Records `form` of these bytes (see [`Derived`]); a second record of one form for the
    /// same bytes is dropped (one kernel writes a buffer's rows once).
    pub(crate) fn set_derived(&self, form: Derived, bytes: DeviceBuffer) {
        let _ = self.derived[form.slot()].set(Box::new((form, bytes)));
    }

    /// The device address of `form` of these bytes, if recorded (as that form: tiles of another
    /// row length are not these).
    pub(crate) fn derived(&self, form: Derived) -> Option<u64> {
        self.derived[form.slot()].get().filter(|d| d.0 == form).map(|d| d.1.ptr())
    }

    /// Marks the bytes as a norm's u with its scale pending in the integer parts just recorded
    /// (`set_derived`), which the integer GEMVs read; see `settle`.
    pub(crate) fn set_pending_norm(&self) {
        self.pending_norm.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether the bytes are a norm's u whose scale is still pending (see `settle`).
    pub(crate) fn is_pending_norm(&self) -> bool {
        self.pending_norm.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Forgets the host copy and the derived forms (the device bytes are about to change).
    pub(crate) fn invalidate(&mut self) {
        self.mirror = OnceLock::new();
        self.derived = [OnceLock::new(), OnceLock::new()];
        *self.pending_norm.get_mut() = false;
        if self.epoch == 0 && self.st.capturing() != 0 {
            self.graph_written = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVRTC through the kernel cache, end to end, without a GPU: every source compiled into an
    /// empty cache, read back from it, and compiled again with no cache, the same PTX each time.
    /// Needs libnvrtc (CUDA 13) where cudarc finds it, e.g. the wheel `scripts/check-cuda-kernels.sh`
    /// installs: `LD_LIBRARY_PATH=$HOME/.cache/nuvec/nvrtc-13.0.88/lib/python3.11/site-packages/nvidia/cu13/lib
    /// cargo test -p nuvec --features cuda --lib -- --ignored kernels_come_back_from_the_cache`.
    #[test]
    #[ignore = "needs libnvrtc"]
    fn kernels_come_back_from_the_cache() {
        // SAFETY: only tries to dlopen the library by its usual names.
        assert!(unsafe { cudarc::nvrtc::sys::is_culib_present() }, "libnvrtc not found");
        let dir = std::env::temp_dir().join(format!("nuvec-kernels-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let fresh = compiled_sources("compute_90", Some(dir.clone())).unwrap();
        let entries = std::fs::read_dir(&dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "ptx"))
            .count();
        assert_eq!(entries, SOURCES.len());
        let cached = compiled_sources("compute_90", Some(dir.clone())).unwrap();
        let uncached = compiled_sources("compute_90", None).unwrap();
        for ((a, b), c) in fresh.iter().zip(&cached).zip(&uncached) {
            assert_eq!((a.0, &a.1), (b.0, &b.1));
            assert!(a.2 == b.2 && a.2 == c.2, "{}: the cached PTX differs", a.0);
            assert!(a.2.contains(".entry"), "{}: not PTX", a.0);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_kernel_is_found_by_name() {
        let names: Vec<String> = kernel_sources()
            .iter()
            .flat_map(|(_, src)| kernel_names(src).into_iter().map(String::from).collect::<Vec<_>>())
            .collect();
        for want in [
            "add_f32",
            "silu_mul_f32",
            "add_bias_f32",
            "mul_columns_f32",
            "add_linear_f32",
            "rms_norm_f32",
            "rope_f32",
            "write_axis1",
            "cast_float",
            "write_axis1_rows",
            "transpose01_f32",
            "transpose01_u16",
            "argmax_part_f32",
            "argmax_final_f32",
            "gemv",
            "gather_rows",
            "attention_f32",
            "gelu_mul_f32",
            "scale_f32",
            "softcap_f32",
            // phase 3; some carry __launch_bounds__ between `void` and the name
            "attention_split_f32",
            "paged_attention_split_f32",
            "paged_flash_decode_bf16_d64",
            "paged_flash_decode_bf16_d128",
            "paged_flash_decode_f16_d64",
            "paged_flash_decode_f16_d128",
            "paged_prefix_flash_f16_d64",
            "paged_prefix_flash_f16_d128",
            "rope_qk_paged_f32",
            "attention_merge_f32",
            "causal_softmax_f32",
            "qdequant_b3",
            "qgemv_b5",
            "qgemv1_b4",
            "qgemv_multi_b8",
            "qgemv1_b4_w2",
            "qgemv1_b4_w1",
            "qgemv_multi_b4_w2",
            "qgemv_multi_b4_w1",
            "qgemv1_b4_w4",
            "qgemv1_b4_w8",
            "qgemv_multi_b4_w4",
            "qgemv_multi_b4_w8",
            "qgemv1_b4_xw1",
            "qgemv_multi_b4_xw1",
            // gated MLP fusion
            "gate_up_silu_b4_w2",
            "gate_up_silu_b4_w1",
            "gate_up_silu_b4_w4",
            "gate_up_silu_b4_w8",
            "gate_up_silu_b4_xw1",
            // Qwen3.5 hybrids and gpt-oss
            "conv1d_silu_f32",
            "sigmoid_mul_f32",
            "gated_delta_f32",
            "swiglu_oai_f32",
            // mixture-of-experts routing
            "moe_route",
            "moe_route_dense",
            // decode fusions
            "add_rms_norm_f32",
            "rope_qk_f32",
            "write_kv_rows",
            // phase 4
            "gather3_bf16",
            "convert_bf16",
            "silu_mul_bf16",
            "qdequant_bf16_b4",
            "qdequant_bf16_b6",
            "qdequant_bf16_any",
            "causal_softmax_bf16",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
        }
        // Each a kernel's own name (lower case, as every kernel is named): a kernel defined
        // through a macro would be found as the macro's parameter, which no module holds.
        for n in &names {
            let lower = n.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            assert!(lower && n.starts_with(|c: char| c.is_ascii_lowercase()), "kernel name {n:?}");
        }
        // The bf16 register kernels and their forms for f16 and f32 scales (ops/qimma.rs).
        for want in ["qdec_b4_r8", "qdec_b4_r8s", "qdec_b4_r64_t2", "qdec_b4_r64s_t2"] {
            assert!(names.iter().any(|n| n == want), "{want} missing");
        }
    }
}
