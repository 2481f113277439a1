//! How the CUDA ops launch kernels: the argument types a kernel takes, the `launch!` macro that
//! passes their addresses, and the CUDA-graph hooks (`record!`, `guard!`, `kargs!`) the decode
//! step's launches register while a capture runs.

use cudarc::driver::LaunchConfig;

use crate::{Error, Result};

/// A grid-stride launch over `n` elements.
pub(super) fn cfg_1d(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 1 << 20) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

pub(super) fn to_i32(op: &'static str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Unsupported(format!("{op}: {what} = {v} is over the CUDA kernels' 2^31 limit")))
}

/// The types a kernel argument may have: the kernels' parameter types as the host holds them
/// (u64 for pointers and size_t, i32 for int, u32 for unsigned, i64 for long long, f32 for
/// float). `launch!` passes each argument's address, so any other type would not compile rather
/// than reach a kernel as the wrong bytes.
pub(super) trait KernelArg: Copy {}
impl KernelArg for u64 {}
impl KernelArg for i32 {}
impl KernelArg for u32 {}
impl KernelArg for i64 {}
impl KernelArg for f32 {}

/// The address of a kernel argument, as `cuLaunchKernel` takes it.
pub(super) fn arg_ptr<T: KernelArg>(v: &T) -> *mut std::ffi::c_void {
    (v as *const T).cast_mut().cast()
}

/// Launches kernel `$name` with `$cfg` and the given arguments (locals of the kernel's exact
/// parameter types: see [`KernelArg`]).
macro_rules! launch {
    // On a given stream of the device (the decode lane's; the device stream below).
    (@on $stream:expr, $st:expr, $op:expr, $name:expr, $cfg:expr; $($arg:ident),* $(,)?) => {{
        let st: &State = $st;
        let f = st.func($name)?;
        let mut params = [$($crate::backends::cuda::ops::launch::arg_ptr(&$arg)),*];
        // SAFETY: one address per kernel parameter, of locals of its exact type that outlive the
        // call; every pointer argument is the address of a live device allocation of this device
        // (held by an Array or DeviceBuffer that outlives the enqueue; frees are ordered after
        // the kernel on the device stream, which the decode lane's work joins before anything
        // later), sized for the extents passed alongside it, which the caller checked.
        unsafe { st.launch_raw_on($stream, f, $cfg, &mut params) }
            .map_err(|e| Error::Device(format!("{}: launching {} on cuda:{}: {e:?}", $op, $name, st.ordinal)))?;
    }};
    ($st:expr, $op:expr, $name:expr, $cfg:expr; $($arg:ident),* $(,)?) => {{
        let st: &State = $st;
        launch!(@on &st.stream, st, $op, $name, $cfg; $($arg),*)
    }};
}

/// CUDA graphs: while a capture runs, records the kernel `$name` just launched as depending on
/// the step's position; `$pos` (a `StepPos`) is in scope of the body, which gives `Some((cfg,
/// [args...]))` for that step (the same argument list as the launch, in order) or `None`.
macro_rules! record {
    ($st:expr, $op:expr, $name:expr, |$pos:ident| $body:expr) => {{
        let st: &State = $st;
        if st.capturing() != 0 {
            st.record($op, $name, Box::new(move |$pos: StepPos| -> Option<(LaunchConfig, Vec<KArg>)> { $body }))?;
        }
    }};
}

/// CUDA graphs: while a capture runs, registers the check of a launch that reads the step
/// scalars (`State::step_scalars`); `$pos` (a `StepPos`) is in scope of the body, which says
/// whether the graph computes that step as the eager path would.
macro_rules! guard {
    ($st:expr, |$pos:ident| $body:expr) => {{
        let st: &State = $st;
        if st.capturing() != 0 {
            st.guard(Box::new(move |$pos: StepPos| -> bool { $body }));
        }
    }};
}

/// The argument list of a recorded launch.
macro_rules! kargs {
    ($($arg:expr),* $(,)?) => { vec![$(KArg::from($arg)),*] };
}
