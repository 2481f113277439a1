//! gpt-oss on a CUDA device: its experts' clamped SwiGLU (kernels/gpt_oss.cu) and the device
//! copies of its attention sinks, which the attention kernels of attention.cu take as an
//! optional pointer (see `CudaBackend::attention_with`).

use std::sync::{Mutex, OnceLock};

use cudarc::driver::PushKernelArg;

use super::{cfg_1d, CudaBackend};
use crate::backends::cuda::{DeviceBuffer, State};
use crate::{Array, DType, Error, Result};

/// Distinct sink tables kept per process (gpt-oss has one per layer: 24 or 36).
const MAX_SINK_TABLES: usize = 256;

impl CudaBackend {
    /// [`crate::Backend::swiglu_oai`].
    pub(super) fn swiglu_oai_clamped(&self, gate: &Array, up: &Array, alpha: f32, limit: f32) -> Result<Array> {
        let op = "swiglu_oai";
        if gate.shape() != up.shape() {
            return Err(Error::shape(op, format!("gate {:?} and up {:?} differ", gate.shape(), up.shape())));
        }
        if limit.is_nan() || limit < 0.0 {
            return Err(Error::shape(op, format!("limit = {limit} must be a non-negative number")));
        }
        let (gp, up_p) = (self.f32_ptr(op, "gate", gate)?, self.f32_ptr(op, "up", up)?);
        let out = self.output(gate.shape(), DType::F32, false)?;
        let n = gate.len() as u64;
        if n > 0 {
            let o = out.cuda_ptr()?;
            let st: &State = self.st()?;
            launch!(st, op, "swiglu_oai_f32", cfg_1d(n as usize); o, gp, up_p, alpha, limit, n);
        }
        Ok(out)
    }

    /// The device address of a copy of `sinks`, uploaded once per distinct table and kept, so
    /// that a decode step copies nothing from the host for them. Found by value in a short list
    /// (no key is built per call: this runs in every attention layer of every step).
    pub(super) fn sinks_table(&self, sinks: &[f32]) -> Result<u64> {
        type Tables = Mutex<Vec<(usize, Vec<f32>, DeviceBuffer)>>;
        static TABLES: OnceLock<Tables> = OnceLock::new();
        let same = |t: &[f32]| t.len() == sinks.len() && t.iter().zip(sinks).all(|(a, b)| a.to_bits() == b.to_bits());
        let mut tables = TABLES.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, _, b)) = tables.iter().find(|(o, t, _)| *o == self.ordinal && same(t)) {
            return Ok(b.ptr());
        }
        if tables.len() >= MAX_SINK_TABLES {
            // Frees are ordered after the kernels already enqueued on the device's stream.
            tables.clear();
        }
        let b = self.upload(sinks)?;
        let p = b.ptr();
        tables.push((self.ordinal, sinks.to_vec(), b));
        Ok(p)
    }
}
