//! Llama 3's rope scaling read back from a GGUF's `rope_freqs` tensor.
//!
//! llama.cpp's converter does not keep a Llama 3.1 checkpoint's `rope_scaling`: it writes one
//! factor per rotated pair instead (1 for short wavelengths, `factor` for long ones, a blend
//! between), by which llama.cpp divides each frequency. mlx-lm's Llama3RoPE computes the same
//! factors from four numbers, so the file's factors are turned back into those numbers, and the
//! model (and `nuvec convert`'s config.json) uses mlx-lm's `llama3` schedule. Only the ratios of
//! the original context to `low_freq_factor` and `high_freq_factor` change a period, so the
//! original context is set to Llama 3's 8,192 and the two factors follow from the blended pairs
//! (a line through them). Every factor is then recomputed from the result and compared with the
//! file's: factors that follow no Llama 3 schedule are refused, naming the pair.

use serde_json::{json, Value};

use crate::config::Config;
use crate::layers::Rope;
use crate::{Error, Result};

/// The tensor's name in a GGUF file.
pub(crate) const ROPE_FREQS: &str = "rope_freqs.weight";

/// Llama 3's original context (`original_max_position_embeddings`), which the recovered factors
/// are expressed against.
const ORIGINAL_CONTEXT: f64 = 8192.0;

/// How far a recomputed period may be from the file's (relative): the factors are f32.
const TOLERANCE: f64 = 1e-5;

