//! Where arrays live and ops run.

use std::fmt;

/// A compute device. The CPU is always built; `Cuda(ordinal)` exists with the `cuda` cargo
/// feature (an NVIDIA GPU by its CUDA ordinal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// The host, with SIMD kernels and a thread pool.
    #[default]
    Cpu,
    /// An NVIDIA GPU, by its CUDA ordinal (cargo feature `cuda`).
    #[cfg(feature = "cuda")]
    Cuda(usize),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            #[cfg(feature = "cuda")]
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}
