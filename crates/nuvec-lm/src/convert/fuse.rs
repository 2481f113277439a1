//! An adapter's terms added into the weights they adapt (`nuvec fuse`, mlx_lm.fuse): `W + s·BᵀAᵀ`
//! rounded to the weight's type as mlx-lm rounds it, DoRA's rows then rescaled to their learned
//! magnitudes; a quantized weight is dequantized, fused and quantized again with its own
//! settings (or left dense when the whole checkpoint is dequantized).

use std::collections::BTreeMap;
use std::path::Path;

use nuvec::fpquant::quantize_fp;
use nuvec::quantize::{dequantize, quantize_affine};
use nuvec::{Array, DType, QuantMode};

use super::{cast, Checkpoint, Module};
use crate::adapter::Adapter;
use crate::{Error, Result};

/// Fuses adapter folder `adapter_dir` into `ck`; `quantized` (the checkpoint's quantized modules)
/// follows what changed. With `dequantize`, fused modules are written dense.
pub(super) fn fuse(
    ck: &mut Checkpoint,
    quantized: &mut BTreeMap<String, Module>,
    adapter_dir: &Path,
    dequantize_all: bool,
) -> Result<()> {
    let adapter = Adapter::open(adapter_dir)?;
    for module in adapter.modules() {
        let weight_name = format!("{module}.weight");
        let (w, rows, cols, dtype, spec) = match (quantized.get(&module), ck.tensors.get(&weight_name)) {
            (Some(m), _) if m.rows.len() == 1 => {
                // As mx.dequantize: affine weights come back in their scales' type, the
                // floating-point modes in bfloat16.
                let dtype = if m.q.spec.mode == QuantMode::Affine { m.q.scales.dtype() } else { DType::BF16 };
                (dequantize(&m.q)?, m.q.rows(), m.q.cols(), dtype, Some(m.q.spec))
            }
            (None, Some(t)) if t.shape().len() == 2 && t.dtype().is_float() => {
                (t.to_f32_vec()?, t.dim(0), t.dim(1), t.dtype(), None)
            }
            _ => {
                return Err(Error::Unsupported(format!(
                    "{}: the adapter on {module} has no matrix to fuse into (an embedding, MoE experts or a \
                     module this checkpoint does not have)",
                    adapter_dir.display()
                )))
            }
        };
        let (delta, magnitudes) = adapter.terms(&module, rows, cols)?;
        let round = |v: &[f32], dtype: DType| -> Result<Vec<f32>> {
            Ok(cast(&Array::from_slice(v, &[rows, cols])?, dtype)?.to_f32_vec()?)
        };
        let delta = round(&delta, dtype)?;
        let sum: Vec<f32> = w.iter().zip(&delta).map(|(a, b)| a + b).collect();
        let mut fused = round(&sum, dtype)?;
        let mut dtype = dtype;
        if let Some(m) = magnitudes {
            // m (f32) over the fused rows' norms, times those rows: an f32 result, as in mlx.
            for (row, m) in fused.chunks_mut(cols).zip(m) {
                let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
                row.iter_mut().for_each(|v| *v *= m / norm);
            }
            dtype = DType::F32;
        }
        for leaf in ["weight", "scales", "biases"] {
            ck.tensors.remove(&format!("{module}.{leaf}"));
        }
        match spec {
            Some(spec) if !dequantize_all => {
                let q = match spec.mode {
                    QuantMode::Affine => quantize_affine(&fused, rows, cols, spec, dtype)?,
                    _ => quantize_fp(&fused, rows, cols, spec)?,
                };
                ck.tensors.insert(weight_name, q.packed.clone());
                ck.tensors.insert(format!("{module}.scales"), q.scales.clone());
                if spec.mode.has_biases() {
                    ck.tensors.insert(format!("{module}.biases"), q.biases.clone());
                }
                quantized.insert(module, Module { q, rows: vec![rows] });
            }
            _ => {
                ck.tensors.insert(weight_name, cast(&Array::from_slice(&fused, &[rows, cols])?, dtype)?);
                quantized.remove(&module);
            }
        }
    }
    adapter.check_all_taken()
}
