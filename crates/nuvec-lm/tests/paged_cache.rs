//! `PagedCache` and `decode_batch`: sequences in blocks of a shared pool, advanced together,
//! each getting the greedy tokens it gets decoding alone (and the same logits to rounding; a
//! batch of one bit for bit); blocks counted exactly, freed on remove and trim; bad ids, a full
//! pool, another model refused with the cache left as it was.

mod common;

use common::paged::{chunks_against_alone, stepped_against_alone};
use common::{fixtures, rows_of as rows, seeded_prompt as prompt};
use nuvec_lm::sample::argmax;
use nuvec_lm::{decode_batch, load_dir, Model, PagedCache, SeqId};

/// As batch_step.rs: row-batched products sum in another order than one row's.
const TOLERANCE: f32 = 1e-3;

/// Greedy decoding of `prompt` alone on a plain cache, in the same passes as [`paged`] (the
/// prompt but its last token, then one token at a time): each step's logits.
fn alone(model: &Model, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let mut cache = model.new_cache();
    let (head, last) = prompt.split_at(prompt.len() - 1);
    if !head.is_empty() {
        model.prefill(head, &mut cache).unwrap();
    }
    let mut logits = rows(&model.forward_last(last, &mut cache).unwrap()).remove(0);
    let mut all = vec![];
    for _ in 0..steps {
        let t = argmax(&logits);
        all.push(logits);
        logits = rows(&model.forward_last(&[t], &mut cache).unwrap()).remove(0);
    }
    all
}

/// The seed's flow: prefill each prompt but its last token alone, insert the cache, then
/// decode_batch the last tokens and every greedy token after them together.
fn paged(model: &Model, prompts: &[Vec<u32>], steps: usize, block_size: usize) -> Vec<Vec<Vec<f32>>> {
    let mut paged = PagedCache::new(model, 512, block_size, 8).unwrap();
    let mut ids = vec![];
    for p in prompts {
        let id = match p.len() {
            1 => paged.add().unwrap(),
            n => {
                let mut kv = model.new_cache();
                model.prefill(&p[..n - 1], &mut kv).unwrap();
                paged.insert(&kv).unwrap()
            }
        };
        assert_eq!(paged.positions(id).unwrap(), p.len() - 1);
        ids.push(id);
    }
    let mut tokens: Vec<u32> = prompts.iter().map(|p| *p.last().unwrap()).collect();
    let mut out = vec![vec![]; prompts.len()];
    for _ in 0..steps {
        let logits = rows(&decode_batch(model, &tokens, &ids, &mut paged).unwrap());
        for (i, row) in logits.into_iter().enumerate() {
            tokens[i] = argmax(&row);
            out[i].push(row);
        }
    }
    out
}

fn check(case: &str, lengths: &[usize], steps: usize) {
    let (model, _) = load_dir(&fixtures().join(case)).unwrap();
    let prompts: Vec<Vec<u32>> =
        lengths.iter().enumerate().map(|(i, &n)| prompt(n, i as u32 + 3, model.vocab_size())).collect();
    let together = paged(&model, &prompts, steps, 16);
    let mut widest = 0f32;
    for (i, p) in prompts.iter().enumerate() {
        let reference = alone(&model, p, steps);
        let tokens: Vec<u32> = reference.iter().map(|r| argmax(r)).collect();
        let ours: Vec<u32> = together[i].iter().map(|r| argmax(r)).collect();
        assert_eq!(ours, tokens, "{case}: sequence {i} ({} prompt tokens)", p.len());
        for (a, b) in reference.iter().zip(&together[i]) {
            let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(worst <= TOLERANCE, "{case}: sequence {i}: logits differ by {worst}");
            widest = widest.max(worst);
        }
    }
    eprintln!("{case}: lengths {lengths:?}, widest logit difference from alone {widest:e}");
}

