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

/// Short chunks over cached prefixes, brought by several sequences in one step (what a
/// verification pass or a prefill's last chunk is): each prompt of `lengths` has its first
/// `prefix` tokens prefilled alone through `paged`, then every step gives each sequence its next
/// chunk (sizes taken in turn from `chunks`, sequence `i` starting at entry `i`, several of them
/// at most `nuvec_lm`'s in-place bound and some past it) or, once its prompt is in, its greedy
/// token, all together until each has `steps` decoded. Against the same passes alone on the
/// model's own caches made with `options`: every step's logits within `tolerance` and equal
/// greedy tokens. The sequences are removed at the end. Returns the widest logit difference.
pub fn chunks_against_alone(
    model: &Model,
    case: &str,
    paged: &mut PagedCache,
    (lengths, prefix, chunks, steps): (&[usize], usize, &[usize], usize),
    options: &CacheOptions,
    tolerance: f32,
) -> f32 {
    let prompts: Vec<Vec<u32>> =
        lengths.iter().enumerate().map(|(i, &n)| prompt(n, i as u32 + 11, model.vocab_size())).collect();
    let pass = |cache: &mut Vec<LayerCache>| cache.iter_mut().for_each(|c| c.maybe_quantize(options).unwrap());
    let mut ids = vec![];
    let mut alone = vec![];
    for p in &prompts {
        let id = paged.add().unwrap();
        paged.step(model, &[(id, &p[..prefix])]).unwrap();
        ids.push(id);
        let mut cache = model.make_cache(options).unwrap();
        model.prefill(&p[..prefix], &mut cache).unwrap();
        pass(&mut cache);
        alone.push(cache);
    }
    let mut fed = vec![prefix; prompts.len()];
    let mut turn: Vec<usize> = (0..prompts.len()).collect();
    let mut decoded = vec![0usize; prompts.len()];
    let mut next: Vec<Option<u32>> = vec![None; prompts.len()];
    let (mut widest, mut several) = (0f32, 0);
    while decoded.iter().any(|&d| d < steps) {
        let mut work: Vec<(usize, Vec<u32>)> = vec![];
        for (i, p) in prompts.iter().enumerate() {
            if fed[i] < p.len() {
                let n = chunks[turn[i] % chunks.len()].min(p.len() - fed[i]);
                turn[i] += 1;
                work.push((i, p[fed[i]..fed[i] + n].to_vec()));
            } else if decoded[i] < steps {
                work.push((i, vec![next[i].expect("a greedy token after the prompt")]));
            }
        }
        let short = work.iter().filter(|(_, t)| t.len() <= 16).count();
        several += usize::from(short >= 2 && work.iter().any(|(_, t)| (2..=16).contains(&t.len())));
        let step: Vec<(nuvec_lm::SeqId, &[u32])> = work.iter().map(|(i, t)| (ids[*i], &t[..])).collect();
        let logits = rows(&paged.step(model, &step).unwrap());
        for ((i, tokens), ours) in work.into_iter().zip(logits) {
            let reference = rows(&model.forward_last(&tokens, &mut alone[i]).unwrap()).remove(0);
            pass(&mut alone[i]);
            let at = fed[i];
            if super::gpu_cases::margin(&reference) > 2.0 * tolerance {
                assert_eq!(argmax(&ours), argmax(&reference), "{case}: sequence {i}, {} rows at {at}", tokens.len());
            }
            let worst = reference.iter().zip(&ours).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(
                worst <= tolerance,
                "{case}: sequence {i}, {} rows at {at}: logits differ by {worst}",
                tokens.len()
            );
            widest = widest.max(worst);
            if fed[i] < prompts[i].len() {
                fed[i] += tokens.len();
            } else {
                decoded[i] += 1;
            }
            next[i] = Some(argmax(&reference));
        }
    }
    assert!(several >= 2, "{case}: only {several} steps brought a short chunk beside another short one or a decode");
    for id in ids {
        paged.remove(id).unwrap();
    }
    widest
}
