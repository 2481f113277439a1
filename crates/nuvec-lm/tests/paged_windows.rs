//! Sliding-window layers in a paged cache give their blocks back as positions leave the window
//! (gpt-oss's and Gemma 4's windows, 8 positions in these fixtures): a window pool bounded by
//! `PagedCache::set_step_tokens` far smaller than the sequences' lengths still serves them, each
//! getting what it gets alone on the model's own rotating caches; trims that reach a given-back
//! block are refused; prefix hits take the window blocks their end still reads; and the Batcher
//! sizes such a model's cache from memory.

mod common;

use common::{fixtures, rows_of as rows, seeded_prompt as prompt};
use nuvec_lm::sample::argmax;
use nuvec_lm::{decode_batch, generate, load_dir, Batcher, BatcherOptions, Event, GenerateOptions, PagedCache};

/// As paged_cache.rs: batched rows round differently from one row's.
const TOLERANCE: f32 = 1e-3;

/// Every prompt prefilled alone through `paged` in chunks of `chunk`, then all decoded together
/// `steps` times, against the same passes on the model's own caches.
fn check(case: &str, lengths: &[usize], steps: usize, chunk: usize, paged: &mut PagedCache) {
    let (model, _) = load_dir(&fixtures().join(case)).unwrap();
    let prompts: Vec<Vec<u32>> =
        lengths.iter().enumerate().map(|(i, &n)| prompt(n, i as u32 + 3, model.vocab_size())).collect();
    let mut ids = vec![];
    for p in &prompts {
        let id = paged.add().unwrap();
        for c in p[..p.len() - 1].chunks(chunk) {
            paged.step(&model, &[(id, c)]).unwrap();
        }
        ids.push(id);
    }
    let mut tokens: Vec<u32> = prompts.iter().map(|p| *p.last().unwrap()).collect();
    let mut together = vec![vec![]; prompts.len()];
    for _ in 0..steps {
        for (i, row) in rows(&decode_batch(&model, &tokens, &ids, paged).unwrap()).into_iter().enumerate() {
            tokens[i] = argmax(&row);
            together[i].push(row);
        }
    }
    for (i, p) in prompts.iter().enumerate() {
        let mut cache = model.new_cache();
        for c in p[..p.len() - 1].chunks(chunk) {
            model.prefill(c, &mut cache).unwrap();
        }
        let mut t = *p.last().unwrap();
        for (step, ours) in together[i].iter().enumerate() {
            let reference = rows(&model.forward_last(&[t], &mut cache).unwrap()).remove(0);
            t = argmax(&reference);
            assert_eq!(argmax(ours), t, "{case}: sequence {i} ({} tokens) step {step}", p.len());
            let worst = reference.iter().zip(ours).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(worst <= TOLERANCE, "{case}: sequence {i} step {step}: logits differ by {worst}");
        }
    }
    for id in ids {
        paged.remove(id).unwrap();
    }
}

#[test]
fn a_window_pool_far_smaller_than_the_sequences_serves_them_exactly() {
    for case in ["gpt_oss/gpt_oss-f32", "gemma4/gemma4-f32", "gemma4/gemma4_moe-f32"] {
        let (model, _) = load_dir(&fixtures().join(case)).unwrap();
        let mut paged = PagedCache::new(&model, 64, 16, 3).unwrap();
        assert_eq!(paged.window_blocks(), Some(64), "{case}: unbounded, as many as the full layers");
        paged.set_step_tokens(32).unwrap();
        // Per sequence: its 7 earlier positions over at most 2 blocks, one more boundary; then
        // the step's 32 new positions over 2 blocks.
        assert_eq!(paged.window_blocks(), Some(3 * 3 + 2), "{case}");
        // Three sequences spanning up to 13 blocks each, through 11 window blocks in all.
        check(case, &[200, 17, 150], 10, 32, &mut paged);
        assert_eq!(paged.free_window_blocks(), Some(11), "{case}: all given back");
        assert_eq!(paged.free_blocks(), 64, "{case}");
    }
}

#[test]
fn blocks_leave_with_the_window_and_trims_stop_at_them() {
    let (model, _) = load_dir(&fixtures().join("gpt_oss/gpt_oss-f32")).unwrap();
    let mut paged = PagedCache::new(&model, 16, 16, 2).unwrap();
    let id = paged.add().unwrap();
    let p = prompt(60, 1, model.vocab_size());
    for c in p.chunks(3) {
        paged.step(&model, &[(id, c)]).unwrap();
    }
    // 60 positions: four blocks in the full layers; the window (positions 53..60) in one.
    assert_eq!((paged.free_blocks(), paged.free_window_blocks()), (12, Some(15)));
    // Back to 58: the window then starts at 51, still in the block held.
    paged.trim(id, 2).unwrap();
    // Back to 50 would need positions from 43, whose block was given back.
    let err = paged.trim(id, 8).unwrap_err().to_string();
    assert!(err.contains("sliding-window") && err.contains("back to 50"), "{err}");
    assert_eq!(paged.positions(id).unwrap(), 58, "a refused trim changes nothing");
    paged.set_step_tokens(16).unwrap_err();
}

/// Greedy tokens of `prompt` alone, and what the Batcher gives it after `before`.
fn batcher_run(batcher: &mut Batcher, prompt: Vec<u32>) -> (Vec<u32>, usize) {
    let id = batcher.submit(prompt, GenerateOptions { max_tokens: 6, ..Default::default() }).unwrap();
    let (mut tokens, mut cached) = (vec![], 0);
    while batcher.is_busy() {
        for event in batcher.step().unwrap() {
            match event {
                Event::Token { id: i, token } if i == id => tokens.push(token),
                Event::Started { id: i, cached_tokens } if i == id => cached = cached_tokens,
                Event::Failed { error, .. } => panic!("{error}"),
                _ => {}
            }
        }
    }
    (tokens, cached)
}

#[test]
fn prefix_hits_take_the_window_blocks_their_end_reads_and_the_cache_is_sized_from_memory() {
    for case in ["gpt_oss/gpt_oss-f32", "gemma4/gemma4-f32"] {
        let (model, _) = load_dir(&fixtures().join(case)).unwrap();
        let v = model.vocab_size();
        // Sized from memory (this failed for models with sliding-window layers before).
        let mut batcher = Batcher::new(&model, BatcherOptions::default()).unwrap();
        assert!(batcher.prefix_caching());
        let system = prompt(40, 9, v);
        let with = |seed: u32| -> Vec<u32> { system.iter().copied().chain(prompt(7, seed, v)).collect() };
        let alone = |p: &[u32]| -> Vec<u32> {
            let options = GenerateOptions { max_tokens: 6, ..Default::default() };
            generate(&model, p, options).unwrap().map(Result::unwrap).collect()
        };
        let (first, cached) = batcher_run(&mut batcher, with(1));
        assert_eq!((first, cached), (alone(&with(1)), 0), "{case}: cold");
        // Two whole blocks of the 40-token prefix: the window layers need only the second
        // (positions 25..32), kept in the free list with its index after the first request.
        let (second, cached) = batcher_run(&mut batcher, with(2));
        assert_eq!((second, cached), (alone(&with(2)), 32), "{case}: a hit");
    }
}