#[test]
fn decode_batch_of_mixed_lengths_matches_decoding_alone() {
    check("llama-f32", &[1, 17, 300, 2100], 8);
    // More than four rows: the projections run as one matrix product, not a GEMV per row.
    check("llama-q4g64", &[1, 2, 3, 17, 40, 300, 5], 6);
    check("qwen3-f32", &[17, 1, 300], 6);
    check("llama-q4g64", &[300, 17], 6);
    check("qwen3_moe-f32", &[1, 17, 32], 6);
}

/// Steps that decode some sequences and prefill others, as the Batcher's are (the decoding rows
/// not all next to each other): the decodes are attended as one op, the chunks each alone, and
/// every sequence gets the logits it gets alone, to rounding, and its greedy tokens.
#[test]
fn steps_that_decode_and_prefill_match_each_alone() {
    for case in ["llama-q4g64", "qwen3-f32", "qwen3_moe-f32"] {
        let (model, _) = load_dir(&fixtures().join(case)).unwrap();
        let lengths = [40usize, 150, 90, 17, 64];
        let prompts: Vec<Vec<u32>> =
            lengths.iter().enumerate().map(|(i, &n)| prompt(n, i as u32 + 3, model.vocab_size())).collect();
        let steps = 8;
        let mut paged = PagedCache::new(&model, 512, 16, 8).unwrap();
        let ids: Vec<SeqId> = prompts.iter().map(|_| paged.add().unwrap()).collect();
        // Prompt tokens in the cache: sequences 0, 2 and 3 all but their last before the steps;
        // 1 and 4 take 32 a step beside the others' decodes.
        let mut fed = vec![0usize; prompts.len()];
        for i in [0, 2, 3] {
            paged.step(&model, &[(ids[i], &prompts[i][..lengths[i] - 1])]).unwrap();
            fed[i] = lengths[i] - 1;
        }
        let mut got: Vec<Vec<Vec<f32>>> = vec![vec![]; prompts.len()];
        let mut mixed = 0;
        while got.iter().any(|g| g.len() < steps) {
            let mut work: Vec<(usize, Vec<u32>)> = vec![];
            for (i, p) in prompts.iter().enumerate() {
                if fed[i] < p.len() - 1 {
                    work.push((i, p[fed[i]..(fed[i] + 32).min(p.len() - 1)].to_vec()));
                } else if got[i].len() < steps {
                    work.push((i, vec![got[i].last().map_or(p[p.len() - 1], |r| argmax(r))]));
                }
            }
            let decodes = work.iter().filter(|(i, t)| t.len() == 1 && fed[*i] == lengths[*i] - 1).count();
            mixed += usize::from(decodes >= 2 && decodes < work.len());
            let step: Vec<(SeqId, &[u32])> = work.iter().map(|(i, t)| (ids[*i], &t[..])).collect();
            let logits = rows(&paged.step(&model, &step).unwrap());
            for ((i, tokens), row) in work.into_iter().zip(logits) {
                if fed[i] < lengths[i] - 1 {
                    fed[i] += tokens.len();
                } else {
                    got[i].push(row);
                }
            }
        }
        assert!(mixed >= 2, "{case}: {mixed} steps both decoded several sequences and prefilled");
        let mut widest = 0f32;
        for (i, p) in prompts.iter().enumerate() {
            for (step, (a, b)) in alone(&model, p, steps).iter().zip(&got[i]).enumerate() {
                assert_eq!(argmax(b), argmax(a), "{case}: sequence {i} step {step}");
                let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
                assert!(worst <= TOLERANCE, "{case}: sequence {i} step {step}: logits differ by {worst}");
                widest = widest.max(worst);
            }
        }
        eprintln!("{case}: {mixed} mixed steps, widest logit difference from alone {widest:e}");
    }
}

#[test]
fn hybrid_states_live_in_slots_of_their_own() {
    check("qwen3_5/qwen3_5-f32", &[1, 17, 300], 6);
}

#[test]
fn a_batch_of_one_is_the_plain_cache_bit_for_bit() {
    let (model, _) = load_dir(&fixtures().join("qwen3-f32")).unwrap();
    for block_size in [1, 16, 48] {
        let p = prompt(100, 1, model.vocab_size());
        let together = paged(&model, std::slice::from_ref(&p), 5, block_size);
        assert_eq!(together[0], alone(&model, &p, 5), "block size {block_size}");
    }
}

