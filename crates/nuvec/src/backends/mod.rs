//! Device backends. Each folder implements [`crate::Backend`] for one device.

pub mod cpu;