/// The `rope_scaling` of a config.json whose rope over `dims` features with base `theta` turns
/// each pair by the file's `factors` (`None`: every factor is 1, no scaling). `file`: the
/// GGUF's name, for errors.
pub(crate) fn llama3_scaling(file: &str, factors: &[f32], theta: f64, dims: usize) -> Result<Option<Value>> {
    let fail = |what: String| {
        Error::Unsupported(format!("{file}: {ROPE_FREQS} {what}; its rope schedule is not mapped (Llama 3's is)"))
    };
    if factors.len() != dims / 2 {
        return Err(fail(format!("has {} factors for {} rotated pairs", factors.len(), dims / 2)));
    }
    if let Some(i) = factors.iter().position(|f| !(f.is_finite() && *f > 0.0)) {
        return Err(fail(format!("factor {i} is {}", factors[i])));
    }
    if factors.iter().all(|&f| f == 1.0) {
        return Ok(None);
    }
    let factor = f64::from(factors[factors.len() - 1]);
    if factor <= 1.0 {
        return Err(fail(format!("ends with factor {factor}, where Llama 3's scales long wavelengths up")));
    }
    let periods: Vec<f64> = (0..dims / 2).map(|i| theta.powf(2.0 * i as f64 / dims as f64)).collect();
    // The blended pairs: 1 / f = (1 - s) / factor + s, and s is linear in original / wavelength,
    // s (high - low) + low = original / wavelength.
    let same = |a: f64, b: f64| (a - b).abs() <= TOLERANCE * b;
    let blended: Vec<(f64, f64)> = factors
        .iter()
        .zip(&periods)
        .map(|(&f, &p)| (f64::from(f), p))
        .filter(|&(f, _)| !same(f, 1.0) && !same(f, factor))
        .map(|(f, p)| {
            ((1.0 / f - 1.0 / factor) / (1.0 - 1.0 / factor), ORIGINAL_CONTEXT / (2.0 * std::f64::consts::PI * p))
        })
        .collect();
    if blended.len() < 2 {
        return Err(fail(format!(
            "blends {} pairs, too few to recover Llama 3's low and high frequency factors",
            blended.len()
        )));
    }
    let n = blended.len() as f64;
    let (ms, mx) = (blended.iter().map(|b| b.0).sum::<f64>() / n, blended.iter().map(|b| b.1).sum::<f64>() / n);
    let slope = blended.iter().map(|(s, x)| (s - ms) * (x - mx)).sum::<f64>()
        / blended.iter().map(|(s, _)| (s - ms) * (s - ms)).sum::<f64>();
    let low = mx - slope * ms;
    let scaling = json!({
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": low + slope,
        "original_max_position_embeddings": ORIGINAL_CONTEXT,
    });
    // The schedule mlx-lm (and the model) computes from these, against the file's.
    let config = Config::from_json(file, &json!({"rope_theta": theta, "rope_scaling": scaling}).to_string())?;
    let rope = Rope::from_config(&config, dims, None)?;
    for (i, ((&inv, &p), &f)) in rope.inv_freqs().iter().zip(&periods).zip(factors).enumerate() {
        let (got, want) = (1.0 / f64::from(inv), p * f64::from(f));
        if (got - want).abs() > 10.0 * TOLERANCE * want {
            return Err(fail(format!(
                "factor {i} is {f}, where the Llama 3 schedule through the others gives {}",
                got / p
            )));
        }
    }
    Ok(Some(scaling))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's converter's factors for Llama 3's rope_scaling (its loop, in f64 here).
    fn converter_factors(theta: f64, dims: usize, factor: f64, low: f64, high: f64, old: f64) -> Vec<f32> {
        (0..dims / 2)
            .map(|i| {
                let wavelen = 2.0 * std::f64::consts::PI * theta.powf(2.0 * i as f64 / dims as f64);
                if wavelen < old / high {
                    1.0
                } else if wavelen > old / low {
                    factor as f32
                } else {
                    let smooth = (old / wavelen - low) / (high - low);
                    (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
                }
            })
            .collect()
    }

    #[test]
    fn llama_3_1_s_factors_give_its_schedule_back() {
        // Llama 3.1 8B: theta 500000, head 128, factor 8, low 1, high 4, original 8192.
        let f = converter_factors(500000.0, 128, 8.0, 1.0, 4.0, 8192.0);
        let s = llama3_scaling("x.gguf", &f, 500000.0, 128).unwrap().unwrap();
        assert_eq!(s["rope_type"], "llama3");
        assert!((s["factor"].as_f64().unwrap() - 8.0).abs() < 1e-9);
        assert!((s["low_freq_factor"].as_f64().unwrap() - 1.0).abs() < 1e-3, "{s}");
        assert!((s["high_freq_factor"].as_f64().unwrap() - 4.0).abs() < 1e-3, "{s}");
        // Another original context: the same periods, with the factors rescaled to 8192.
        let f = converter_factors(10000.0, 64, 8.0, 1.0, 4.0, 32.0);
        let s = llama3_scaling("x.gguf", &f, 10000.0, 64).unwrap().unwrap();
        assert!((s["low_freq_factor"].as_f64().unwrap() - 256.0).abs() < 0.5, "{s}");
        assert!((s["high_freq_factor"].as_f64().unwrap() - 1024.0).abs() < 0.5, "{s}");
    }

    #[test]
    fn factors_off_the_schedule_are_refused_naming_the_pair() {
        let mut f = converter_factors(500000.0, 128, 8.0, 1.0, 4.0, 8192.0);
        assert_eq!(llama3_scaling("x.gguf", &[1.0; 64], 500000.0, 128).unwrap(), None);
        f[60] = 4.0;
        let e = llama3_scaling("x.gguf", &f, 500000.0, 128).unwrap_err().to_string();
        assert!(e.contains("x.gguf") && e.contains("rope_freqs.weight") && e.contains("factor "), "{e}");
        let e = llama3_scaling("x.gguf", &f[..10], 500000.0, 128).unwrap_err().to_string();
        assert!(e.contains("10 factors for 64"), "{e}");
        let e = llama3_scaling("x.gguf", &[1.0, f32::NAN], 10000.0, 4).unwrap_err().to_string();
        assert!(e.contains("factor 1 is NaN"), "{e}");
    }
}
