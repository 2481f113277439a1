//! Perplexity of a model over a dataset, as mlx_lm.perplexity computes it: windows of the
//! dataset's tokens ([`Dataset::windows`]), each window's every next token scored by the model
//! (windows batched through [`crate::Model::step_all`]), perplexity the exponential of the mean
//! loss, and its standard error by the delta method.

mod dataset;
mod permutation;

pub use dataset::{Dataset, Format};
pub use permutation::numpy_permutation;

use crate::{Model, Result, StepBatch};

/// What [`evaluate`] measured.
#[derive(Debug, Clone, Copy)]
pub struct Perplexity {
    /// exp(mean loss).
    pub perplexity: f64,
    /// The perplexity's standard error: perplexity x the sample standard deviation of the
    /// losses (n - 1 in the denominator) / sqrt(n).
    pub standard_error: f64,
    /// The mean cross-entropy loss per token, in nats.
    pub mean_loss: f64,
    /// The tokens scored: every window's length less one.
    pub tokens: usize,
}

/// Scores every window (each at least two tokens): `batch_size` windows a forward pass, each on
/// a fresh cache, the logits of every position but the last against the next token
/// (cross-entropy in f32 as mlx-lm's `nn.losses.cross_entropy`, summed in f64). `progress` is
/// called after each batch with the batches done and their count.
pub fn evaluate(
    model: &Model,
    windows: &[Vec<u32>],
    batch_size: usize,
    mut progress: impl FnMut(usize, usize),
) -> Result<Perplexity> {
    if batch_size == 0 {
        return Err(crate::Error::Invalid("a batch size of 0: at least one window a pass".into()));
    }
    if let Some(w) = windows.iter().find(|w| w.len() < 2) {
        return Err(crate::Error::Invalid(format!("a window of {} tokens: at least 2 are needed", w.len())));
    }
    let mut losses: Vec<f32> = Vec::with_capacity(windows.iter().map(|w| w.len() - 1).sum());
    let batches = windows.len().div_ceil(batch_size);
    for (b, batch) in windows.chunks(batch_size).enumerate() {
        let mut caches: Vec<_> = batch.iter().map(|_| model.new_cache()).collect();
        let mut step = StepBatch::new();
        for (w, cache) in batch.iter().zip(caches.iter_mut()) {
            step.push(&w[..w.len() - 1], cache)?;
        }
        let logits = model.step_all(&mut step)?;
        let vocab = logits.dim(1);
        let rows = logits.to_f32_vec()?;
        let targets = batch.iter().flat_map(|w| &w[1..]);
        for (row, &target) in rows.chunks_exact(vocab).zip(targets) {
            losses.push(cross_entropy(row, target as usize));
        }
        progress(b + 1, batches);
    }
    Ok(summarize(&losses))
}

/// -log softmax(row)[target], in f32 as mlx computes it: log-sum-exp over the row less the
/// target's logit.
fn cross_entropy(row: &[f32], target: usize) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = row.iter().map(|&x| (x - max).exp()).sum();
    max + sum.ln() - row.get(target).copied().unwrap_or(f32::NAN)
}

/// Perplexity and its standard error from the per-token losses.
fn summarize(losses: &[f32]) -> Perplexity {
    let n = losses.len();
    let mean = losses.iter().map(|&l| l as f64).sum::<f64>() / n.max(1) as f64;
    let var = losses.iter().map(|&l| (l as f64 - mean).powi(2)).sum::<f64>() / (n.max(2) - 1) as f64;
    let perplexity = mean.exp();
    Perplexity { perplexity, standard_error: perplexity * var.sqrt() / (n as f64).sqrt(), mean_loss: mean, tokens: n }
}

#[cfg(test)]
mod tests {
    use super::{cross_entropy, summarize};

    #[test]
    fn losses_and_their_summary() {
        // Uniform logits over 4 tokens: ln 4 for any target.
        assert!((cross_entropy(&[1.0; 4], 2) - 4f32.ln()).abs() < 1e-6);
        // Large logits stay finite (the maximum is taken out first).
        let l = cross_entropy(&[1000.0, 0.0], 0);
        assert!(l.abs() < 1e-6, "{l}");
        let s = summarize(&[1.0, 2.0, 3.0]);
        assert!((s.mean_loss - 2.0).abs() < 1e-12 && s.tokens == 3);
        assert!((s.perplexity - 2f64.exp()).abs() < 1e-9);
        // Sample standard deviation 1 (n - 1 = 2), over sqrt(3) tokens, times the perplexity.
        assert!((s.standard_error - 2f64.exp() / 3f64.sqrt()).abs() < 1e-9);
    }
}
