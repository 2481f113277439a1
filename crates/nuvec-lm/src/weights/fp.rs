//! Loading matrices in MLX's floating-point quantization modes (mxfp4, mxfp8, nvfp4): packed
//! codes in `{path}.weight`, `u8` scales in `{path}.scales`, no biases. As mlx-lm does, the mode
//! of a module config.json does not list is told by its shapes: 4 bits in groups of 16 is nvfp4,
//! 4 bits in groups of 32 mxfp4, 8 bits in groups of 32 mxfp8. A listed module must agree with
//! its tensors. A global scale (`{path}.global_scale`, f32) is read only on stacked
//! mixture-of-experts projections, the one place mlx-lm 0.32.2 writes and reads it.

use nuvec::{Array, DType, Matrix, QuantMode, QuantSpec, Quantized};

use super::Weights;
use crate::Result;

/// The floating-point mode whose fixed shape is `bits` in groups of `group`.
fn mode_of(bits: usize, group: usize) -> Option<QuantMode> {
    [QuantMode::Mxfp4, QuantMode::Mxfp8, QuantMode::Nvfp4].into_iter().find(|m| m.fixed_shape() == Some((bits, group)))
}

impl Weights {
    /// The spec `packed` / `scales` hold for a `[rows, cols]` matrix named `weight`, checked
    /// against config.json's entry `listed` (if any).
    fn fp_spec(
        &self,
        weight: &str,
        (packed, scales): (&Array, &Array),
        listed: Option<QuantSpec>,
        (rows, cols): (usize, usize),
    ) -> Result<QuantSpec> {
        if packed.shape().len() != 2 || scales.shape().len() != 2 || packed.dim(0) != rows || scales.dim(0) != rows {
            return Err(self.err(
                weight,
                format!(
                    "quantized shapes {:?} / scales {:?} do not fit a {rows}x{cols} matrix",
                    packed.shape(),
                    scales.shape()
                ),
            ));
        }
        let (words, groups) = (packed.dim(1), scales.dim(1));
        if packed.dtype() != DType::U32 || (words * 32) % cols != 0 || groups == 0 || !cols.is_multiple_of(groups) {
            return Err(self.err(
                weight,
                format!("{} {words} words and {groups} groups per row cannot hold {cols} columns", packed.dtype()),
            ));
        }
        let (bits, group) = (words * 32 / cols, cols / groups);
        let mode = mode_of(bits, group).ok_or_else(|| {
            self.err(
                weight,
                format!(
                    "has uint8 scales (a floating-point mode) but {bits} bits in groups of {group}, which is none of \
                     mxfp4 (4 bits, 32), mxfp8 (8, 32), nvfp4 (4, 16)"
                ),
            )
        })?;
        let spec = QuantSpec { mode, bits, group_size: group };
        if let Some(want) = listed {
            if want != spec {
                return Err(self.err(
                    weight,
                    format!(
                        "config.json says mode {}, {} bits, group {}; the tensors hold {}, {bits} bits, group {group}",
                        want.mode.name(),
                        want.bits,
                        want.group_size,
                        mode.name()
                    ),
                ));
            }
        }
        Ok(spec)
    }

    /// Module `path`'s floating-point-mode matrix (its scales are `u8`).
    pub(super) fn fp_matrix(
        &self,
        path: &str,
        (packed, scales): (Array, Array),
        listed: Option<QuantSpec>,
        (rows, cols): (usize, usize),
    ) -> Result<Matrix> {
        let weight = format!("{path}.weight");
        let spec = self.fp_spec(&weight, (&packed, &scales), listed, (rows, cols))?;
        for (suffix, why) in [
            ("biases", "floating-point modes have no biases"),
            ("global_scale", "mlx-lm reads a global scale only on mixture-of-experts projections"),
        ] {
            let name = format!("{path}.{suffix}");
            if self.has(&name) {
                return Err(self.err(&name, format!("is not expected next to {} weights: {why}", spec.mode.name())));
            }
        }
        Quantized::new_fp(packed, scales, None, spec, cols)
            .map(Matrix::Quantized)
            .map_err(|e| self.err(&weight, e.to_string()))
    }

    /// Expert `e` of the stacked floating-point-mode projection `stacked` (`w` and `scales` are
    /// its slices), with its entry of `{stacked}.global_scale` when the checkpoint has one.
    pub(super) fn fp_expert(
        &self,
        stacked: &str,
        e: usize,
        (w, scales): (Array, Array),
        (rows, cols): (usize, usize),
    ) -> Result<Matrix> {
        let weight = format!("{stacked}.weight");
        let listed = self.quantization.overrides.get(stacked).copied().flatten();
        let spec = self.fp_spec(&weight, (&w, &scales), listed, (rows, cols))?;
        let name = format!("{stacked}.global_scale");
        let global = if self.has(&name) {
            let g = self.raw(&name)?;
            if spec.mode != QuantMode::Nvfp4 || g.dtype() != DType::F32 || g.len() <= e || g.shape().len() != 1 {
                return Err(self.err(
                    &name,
                    format!(
                        "must be float32 [experts] next to nvfp4 weights, got {} {:?} next to {}",
                        g.dtype(),
                        g.shape(),
                        spec.mode.name()
                    ),
                ));
            }
            Some(g.to_f32_vec()?[e])
        } else {
            None
        };
        if self.has(&format!("{stacked}.biases")) {
            return Err(self.err(&format!("{stacked}.biases"), "floating-point modes have no biases"));
        }
        Quantized::new_fp(w, scales, global, spec, cols)
            .map(Matrix::Quantized)
            .map_err(|err| self.err(&weight, format!("expert {e}: {err}")))
    }
}
