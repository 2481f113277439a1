//! Paged sequences prefilled through `PagedCache::step` and decoded together, against the same
//! passes alone on the model's own caches.

use nuvec_lm::cache::{CacheOptions, LayerCache};
use nuvec_lm::sample::argmax;
use nuvec_lm::{decode_batch, Model, PagedCache};

use super::{rows_of as rows, seeded_prompt as prompt};

/// Every prompt of `lengths` (seeded per index) prefilled alone through `paged` in chunks of
/// `chunk`, then all decoded together `steps` times; against the same chunks and steps on the
/// model's own caches made with `options` and quantized after each pass as they say (mlx-lm's
/// semantics, `generate`'s passes): equal greedy tokens and logits within `tolerance`. The
/// sequences are removed at the end. Returns the widest logit difference.
pub fn stepped_against_alone(
    model: &Model,
    case: &str,
    paged: &mut PagedCache,
    (lengths, steps, chunk): (&[usize], usize, usize),
    options: &CacheOptions,
    tolerance: f32,
) -> f32 {
    let prompts: Vec<Vec<u32>> =
        lengths.iter().enumerate().map(|(i, &n)| prompt(n, i as u32 + 3, model.vocab_size())).collect();
    let mut ids = vec![];
    for p in &prompts {
        let id = paged.add().unwrap();
        for c in p[..p.len() - 1].chunks(chunk) {
            paged.step(model, &[(id, c)]).unwrap();
        }
        ids.push(id);
    }
    let mut tokens: Vec<u32> = prompts.iter().map(|p| *p.last().unwrap()).collect();
    let mut together = vec![vec![]; prompts.len()];
    for _ in 0..steps {
        for (i, row) in rows(&decode_batch(model, &tokens, &ids, paged).unwrap()).into_iter().enumerate() {
            tokens[i] = argmax(&row);
            together[i].push(row);
        }
    }
    let mut widest = 0f32;
    for (i, p) in prompts.iter().enumerate() {
        // Alone: the same chunks on the model's own caches.
        let mut cache = model.make_cache(options).unwrap();
        let pass = |cache: &mut Vec<LayerCache>| cache.iter_mut().for_each(|c| c.maybe_quantize(options).unwrap());
        for c in p[..p.len() - 1].chunks(chunk) {
            model.prefill(c, &mut cache).unwrap();
            pass(&mut cache);
        }
        let mut t = *p.last().unwrap();
        for (step, ours) in together[i].iter().enumerate() {
            let reference = rows(&model.forward_last(&[t], &mut cache).unwrap()).remove(0);
            pass(&mut cache);
            t = argmax(&reference);
            assert_eq!(argmax(ours), t, "{case}: sequence {i} ({} tokens) step {step}", p.len());
            let worst = reference.iter().zip(ours).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(worst <= tolerance, "{case}: sequence {i} step {step}: logits differ by {worst}");
            widest = widest.max(worst);
        }
    }
    for id in ids {
        paged.remove(id).unwrap();
    }
    widest
}
