//! Wrong guesses taken back from a paged cache (`PagedCache::set_rewind`), as Batcher
//! speculation does, on the layer kinds that forget: sliding windows of 8 (gpt-oss, Gemma 4),
//! which the sequences outgrow, and a hybrid's recurrent layers (Qwen3.5). Two sequences feed a
//! token and three guesses per pass and keep 1 to 4 of those rows; every kept row's logits must
//! be what the kept history alone gives on the model's own caches, and a trim past what was kept
//! is refused without a change.

mod common;

use common::{fixtures, rows_of as rows, seeded_prompt as prompt};
use nuvec_lm::{load_dir, Model, PagedCache};

/// As paged_cache.rs: rows of one pass round differently from one row's.
const TOLERANCE: f32 = 1e-3;

/// The logits of the last position of `history`, run alone (prefill, then the last token).
fn alone(model: &Model, history: &[u32]) -> Vec<f32> {
    let mut cache = model.make_cache(&Default::default()).unwrap();
    model.prefill(&history[..history.len() - 1], &mut cache).unwrap();
    rows(&model.forward_last(&history[history.len() - 1..], &mut cache).unwrap()).remove(0)
}

#[test]
fn guesses_are_taken_back_from_windows_and_recurrent_state() {
    for case in ["gpt_oss/gpt_oss-f32", "gemma4/gemma4-f32", "qwen3_5/qwen3_5-f32"] {
        let (model, _) = load_dir(&fixtures().join(case)).unwrap();
        let v = model.vocab_size();
        let mut paged = PagedCache::new(&model, 64, 16, 2).unwrap();
        paged.set_rewind(3).unwrap();
        paged.set_step_tokens(64).unwrap();
        let mut histories = [prompt(21, 1, v), prompt(12, 2, v)];
        let ids = [paged.add().unwrap(), paged.add().unwrap()];
        for (id, h) in ids.iter().zip(&histories) {
            paged.step(&model, &[(*id, &h[..h.len() - 1])]).unwrap();
        }
        let mut widest = 0f32;
        for round in 0..14 {
            // Each sequence's pending token and three guesses (seeded: any tokens will do).
            let fed: Vec<Vec<u32>> = (0..2)
                .map(|i| {
                    let guesses = prompt(3, 100 + round * 2 + i as u32, v);
                    [&histories[i][histories[i].len() - 1..], &guesses[..]].concat()
                })
                .collect();
            let work: Vec<_> = ids.iter().zip(&fed).map(|(id, f)| (*id, f.as_slice())).collect();
            let logits = rows(&paged.step_last_rows(&model, &work, &[4, 4]).unwrap());
            for i in 0..2 {
                // Keep 1..=4 rows, a different count for each sequence and round.
                let keep = (round as usize + 2 * i) % 4 + 1;
                for (r, row) in logits[i * 4..i * 4 + keep].iter().enumerate() {
                    let mut seen = histories[i].clone();
                    seen.extend_from_slice(&fed[i][1..=r]);
                    let want = alone(&model, &seen);
                    let worst = want.iter().zip(row).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
                    assert!(worst <= TOLERANCE, "{case}: round {round}, sequence {i}, row {r}: off by {worst}");
                    widest = widest.max(worst);
                }
                paged.trim(ids[i], 4 - keep).unwrap();
                // What the sequence now holds: its history with the kept guesses; the next
                // pending token is the kept rows' last guess's successor, here a fresh one.
                histories[i].extend_from_slice(&fed[i][1..keep]);
                histories[i].push(prompt(1, 300 + round, v)[0]);
                assert_eq!(paged.positions(ids[i]).unwrap(), histories[i].len() - 1, "{case}");
            }
        }
        // A trim reaching past the last pass (recurrent state) or the window's kept blocks is
        // refused and changes nothing.
        let held = paged.positions(ids[0]).unwrap();
        let far = if case.starts_with("qwen3_5") { 6 } else { 40 };
        assert!(paged.trim(ids[0], far).is_err(), "{case}: a trim of {far}");
        assert_eq!(paged.positions(ids[0]).unwrap(), held, "{case}");
        for id in ids {
            paged.remove(id).unwrap();
        }
        assert_eq!(paged.free_blocks(), 64, "{case}");
        eprintln!("{case}: widest difference {widest}");
    }
}
