//! Sliding-window layers in a paged cache give their blocks back as positions leave the window
//! (gpt-oss's and Gemma 4's windows, 8 positions in these fixtures): a window pool bounded by
//! `PagedCache::set_step_tokens` far smaller than the sequences' lengths still serves them, each
//! getting what it gets alone on the model's own rotating caches; trims that reach a given-back
//! block are refused; prefix hits take the window blocks their end still reads; and the Batcher
//! sizes such a model's cache from memory.

mod common;

use common::paged::stepped_against_alone;
use common::{fixtures, seeded_prompt as prompt};
use nuvec_lm::{generate, load_dir, Batcher, BatcherOptions, Event, GenerateOptions, PagedCache};

/// As paged_cache.rs: batched rows round differently from one row's.
const TOLERANCE: f32 = 1e-3;

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
        stepped_against_alone(&model, case, &mut paged, (&[200, 17, 150], 10, 32), &Default::default(), TOLERANCE);
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