#[test]
fn blocks_are_counted_taken_and_given_back() {
    let (model, _) = load_dir(&fixtures().join("llama-f32")).unwrap();
    let mut paged = PagedCache::new(&model, 4, 16, 2).unwrap();
    assert_eq!((paged.total_blocks(), paged.free_blocks(), paged.block_size()), (4, 4, 16));
    let mut kv = model.new_cache();
    model.prefill(&prompt(17, 1, model.vocab_size()), &mut kv).unwrap();
    let a = paged.insert(&kv).unwrap();
    assert_eq!(paged.free_blocks(), 2, "17 positions take 2 blocks of 16");
    // Decoding to 32 positions stays in two blocks; the 33rd takes a third.
    let mut t = 5;
    for _ in 0..15 {
        t = argmax(&rows(&decode_batch(&model, &[t], &[a], &mut paged).unwrap())[0]);
    }
    assert_eq!((paged.positions(a).unwrap(), paged.free_blocks()), (32, 2));
    decode_batch(&model, &[t], &[a], &mut paged).unwrap();
    assert_eq!((paged.positions(a).unwrap(), paged.free_blocks()), (33, 1));
    // More sequences than slots.
    let b = paged.add().unwrap();
    let err = paged.add().unwrap_err().to_string();
    assert!(err.contains("2 sequences"), "{err}");
    // A step that runs out of blocks half-way (b takes the last block, a needs none, then a
    // prefill chunk of 20 for b needs another) leaves both as they were.
    decode_batch(&model, &[7, 8], &[a, b], &mut paged).unwrap();
    assert_eq!(paged.free_blocks(), 0);
    let chunk = prompt(20, 2, model.vocab_size());
    let before = (paged.positions(a).unwrap(), paged.positions(b).unwrap());
    let err = paged.step(&model, &[(a, &[9]), (b, &chunk)]).unwrap_err().to_string();
    assert!(err.contains("paged cache is full") && err.contains("4 blocks of 16"), "{err}");
    assert_eq!((paged.positions(a).unwrap(), paged.positions(b).unwrap()), before);
    assert_eq!(paged.free_blocks(), 0, "the failed step gave back what it took");
    // Removing a frees its three blocks at once.
    paged.remove(a).unwrap();
    assert_eq!((paged.free_blocks(), paged.len()), (3, 1));
    assert!(paged.positions(a).is_err());
}

#[test]
fn bad_ids_and_another_model_are_refused() {
    let (model, _) = load_dir(&fixtures().join("llama-f32")).unwrap();
    let mut paged = PagedCache::new(&model, 8, 16, 4).unwrap();
    let a = paged.add().unwrap();
    let err = decode_batch(&model, &[5, 6], &[a, a], &mut paged).unwrap_err().to_string();
    assert!(err.contains("appears twice"), "{err}");
    let err = decode_batch(&model, &[5], &[SeqId(3)], &mut paged).unwrap_err().to_string();
    assert!(err.contains("sequence 3 is not in the paged cache"), "{err}");
    let err = decode_batch(&model, &[5, 6], &[a], &mut paged).unwrap_err().to_string();
    assert!(err.contains("2 tokens for 1 sequences"), "{err}");
    let vocab = model.vocab_size() as u32;
    let err = decode_batch(&model, &[vocab], &[a], &mut paged).unwrap_err().to_string();
    assert!(err.contains(&format!("token {vocab}")), "{err}");
    let (other, _) = load_dir(&fixtures().join("qwen3-f32")).unwrap();
    let err = decode_batch(&other, &[5], &[a], &mut paged).unwrap_err().to_string();
    assert!(err.contains("another model"), "{err}");
    let mut qwen_cache = other.new_cache();
    other.prefill(&[5, 6, 7], &mut qwen_cache).unwrap();
    assert!(paged.insert(&qwen_cache[..1]).is_err(), "a cache of another layer count");
    assert_eq!(paged.positions(a).unwrap(), 0, "nothing ran");
    for (name, v) in [("blocks", (0, 16, 1)), ("block_size", (8, 0, 1)), ("max_seqs", (8, 16, 0))] {
        let err = PagedCache::new(&model, v.0, v.1, v.2).unwrap_err().to_string();
        assert!(err.contains(name), "{err}");
    }
}

