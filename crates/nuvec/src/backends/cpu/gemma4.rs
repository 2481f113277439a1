//! Elementwise ops Gemma 4 needs: the tanh-approximated GELU gate, scaling by a scalar, and
//! logit soft-capping. Each is written as mlx writes it, so results agree to rounding.

use super::{f32s, output};
use crate::{Array, Error, Result};

/// `sqrt(2 / pi)`, as mlx's `gelu_approx` computes it (in double, then used as f32).
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// mlx's `gelu_approx`: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub(crate) fn gelu_approx(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * (x * x * x))).tanh())
}

pub(crate) fn gelu_mul(gate: &Array, up: &Array) -> Result<Array> {
    if gate.shape() != up.shape() {
        return Err(Error::shape("gelu_mul", format!("{:?} and {:?} differ", gate.shape(), up.shape())));
    }
    let (g, u) = (f32s("gelu_mul", gate)?, f32s("gelu_mul", up)?);
    output(g.iter().zip(u).map(|(&g, &u)| gelu_approx(g) * u).collect(), gate.shape())
}

pub(crate) fn scale(x: &Array, s: f32) -> Result<Array> {
    output(f32s("scale", x)?.iter().map(|&v| v * s).collect(), x.shape())
}

pub(crate) fn softcap(x: &Array, cap: f32) -> Result<Array> {
    if !(cap > 0.0 && cap.is_finite()) {
        return Err(Error::shape("softcap", format!("cap must be a positive number, got {cap}")));
    }
    output(f32s("softcap", x)?.iter().map(|&v| (v / cap).tanh() * cap).collect(), x.shape())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_approx_matches_the_formula_in_double() {
        for i in -60..=60 {
            let x = i as f64 / 10.0;
            let want = 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh());
            assert!((gelu_approx(x as f32) as f64 - want).abs() < 1e-5, "x = {x}");
        }
    }

    #[test]
    fn softcap_bounds_and_rejects_a_bad_cap() {
        let x = Array::from_slice(&[-1000.0f32, 0.0, 3.0], &[3]).unwrap();
        let y = softcap(&x, 30.0).unwrap().to_vec::<f32>().unwrap();
        assert!((y[0] + 30.0).abs() < 1e-4 && y[1] == 0.0 && (y[2] - 30.0 * (0.1f32).tanh()).abs() < 1e-6);
        assert!(softcap(&x, 0.0).is_err());
        let g = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
        assert!(gelu_mul(&g, &x).is_err());
    }
}
