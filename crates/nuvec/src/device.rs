//! Where arrays live and ops run.

use std::fmt;

/// A compute device. Only the CPU is built; a GPU backend is another variant behind the same
/// [`crate::Backend`] trait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// The host, with SIMD kernels and a thread pool.
    #[default]
    Cpu,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
        }
    }
}
