//! Rotary position embeddings, with the frequency schedules of mlx-lm's `initialize_rope`.

use nuvec::Array;
use serde_json::Value;

use super::RmsNorm;

use crate::config::Config;
use crate::{Error, Result};

/// A rotary embedding: one inverse frequency per rotated pair.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freqs: Vec<f32>,
    traditional: bool,
    /// Multiplies the input before rotating it (yarn's magnitude correction; 1 otherwise).
    mscale: f32,
}

impl Rope {
    /// The rotary embedding config.json describes for heads of `dims` features
    /// (`rope_theta`, `rope_traditional`, `rope_scaling` / `rope_parameters`).
    pub fn from_config(config: &Config, dims: usize, default_theta: Option<f64>) -> Result<Self> {
        let scaling = config.get("rope_scaling").or_else(|| config.get("rope_parameters"));
        let theta = match config.opt_f64("rope_theta")? {
            Some(t) => t,
            None => scaling
                .and_then(|s| s.get("rope_theta"))
                .and_then(Value::as_f64)
                .or(default_theta)
                .ok_or_else(|| config.error("rope_theta", "is missing"))?,
        };
        let traditional = config.bool_or("rope_traditional", false)?;
        let mut mscale = 1.0;
        // Periods (`base ** (2i / dims)`), as mlx-lm computes them; the kernel takes their inverse.
        let mut periods: Vec<f64> = (0..dims / 2).map(|i| theta.powf(2.0 * i as f64 / dims as f64)).collect();
        let kind = scaling
            .and_then(|s| s.get("type").or_else(|| s.get("rope_type")))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let field = |name: &str, default: Option<f64>| -> Result<f64> {
            scaling
                .and_then(|s| s.get(name))
                .and_then(Value::as_f64)
                .or(default)
                .ok_or_else(|| config.error(&format!("rope_scaling.{name}"), "is missing"))
        };
        match kind {
            "default" => {}
            "linear" => {
                let factor = field("factor", None)?;
                periods.iter_mut().for_each(|p| *p *= factor);
            }
            "llama3" => {
                let factor = field("factor", None)?;
                let low = field("low_freq_factor", Some(1.0))?;
                let high = field("high_freq_factor", Some(4.0))?;
                let old_context = field("original_max_position_embeddings", Some(8192.0))?;
                let (low_wavelen, high_wavelen) = (old_context / low, old_context / high);
                for p in periods.iter_mut() {
                    let wavelen = 2.0 * std::f64::consts::PI * *p;
                    let scaled = if wavelen > low_wavelen { *p * factor } else { *p };
                    if wavelen > high_wavelen && wavelen < low_wavelen {
                        let smooth = (old_context / wavelen - low) / (high - low);
                        *p = scaled / ((1.0 - smooth) / factor + smooth);
                    } else {
                        *p = scaled;
                    }
                }
            }
            // mlx-lm's YarnRoPE (all three names build it).
            "yarn" | "deepseek_yarn" | "telechat3-yarn" => {
                let yarn = Yarn {
                    factor: field("factor", None)?,
                    original_context: field("original_max_position_embeddings", Some(4096.0))?,
                    beta_fast: field("beta_fast", Some(32.0))?,
                    beta_slow: field("beta_slow", Some(1.0))?,
                    mscale: field("mscale", Some(1.0))?,
                    mscale_all_dim: field("mscale_all_dim", Some(0.0))?,
                };
                yarn.scale_periods(&mut periods, theta, dims);
                mscale = yarn.input_scale() as f32;
            }
            other => {
                return Err(Error::Unsupported(format!(
                    "{}: rope_scaling type {other:?} is not built yet (default, linear, llama3 and yarn are)",
                    config.file()
                )))
            }
        }
        // mlx computes the periods in float32 before inverting them.
        let inv_freqs = periods.iter().map(|&p| 1.0 / (p as f32)).collect();
        Ok(Rope { inv_freqs, traditional, mscale })
    }

    /// The inverse frequency of each rotated pair.
    pub(crate) fn inv_freqs(&self) -> &[f32] {
        &self.inv_freqs
    }

    /// Rotates `x [L, H, D]` at positions `offset..offset+L`.
    pub fn forward(&self, x: &Array, offset: usize) -> Result<Array> {
        if self.mscale == 1.0 {
            return Ok(x.rope(&self.inv_freqs, offset, self.traditional)?);
        }
        Ok(self.scaled(x)?.rope(&self.inv_freqs, offset, self.traditional)?)
    }

