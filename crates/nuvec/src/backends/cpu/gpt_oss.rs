//! gpt-oss's elementwise ops: the clamped SwiGLU of its experts and a scalar multiply. Plain
//! loops (no SIMD path): they run on `[tokens, expert width]` rows, small next to the matmuls.

use super::{f32s, output};
use crate::{Array, Error, Result};

/// mlx-lm's `swiglu_oai` on one pair: the gate clipped from above only, the linear part clipped
/// both ways and shifted by one.
pub(crate) fn swiglu_oai_one(gate: f32, up: f32, alpha: f32, limit: f32) -> f32 {
    let g = gate.min(limit);
    let u = up.clamp(-limit, limit);
    let sigmoid = 1.0 / (1.0 + (-(alpha * g)).exp());
    (u + 1.0) * (g * sigmoid)
}

pub(crate) fn swiglu_oai(gate: &Array, up: &Array, alpha: f32, limit: f32) -> Result<Array> {
    if gate.shape() != up.shape() {
        return Err(Error::shape("swiglu_oai", format!("gate {:?} and up {:?} differ", gate.shape(), up.shape())));
    }
    if limit.is_nan() || limit < 0.0 {
        return Err(Error::shape("swiglu_oai", format!("limit = {limit} must be a non-negative number")));
    }
    let (g, u) = (f32s("swiglu_oai", gate)?, f32s("swiglu_oai", up)?);
    let out = g.iter().zip(u).map(|(&g, &u)| swiglu_oai_one(g, u, alpha, limit)).collect();
    output(out, gate.shape())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// mlx-lm's formula written out in f64.
    fn reference(gate: f64, up: f64, alpha: f64, limit: f64) -> f64 {
        let g = gate.min(limit);
        let u = up.max(-limit).min(limit);
        (u + 1.0) * g / (1.0 + (-alpha * g).exp())
    }

    #[test]
    fn swiglu_oai_clamps_as_mlx_lm() {
        let values = [-20.0f32, -7.5, -7.0, -3.0, -0.5, 0.0, 0.25, 1.0, 6.9, 7.0, 7.1, 30.0];
        let mut gates = vec![];
        let mut ups = vec![];
        for &g in &values {
            for &u in &values {
                gates.push(g);
                ups.push(u);
            }
        }
        let n = gates.len();
        let (ga, ua) =
            (Array::from_slice(&gates, &[n / 12, 12]).unwrap(), Array::from_slice(&ups, &[n / 12, 12]).unwrap());
        let out = swiglu_oai(&ga, &ua, 1.702, 7.0).unwrap().to_vec::<f32>().unwrap();
        for ((&g, &u), &o) in gates.iter().zip(&ups).zip(&out) {
            let want = reference(g as f64, u as f64, 1.702, 7.0);
            assert!((o as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()), "gate {g}, up {u}: {o} vs {want}");
        }
        assert!(swiglu_oai(&ga, &Array::from_slice(&[0f32; 12], &[1, 12]).unwrap(), 1.702, 7.0).is_err());
    }

    #[test]
    fn scale_multiplies() {
        let x = Array::from_slice(&[1.0f32, -2.0, 0.5], &[3]).unwrap();
        assert_eq!(super::super::gemma4::scale(&x, 1.5).unwrap().to_vec::<f32>().unwrap(), vec![1.5, -3.0, 0.75]);
    }
}