/// Sliding-window layers in the paged cache: every sequence prefilled through
/// `PagedCache::step` (in chunks of `chunk`, so chunks cross the 8-token window), then decoded
/// together, against decoding alone on the model's own rotating caches (mlx-lm's semantics).
fn check_stepped(case: &str, lengths: &[usize], steps: usize, chunk: usize) {
    let (model, _) = load_dir(&fixtures().join(case)).unwrap();
    let mut paged = PagedCache::new(&model, 512, 16, 8).unwrap();
    let widest =
        stepped_against_alone(&model, case, &mut paged, (lengths, steps, chunk), &Default::default(), TOLERANCE);
    eprintln!("{case}: lengths {lengths:?}, chunks of {chunk}, widest logit difference from alone {widest:e}");
}

/// Short chunks over cached prefixes, several in one step beside decodes and longer chunks
/// (attended in place, each row as a decode at its position), for every attention layer type:
/// plain, MoE, a quantized model, sliding windows with sinks (gpt-oss) and with KV-shared
/// layers (Gemma 4), and a hybrid's gated attention beside its recurrent layers (Qwen3.5).
#[test]
fn short_chunks_over_cached_prefixes_attend_in_place_as_alone() {
    let chunks = [3, 16, 1, 7, 17, 2, 5];
    for (case, lengths) in [
        ("llama-f32", &[70, 45, 90][..]),
        ("llama-q4g64", &[60, 41]),
        ("qwen3_moe-f32", &[50, 33, 64]),
        ("gpt_oss/gpt_oss-f32", &[60, 37, 29]),
        ("gemma4/gemma4-f32", &[44, 57, 30]),
        ("qwen3_5/qwen3_5-f32", &[48, 35]),
    ] {
        let (model, _) = load_dir(&fixtures().join(case)).unwrap();
        let mut paged = PagedCache::new(&model, 256, 16, 8).unwrap();
        let free = paged.free_blocks();
        let setup = (lengths, 20, &chunks[..], 6);
        let widest = chunks_against_alone(&model, case, &mut paged, setup, &Default::default(), TOLERANCE);
        eprintln!("{case}: short chunks, widest logit difference from alone {widest:e}");
        assert_eq!(paged.free_blocks(), free, "{case}: every block back");
    }
}

#[test]
fn sliding_window_layers_see_the_window_mlx_lm_rotating_caches_give() {
    // Windows of 8: prompts shorter than it, crossing it once, and far past it; chunks shorter
    // and longer than the window.
    check_stepped("gpt_oss/gpt_oss-f32", &[1, 5, 17, 60], 12, 3);
    check_stepped("gpt_oss/gpt_oss-q4g64", &[30, 2], 10, 64);
    check_stepped("gemma4/gemma4-f32", &[1, 9, 40], 12, 5);
    check_stepped("gemma4/gemma4_moe-f32", &[20, 3], 8, 64);
}

#[test]
fn inserting_a_sliding_window_cache_is_refused() {
    // A ring may have dropped positions the full layers still hold: such sequences are
    // prefilled through the paged cache itself.
    let (model, _) = load_dir(&fixtures().join("gpt_oss/gpt_oss-f32")).unwrap();
    let mut paged = PagedCache::new(&model, 8, 16, 1).unwrap();
    let mut kv = model.new_cache();
    model.prefill(&[5, 6, 7], &mut kv).unwrap();
    let err = paged.insert(&kv).unwrap_err().to_string();
    assert!(err.contains("sliding-window") && err.contains("PagedCache::step"), "{err}");
    assert!(paged.is_empty(), "a refused insert leaves no sequence behind");
}