    /// `x` times yarn's magnitude scale, which mlx-lm applies to the rotated features only;
    /// here they must be the whole head.
    fn scaled(&self, x: &Array) -> Result<Array> {
        if 2 * self.inv_freqs.len() != x.dim(-1) {
            return Err(Error::Unsupported(format!(
                "yarn rope over {} of {} features per head (partial rotary) is not built yet",
                2 * self.inv_freqs.len(),
                x.dim(-1)
            )));
        }
        Ok(x.scale(self.mscale)?)
    }

    /// `(self.forward(q'), self.forward(k'))` where `q', k'` are `q, k` RMS-normalized per head
    /// by `qk_norm` (Qwen3's q/k norms) when given: one op where the backend fuses them.
    pub fn forward_qk(
        &self,
        q: &Array,
        k: &Array,
        qk_norm: Option<(&RmsNorm, &RmsNorm)>,
        offset: usize,
    ) -> Result<(Array, Array)> {
        if self.mscale != 1.0 {
            let (q, k) = match qk_norm {
                Some((qn, kn)) => (qn.forward(q)?, kn.forward(k)?),
                None => (q.clone(), k.clone()),
            };
            return Ok((self.forward(&q, offset)?, self.forward(&k, offset)?));
        }
        let norms = qk_norm.map(|(qn, kn)| (qn.weight(), kn.weight(), qn.eps()));
        if let Some((qn, kn)) = qk_norm {
            if qn.eps() != kn.eps() {
                // Not a model's layout; the separate ops keep it exact.
                return self.forward_qk(&qn.forward(q)?, &kn.forward(k)?, None, offset);
            }
        }
        Ok(nuvec::rope_qk(q, k, norms, &self.inv_freqs, offset, self.traditional)?)
    }

    /// [`Rope::forward_qk`], then the rotated keys and `v` written into the cache buffers
    /// `(keys, values, at)` (as [`nuvec::Array::write_kv_rows`]): returns the rotated queries. One
    /// op where the backend fuses it.
    pub fn forward_qk_into(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        qk_norm: Option<(&RmsNorm, &RmsNorm)>,
        offset: usize,
        (k_cache, v_cache, at): (&mut Array, &mut Array, usize),
    ) -> Result<Array> {
        let fused = self.mscale == 1.0 && qk_norm.is_none_or(|(qn, kn)| qn.eps() == kn.eps());
        if !fused {
            let (q, k) = self.forward_qk(q, k, qk_norm, offset)?;
            k_cache.write_kv_rows(v_cache, &k, v, at)?;
            return Ok(q);
        }
        let norms = qk_norm.map(|(qn, kn)| (qn.weight(), kn.weight(), qn.eps()));
        let cache = (k_cache, v_cache, at);
        Ok(nuvec::rope_qk_write_kv(q, k, v, norms, &self.inv_freqs, offset, self.traditional, cache)?)
    }

    /// Whether [`Rope::forward_qk_paged`] takes q/k norms `qk_norm` (it runs the one fused op,
    /// after yarn's magnitude scale where there are no norms to run first).
    pub fn fuses_paged(&self, qk_norm: Option<(&RmsNorm, &RmsNorm)>) -> bool {
        match qk_norm {
            None => true,
            Some((qn, kn)) => self.mscale == 1.0 && qn.eps() == kn.eps(),
        }
    }

    /// One new position of each of several paged sequences: row `i` of `q, k, v [n, heads,
    /// head_dim]` normalized (with `qk_norm`) and rotated at `positions[i]`, its key and value
    /// written at row `slots[i]` of the stores; returns the rotated queries. One op
    /// ([`nuvec::rope_qk_write_paged`]); only where [`Rope::fuses_paged`] says so.
    pub fn forward_qk_paged(
        &self,
        (q, k, v): (&Array, &Array, &Array),
        qk_norm: Option<(&RmsNorm, &RmsNorm)>,
        rows: (&[usize], &[usize]),
        stores: (&mut Array, &mut Array),
    ) -> Result<Array> {
        if !self.fuses_paged(qk_norm) {
            return Err(Error::Unsupported("this rope's paged decode writes are not one op".into()));
        }
        let norms = qk_norm.map(|(qn, kn)| (qn.weight(), kn.weight(), qn.eps()));
        if self.mscale != 1.0 {
            // Yarn's magnitude scale on every row first, as `forward` applies it.
            let (q, k) = (self.scaled(q)?, self.scaled(k)?);
            return Ok(nuvec::rope_qk_write_paged(&q, &k, v, norms, &self.inv_freqs, self.traditional, rows, stores)?);
        }
        Ok(nuvec::rope_qk_write_paged(q, k, v, norms, &self.inv_freqs, self.traditional, rows, stores)?)
    }
}

