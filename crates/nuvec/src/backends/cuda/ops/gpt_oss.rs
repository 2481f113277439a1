//! gpt-oss on a CUDA device: its experts' clamped SwiGLU (kernels/gpt_oss.cu) and the device
//! copies of its attention sinks, which the attention kernels of attention.cu take as an
//! optional pointer (see `CudaBackend::attention_over`).

use super::{cfg_1d, ConstantTables, CudaBackend};
use crate::backends::cuda::State;
use crate::{Array, DType, Error, Result};

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
    /// that a decode step copies nothing from the host for them.
    pub(super) fn sinks_table(&self, sinks: &[f32]) -> Result<u64> {
        static TABLES: ConstantTables = ConstantTables::new();
        TABLES.get(self, sinks)
    }
}