#[test]
fn trimming_a_paged_sequence_is_exact_and_frees_blocks() {
    let (model, _) = load_dir(&fixtures().join("llama-f32")).unwrap();
    let mut paged = PagedCache::new(&model, 8, 16, 1).unwrap();
    let p = prompt(40, 4, model.vocab_size());
    let id = paged.add().unwrap();
    paged.step(&model, &[(id, &p)]).unwrap();
    assert_eq!((paged.positions(id).unwrap(), paged.free_blocks()), (40, 5));
    let err = paged.trim(id, 41).unwrap_err().to_string();
    assert!(err.contains("41"), "{err}");
    assert_eq!(paged.positions(id).unwrap(), 40, "a refused trim removes nothing");
    paged.trim(id, 30).unwrap();
    assert_eq!((paged.positions(id).unwrap(), paged.free_blocks()), (10, 7));
    // Continuing from the 10 kept positions is what a plain cache trimmed alike gives, bit for bit.
    let resumed = rows(&paged.step(&model, &[(id, &p[10..11])]).unwrap()).remove(0);
    let mut kv = model.new_cache();
    model.prefill(&p, &mut kv).unwrap();
    kv.iter_mut().for_each(|c| c.trim(30).unwrap());
    let plain = rows(&model.forward_last(&p[10..11], &mut kv).unwrap()).remove(0);
    assert_eq!(resumed, plain);
}

/// The logits of `then` on a plain cache that computed `first` in one pass and forgot its last
/// `trim` positions: the reference for a paged sequence whose positions that pass computed.
fn plain(model: &Model, first: &[u32], trim: usize, then: &[u32]) -> Vec<f32> {
    let mut kv = model.new_cache();
    model.prefill(first, &mut kv).unwrap();
    kv.iter_mut().for_each(|c| c.trim(trim).unwrap());
    rows(&model.forward_last(then, &mut kv).unwrap()).remove(0)
}

#[test]
fn trimming_back_into_a_shared_or_indexed_block_never_changes_what_others_read() {
    let (model, _) = load_dir(&fixtures().join("llama-f32")).unwrap();
    let v = model.vocab_size();
    let (p, other) = (prompt(40, 4, v), prompt(12, 6, v));
    let mut paged = PagedCache::new(&model, 16, 16, 3).unwrap();
    paged.set_prefix_caching(true).unwrap();
    let a = paged.add().unwrap();
    paged.step(&model, &[(a, &p)]).unwrap();
    // B starts on A's two full blocks, then trims back into the second and writes other tokens.
    let (b, held) = paged.add_with_prefix(&p[..33], 2048).unwrap();
    assert_eq!(held, 32);
    let free = paged.free_blocks();
    paged.trim(b, 8).unwrap();
    assert_eq!(paged.free_blocks(), free - 1, "the shared block was copied into a free one");
    let got = rows(&paged.step(&model, &[(b, &other)]).unwrap()).remove(0);
    assert_eq!(got, plain(&model, &p, 16, &other));
    // A and a later hit still read A's keys and values.
    let got = rows(&paged.step(&model, &[(a, &[7])]).unwrap()).remove(0);
    assert_eq!(got, plain(&model, &p, 0, &[7]));
    let (c, held) = paged.add_with_prefix(&p[..33], 2048).unwrap();
    assert_eq!(held, 32);
    let got = rows(&paged.step(&model, &[(c, &p[32..40])]).unwrap()).remove(0);
    assert_eq!(got, plain(&model, &p, 8, &p[32..40]));
    paged.remove(c).unwrap();

    // A block only A holds, but indexed, leaves the index before A writes into it again.
    paged.remove(b).unwrap();
    paged.trim(a, 17).unwrap();
    paged.step(&model, &[(a, &other)]).unwrap();
    let (d, held) = paged.add_with_prefix(&p[..33], 2048).unwrap();
    assert_eq!(held, 16, "the rewritten block is no hit");
    let got = rows(&paged.step(&model, &[(d, &p[16..40])]).unwrap()).remove(0);
    assert_eq!(got, plain(&model, &p, 24, &p[16..40]));
}