/// Yarn's settings (`rope_scaling` with `rope_type: yarn`), with mlx-lm's defaults.
struct Yarn {
    factor: f64,
    original_context: f64,
    beta_fast: f64,
    beta_slow: f64,
    mscale: f64,
    mscale_all_dim: f64,
}

impl Yarn {
    /// The feature index (fractional) whose pair turns `rotations` times over the original
    /// context.
    fn correction_dim(&self, rotations: f64, theta: f64, dims: usize) -> f64 {
        dims as f64 * (self.original_context / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln())
    }

    /// Blends each period between the original (fast pairs, below `low`) and the period
    /// stretched by `factor` (slow pairs, above `high`), linearly in between.
    fn scale_periods(&self, periods: &mut [f64], theta: f64, dims: usize) {
        let low = self.correction_dim(self.beta_fast, theta, dims).floor().max(0.0);
        let high = self.correction_dim(self.beta_slow, theta, dims).ceil().min(dims as f64 - 1.0);
        // mlx-lm widens an empty ramp to avoid dividing by zero.
        let high = if low == high { high + 0.001 } else { high };
        for (i, p) in periods.iter_mut().enumerate() {
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            // The share of the original period: 1 below `low`, 0 above `high`.
            let keep = 1.0 - ramp;
            let stretched = self.factor * *p;
            *p = (stretched * *p) / (stretched * keep + *p * (1.0 - keep));
        }
    }

    /// The factor the input is multiplied by before rotating.
    fn input_scale(&self) -> f64 {
        let magnitude = |m: f64| if self.factor <= 1.0 { 1.0 } else { 0.1 * m * self.factor.ln() + 1.0 };
        magnitude(self.mscale) / magnitude(self.mscale_all_dim)
    }
}

// Gemma 4
impl Rope {
    /// One layer type's rotary embedding from its own rope parameters (Gemma 4's
    /// `rope_parameters.{sliding_attention,full_attention}`), as mlx-lm's `initialize_rope` builds
    /// it for heads of `dims` features: `default`, `linear` (`factor`) and `proportional`, which
    /// rotates the first `partial_rotary_factor * dims / 2` frequency pairs with periods
    /// `factor * rope_theta^(2i / dims)` (the exponent over all `dims`) and leaves the other pairs
    /// unrotated (mlx-lm gives them infinite periods). `field` names the object in errors.
    pub fn from_parameters(
        config: &Config,
        field: &str,
        params: Option<&Value>,
        dims: usize,
        traditional: bool,
    ) -> Result<Self> {
        let number = |name: &str, default: f64| -> Result<f64> {
            match params.and_then(|p| p.get(name)).filter(|v| !v.is_null()) {
                None => Ok(default),
                Some(v) => v
                    .as_f64()
                    .ok_or_else(|| config.error(&format!("{field}.{name}"), format_args!("= {v} is not a number"))),
            }
        };
        let theta = number("rope_theta", 10000.0)?;
        let kind = params
            .and_then(|p| p.get("type").filter(|v| !v.is_null()).or_else(|| p.get("rope_type")))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let period = |i: usize| theta.powf(2.0 * i as f64 / dims as f64);
        let periods: Vec<Option<f64>> = match kind {
            "default" => (0..dims / 2).map(|i| Some(period(i))).collect(),
            "linear" => {
                let factor = number("factor", f64::NAN)?;
                if factor.is_nan() {
                    return Err(config.error(&format!("{field}.factor"), "is missing (rope_type linear needs it)"));
                }
                (0..dims / 2).map(|i| Some(period(i) * factor)).collect()
            }
            "proportional" => {
                let fraction = number("partial_rotary_factor", 1.0)?;
                let factor = number("factor", 1.0)?;
                let rotated = (dims as f64 * fraction) as usize;
                if rotated > dims || !rotated.is_multiple_of(2) {
                    return Err(config.error(
                        &format!("{field}.partial_rotary_factor"),
                        format_args!("= {fraction} rotates {rotated} of {dims} features; it must be an even count"),
                    ));
                }
                (0..dims / 2).map(|i| (i < rotated / 2).then(|| factor * period(i))).collect()
            }
            other => {
                return Err(Error::Unsupported(format!(
                    "{}: {field}.rope_type {other:?} is not built yet (default, linear and proportional are)",
                    config.file()
                )))
            }
        };
        // An unrotated pair has frequency zero: cos 1, sin 0, the features pass through exactly.
        let inv_freqs = periods.iter().map(|p| p.map_or(0.0, |p| 1.0 / (p as f32))).collect();
        Ok(Rope { inv_freqs, traditional, mscale: 1.0 })
    }
}
