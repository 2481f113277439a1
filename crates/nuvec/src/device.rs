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

impl Device {
    /// Bytes this device can still hand out for new arrays: on the CPU the kernel's
    /// `MemAvailable` (Linux; an error elsewhere, where the caller should size memory itself),
    /// on a GPU the driver's free memory plus the freed buffers kept for reuse.
    pub fn available_memory(self) -> crate::Result<usize> {
        match self {
            Device::Cpu => {
                let text = std::fs::read_to_string("/proc/meminfo")
                    .map_err(|e| crate::Error::Io { path: "/proc/meminfo".into(), source: e })?;
                text.lines()
                    .find_map(|l| l.strip_prefix("MemAvailable:"))
                    .and_then(|v| v.trim().strip_suffix("kB"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .map(|kb| kb * 1024)
                    .ok_or_else(|| crate::Error::Unsupported("/proc/meminfo has no MemAvailable line".into()))
            }
            #[cfg(feature = "cuda")]
            Device::Cuda(i) => crate::backends::cuda::available_bytes(i),
        }
    }
}
