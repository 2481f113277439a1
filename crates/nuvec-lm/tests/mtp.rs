//! Qwen3.5's multi-token-prediction head (`mtp.*`), loaded with `LoadOptions::mtp` and run as a
//! speculative-decoding proposer. mlx-lm has no code for the head: the reference is
//! scripts/oracle/more/qwen3_5_mtp.py, which builds it from mlx-lm's Qwen3.5 decoder block as
//! vLLM and llama.cpp run it, on a Hugging Face-layout checkpoint with a random head. The head's
//! logits and chained guesses must be the reference's; its proposer must keep the same guesses
//! whatever the target accepted before; and speculation with it must give mlx-lm's greedy answer.
//! A sampling head draws each guess from the distribution it reports for the rejection rule.

mod common;

use std::path::{Path, PathBuf};

use common::scripted::Scripted;
use common::{fixtures, ids, oracle_json, rows_of};
use nuvec_lm::sample::log_softmax;
use nuvec_lm::speculative::{speculative_generate, MtpHead, Proposer, SpeculativeStats};
use nuvec_lm::{generate, GenerateOptions, LoadOptions, Model, Sampler};
use rand::SeedableRng;
use serde_json::Value;

/// A case's folder (its records) and what loads it (the folder, or its model.gguf).
fn case(name: &str) -> (PathBuf, PathBuf) {
    if name.starts_with("gguf") {
        let dir = fixtures().join(name);
        return (dir.clone(), dir.join("model.gguf"));
    }
    let dir = fixtures().join("qwen3_5_mtp").join(name);
    (dir.clone(), dir)
}

fn load_mtp(path: &Path) -> Model {
    let options = LoadOptions { mtp: true, ..Default::default() };
    nuvec_lm::load_with(path.to_str().unwrap(), &options).unwrap().0
}

/// The error of loading `path` with its head (`what`: why it must fail).
fn load_error(path: &Path, what: &str) -> String {
    let options = LoadOptions { mtp: true, ..Default::default() };
    match nuvec_lm::load_with(path.to_str().unwrap(), &options) {
        Ok(_) => panic!("{}: {what}", path.display()),
        Err(e) => e.to_string(),
    }
}

fn mtp_json(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("mtp.json")).unwrap()).unwrap()
}

/// The target's final hidden states of `tokens`, from a fresh cache in one pass.
fn target_hidden(model: &Model, tokens: &[u32]) -> nuvec::Array {
    let mut cache = model.new_cache();
    model.prefill_hidden(tokens, &mut cache).unwrap()
}

/// Top-1 equal where the reference's top-2 gap is clear, and the reference's best logits within
/// `tol` of ours.
fn check_row(what: &str, row: &[f32], ids: &[u32], values: &[f32], tol: f32) {
    let best = row.iter().enumerate().fold(0, |b, (i, &v)| if v > row[b] { i } else { b });
    if values[0] - values[1] > 1e-3 {
        assert_eq!(best as u32, ids[0], "{what}: top token");
    }
    for (&id, &v) in ids.iter().zip(values) {
        let got = row[id as usize];
        assert!((got - v).abs() <= tol * (1.0 + v.abs()), "{what}: logit of {id} is {got}, the reference's {v}");
    }
}

fn logits_match(name: &str, tol: f32) {
    let (dir, path) = case(name);
    let model = load_mtp(&path);
    let rec = mtp_json(&dir);
    let seq = ids(&rec["sequence"]);
    let hidden = target_hidden(&model, &seq[..seq.len() - 1]);
    let mut cache = model.new_mtp_cache().unwrap();
    let out = model.mtp_hidden(&seq[1..], &hidden, &mut cache).unwrap();
    let rows = rows_of(&model.logits(&out).unwrap());
    let (want_ids, want_values) = (&rec["positions"]["ids"], &rec["positions"]["values"]);
    assert_eq!(rows.len(), seq.len() - 1);
    for (i, row) in rows.iter().enumerate() {
        let ids = ids(&want_ids[i]);
        let values: Vec<f32> = want_values[i].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        check_row(&format!("{name}, position {i}"), row, &ids, &values, tol);
    }
}

#[test]
fn dense_head_logits_are_the_reference() {
    logits_match("qwen3_5-mtp", 1e-3);
}

#[test]
fn moe_head_logits_are_the_reference() {
    logits_match("qwen3_5_moe-mtp", 1e-3);
}

/// llama.cpp's converter keeps the head as a block past the decoder's (`blk.4.*`, `nextn.*`).
#[test]
fn gguf_head_logits_are_the_reference() {
    logits_match("gguf-qwen35-mtp", 1e-3);
}

/// The proposer, fed the target's hidden states of a history's positions, guesses what the
/// reference's chain guesses (up to where a guess hinges on a near tie).
fn chains_match(name: &str) {
    let (dir, path) = case(name);
    let model = load_mtp(&path);
    let rec = mtp_json(&dir);
    let seq = ids(&rec["sequence"]);
    for chain in rec["chains"].as_array().unwrap() {
        let start = chain["start"].as_u64().unwrap() as usize;
        let want = ids(&chain["guesses"]);
        let margins: Vec<f64> = chain["margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap()).collect();
        let mut head = MtpHead::new(&model).unwrap();
        head.observe(0, &target_hidden(&model, &seq[..=start])).unwrap();
        let got = head.propose(&seq[..start + 2], want.len()).unwrap();
        println!("RESULT {name} from {start}: {got:?} (reference {want:?}, margins {margins:?})");
        let sure = margins.iter().take_while(|&&m| m > 1e-3).count();
        assert_eq!(got.len(), want.len());
        assert_eq!(got[..sure], want[..sure], "{name}: the chain from position {start}");
    }
}

#[test]
fn dense_head_chains_are_the_reference() {
    chains_match("qwen3_5-mtp");
}

#[test]
fn moe_head_chains_are_the_reference() {
    chains_match("qwen3_5_moe-mtp");
}

#[test]
fn gguf_head_chains_are_the_reference() {
    chains_match("gguf-qwen35-mtp");
}

/// `MtpHead::sampling`: a proposal's guesses are drawn, each from the distribution the head
/// reports for it (`drawn_from`, what the rejection rule divides by), and that distribution is
/// the sampler's over the head's own logits along the chain it drew, recomputed here position by
/// position; one seed draws one chain, and seeds draw several; a greedy sampler reports none and
/// picks what `MtpHead::new` picks.
#[test]
fn a_sampling_head_draws_from_the_distributions_it_reports() {
    let (dir, path) = case("qwen3_5-mtp");
    let model = load_mtp(&path);
    let seq = ids(&mtp_json(&dir)["sequence"]);
    let start = seq.len() / 2;
    let history = &seq[..start + 2];
    let hidden = target_hidden(&model, &seq[..=start]);
    let sampler = Sampler { temperature: 1.0, top_k: 20, ..Default::default() };
    let propose = |sampler: &Sampler, seed: u64| {
        let mut head = MtpHead::sampling(&model, sampler.clone(), Some(seed)).unwrap();
        head.observe(0, &hidden).unwrap();
        let chain = head.propose(history, 4).unwrap();
        (chain, head.drawn_from().map(<[Vec<f64>]>::to_vec))
    };
    let (chain, drawn) = propose(&sampler, 3);
    let drawn = drawn.expect("a sampling head reports the distributions it drew from");
    assert_eq!((chain.len(), drawn.len()), (4, 4));
    let mut cache = model.new_mtp_cache().unwrap();
    let out = model.mtp_hidden(&history[1..], &hidden, &mut cache).unwrap();
    let mut h = out.slice_rows(out.dim(0) - 1, out.dim(0)).unwrap();
    for (i, &guess) in chain.iter().enumerate() {
        let mut logprobs = log_softmax(&rows_of(&model.logits(&h).unwrap())[0]);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let want = sampler.distribution(&mut logprobs, &[], &mut rng).unwrap();
        let worst = want.iter().zip(&drawn[i]).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(worst < 1e-12, "guess {i}: the reported distribution is off by {worst}");
        assert!(drawn[i][guess as usize] > 0.0, "guess {i} ({guess}) lies outside its distribution");
        h = model.mtp_hidden(&[guess], &h, &mut cache).unwrap();
    }
    assert_eq!(propose(&sampler, 3).0, chain, "one seed, one chain");
    let chains: std::collections::HashSet<Vec<u32>> = (0..8).map(|seed| propose(&sampler, seed).0).collect();
    assert!(chains.len() > 1, "eight seeds drew one chain: {chains:?}");
    let (picked, reported) = propose(&Sampler::default(), 3);
    let mut greedy = MtpHead::new(&model).unwrap();
    greedy.observe(0, &hidden).unwrap();
    assert_eq!(picked, greedy.propose(history, 4).unwrap(), "a greedy sampler picks");
    assert!(reported.is_none(), "picked guesses report no distribution");
}

/// Checks `got`, a head's guesses after `history` (shown the target's hidden states from
/// position `base` on), against a fresh head's over the same positions, computed at once: equal
/// up to the first that differs, which must be a near tie of the fresh head's logits.
fn check_proposal(model: &Model, history: &[u32], base: usize, got: &[u32]) {
    let hidden = target_hidden(model, &history[..history.len() - 1]);
    let shown = hidden.slice_rows(base, hidden.dim(0)).unwrap();
    let mut fresh = MtpHead::new(model).unwrap();
    fresh.observe(base, &shown).unwrap();
    let want = fresh.propose(history, got.len()).unwrap();
    let same = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
    if same < want.len() {
        let mut cache = model.new_mtp_cache().unwrap();
        let out = model.mtp_hidden(&history[base + 1..], &shown, &mut cache).unwrap();
        let mut h = out.slice_rows(out.dim(0) - 1, out.dim(0)).unwrap();
        for (i, &g) in want.iter().enumerate() {
            let row = &rows_of(&model.logits(&h).unwrap())[0];
            if i == same {
                let mut sorted = row.clone();
                sorted.sort_by(|a, b| b.total_cmp(a));
                assert!(sorted[0] - sorted[1] < 1e-3, "guess {i} of {got:?} is not a fresh head's {want:?}");
                break;
            }
            h = model.mtp_hidden(&[g], &h, &mut cache).unwrap();
        }
    }
}

/// Wraps the head: each proposal the head makes after the target's verified passes must equal
/// the one a fresh head makes over the whole history at once; the guesses handed to the target
/// are mlx-lm's answer with deliberate mistakes, so the passes keep every count of guesses.
struct Checked<'a> {
    head: MtpHead<'a>,
    model: &'a Model,
    script: Scripted,
}

impl Proposer for Checked<'_> {
    fn wants_hidden(&self) -> bool {
        true
    }

    fn observe(&mut self, first: usize, hidden: &nuvec::Array) -> nuvec_lm::Result<()> {
        self.head.observe(first, hidden)
    }

    fn propose(&mut self, history: &[u32], k: usize) -> nuvec_lm::Result<Vec<u32>> {
        let got = self.head.propose(history, k)?;
        check_proposal(self.model, history, 0, &got);
        assert_eq!(got.len(), k, "the head stopped guessing");
        // What the target is handed: the answer with deliberate mistakes.
        self.script.propose(history, k)
    }
}

fn run<P: Proposer>(model: &Model, prompt: &[u32], max: usize, proposer: P, k: usize) -> (Vec<u32>, SpeculativeStats) {
    let options = GenerateOptions { max_tokens: max, prefill_step_size: 5, ..Default::default() };
    let mut g = speculative_generate(model, prompt, options, proposer, k).unwrap();
    let tokens = g.by_ref().collect::<nuvec_lm::Result<Vec<u32>>>().unwrap();
    (tokens, g.stats().clone())
}

#[test]
fn head_follows_every_acceptance_count() {
    let (dir, path) = case("qwen3_5-mtp");
    let model = load_mtp(&path);
    let oracle = oracle_json(&dir);
    let (prompt, want) = (ids(&oracle["prompt_ids"]), ids(&oracle["greedy_tokens"]));
    let want = &want[..24];
    for k in [1, 3] {
        let head = MtpHead::new(&model).unwrap();
        let checked = Checked { head, model: &model, script: Scripted::new(want, prompt.len()) };
        let mut g = speculative_generate(
            &model,
            &prompt,
            GenerateOptions { max_tokens: want.len(), prefill_step_size: 5, ..Default::default() },
            checked,
            k,
        )
        .unwrap();
        let got = g.by_ref().collect::<nuvec_lm::Result<Vec<u32>>>().unwrap();
        let stats = g.stats().clone();
        println!("RESULT k={k}: {} steps, {}/{} taken", stats.steps, stats.accepted, stats.drafted);
        assert_eq!(got, want, "k={k}");
        assert!(stats.accepted > 0 && stats.drafted > stats.accepted, "k={k}: {stats:?}");
    }
}

#[test]
fn speculation_with_the_head_answers_like_mlx_lm() {
    for name in ["qwen3_5-mtp", "qwen3_5_moe-mtp", "gguf-qwen35-mtp"] {
        let (dir, path) = case(name);
        let model = load_mtp(&path);
        let oracle = oracle_json(&dir);
        let (prompt, want) = (ids(&oracle["prompt_ids"]), ids(&oracle["greedy_tokens"]));
        for k in [1, 2, 4] {
            let (got, stats) = run(&model, &prompt, want.len(), MtpHead::new(&model).unwrap(), k);
            println!("RESULT {name} k={k}: {} steps, {}/{} guesses taken", stats.steps, stats.accepted, stats.drafted);
            assert_eq!(got, want, "{name}, k={k}");
            assert!(stats.drafted > 0, "{name}, k={k}: the head guessed nothing: {stats:?}");
        }
        // The head loaded beside the model changes nothing of its own answer.
        let plain = generate(&model, &prompt, GenerateOptions { max_tokens: want.len(), ..Default::default() })
            .unwrap()
            .collect::<nuvec_lm::Result<Vec<u32>>>()
            .unwrap();
        assert_eq!(plain, want, "{name}: plain decoding with the head loaded");
    }
}

#[test]
fn a_missing_head_is_an_error_naming_the_fix() {
    // The Hugging Face original without its head, and mlx-lm's conversion of it.
    for dir in [fixtures().join("qwen3_5/qwen3_5-hf"), fixtures().join("qwen3_5/qwen3_5-f32")] {
        let err = load_error(&dir, "a checkpoint without mtp.* loaded with its head");
        assert!(err.contains("no multi-token-prediction head") && err.contains("draft model"), "{err}");
    }
    // Another family.
    let llama = fixtures().join("llama-f32");
    let err = load_error(&llama, "a llama checkpoint loaded with a head");
    assert!(err.contains("no multi-token-prediction head nuvec runs"), "{err}");
    // A GGUF converted without it (gguf-qwen35), and one of another family.
    for file in [fixtures().join("gguf-qwen35/model.gguf"), common::default_gguf()] {
        let err = load_error(&file, "a GGUF without a nextn block loaded with its head");
        assert!(err.contains("multi-token-prediction head"), "{err}");
    }
    // Models loaded without their heads: the head's block is skipped.
    for name in ["qwen3_5-mtp", "gguf-qwen35-mtp"] {
        let (dir, path) = case(name);
        let model = nuvec_lm::load(path.to_str().unwrap()).unwrap().0;
        assert!(!model.has_mtp());
        let err = MtpHead::new(&model).err().expect("a head over a model without one").to_string();
        assert!(err.contains("LoadOptions::mtp") && err.contains("--mtp"), "{err}");
        let oracle = oracle_json(&dir);
        let (prompt, want) = (ids(&oracle["prompt_ids"]), ids(&oracle["greedy_tokens"]));
        let plain = generate(&model, &prompt, GenerateOptions { max_tokens: want.len(), ..Default::default() })
            .unwrap()
            .collect::<nuvec_lm::Result<Vec<u32>>>()
            .unwrap();
        assert_eq!(plain, want, "{name} without its head");
    }
}

/// The head in the Batcher (`Batcher::with_mtp`): requests of several kinds (greedy, seeded
/// sampling, log-probabilities, one longer than a step's budget, and after a first request one
/// whose prompt starts with that one's, so its head starts after the cached blocks) hand out
/// their solo tokens, and every proposal the Batcher's heads made is the one a fresh head makes
/// over the same history from the same first position.
#[test]
fn the_head_in_the_batcher_leaves_the_solo_tokens() {
    use nuvec_lm::{BatchSpeculation, Batcher, BatcherOptions, Event, Sampler};
    for name in ["qwen3_5-mtp", "gguf-qwen35-mtp"] {
        let (_, path) = case(name);
        let model = load_mtp(&path);
        let v = model.vocab_size();
        let greedy = |n: usize| GenerateOptions { max_tokens: n, ..Default::default() };
        let sampled = GenerateOptions {
            max_tokens: 16,
            seed: Some(9),
            sampler: Sampler { temperature: 0.3, ..Default::default() },
            ..Default::default()
        };
        let first = common::seeded_prompt(40, 1, v);
        let shared = [&first[..36], &common::seeded_prompt(6, 7, v)].concat();
        let rounds = vec![
            vec![(first, greedy(12))],
            vec![
                (shared, greedy(14)),
                (common::seeded_prompt(12, 2, v), greedy(9)),
                (common::seeded_prompt(20, 3, v), sampled),
                (common::seeded_prompt(7, 4, v), GenerateOptions { logprobs: Some(2), ..greedy(10) }),
                (common::seeded_prompt(90, 5, v), greedy(12)),
            ],
        ];
        let speculation =
            BatchSpeculation { num_draft: 3, max_decodes: Some(8), min_acceptance: 0.0, ..Default::default() };
        let options = BatcherOptions {
            blocks: Some(256),
            block_size: 16,
            token_budget: Some(64),
            // Recurrent states kept every block, so that the second round's prompt gets a hit.
            checkpoint_interval: 16,
            speculation: Some(speculation),
            ..Default::default()
        };
        let mut batcher = Batcher::with_mtp(&model, options).unwrap();
        batcher.record_mtp_proposals();
        let mut cached = vec![];
        for requests in &rounds {
            let ids: Vec<_> = requests.iter().map(|(p, o)| batcher.submit(p.clone(), o.clone()).unwrap()).collect();
            let mut got: std::collections::BTreeMap<_, Vec<u32>> = Default::default();
            while batcher.is_busy() {
                for event in batcher.step().unwrap() {
                    match event {
                        Event::Token { id, token } => got.entry(id).or_default().push(token),
                        Event::Started { cached_tokens, .. } => cached.push(cached_tokens),
                        Event::Failed { id, error } => panic!("{id:?} failed: {error}"),
                        _ => {}
                    }
                }
            }
            for (i, ((prompt, options), id)) in requests.iter().zip(&ids).enumerate() {
                let want =
                    generate(&model, prompt, options.clone()).unwrap().collect::<nuvec_lm::Result<Vec<u32>>>().unwrap();
                assert_eq!(got.remove(id).unwrap_or_default(), want, "{name}: request {i}");
            }
        }
        assert!(cached.iter().any(|&c| c > 0), "{name}: a prompt began in cached blocks: {cached:?}");
        let stats = batcher.stats();
        let proposals = batcher.mtp_proposals();
        println!(
            "RESULT {name}: {} guessed, {} right, {} proposals, bases {:?}",
            stats.drafted_tokens,
            stats.accepted_tokens,
            proposals.len(),
            proposals.iter().map(|p| p.1).filter(|&b| b > 0).collect::<std::collections::BTreeSet<_>>()
        );
        assert!(stats.drafted_tokens > 20 && !proposals.is_empty(), "{name}: {stats:?}");
        // Heads start at 0, or where a prompt's cached blocks end: never anywhere else (a head
        // that lost its place and started afresh).
        assert!(proposals.iter().any(|p| p.1 > 0), "{name}: a head started after cached blocks");
        assert!(proposals.iter().all(|p| p.1 == 0 || cached.contains(&p.1)), "{name}: bases vs hits {cached:?}");
        for (history, base, guesses) in proposals {
            check_proposal(&model, history, *base, guesses);
        }
        assert_eq!(stats.blocks_used, 0, "{name}: every block back");
    }
    // What the head needs.
    let (_, path) = case("qwen3_5-mtp");
    let plain = nuvec_lm::load(path.to_str().unwrap()).unwrap().0;
    let on = BatcherOptions { blocks: Some(64), speculation: Some(BatchSpeculation::default()), ..Default::default() };
    let err = Batcher::with_mtp(&plain, on).err().unwrap().to_string();
    assert!(err.contains("LoadOptions::mtp"), "{err}");
    let model = load_mtp(&path);
    let err = Batcher::with_mtp(&model, BatcherOptions { blocks: Some(64), ..Default::default() }).err().unwrap();
    assert!(err.to_string().contains("speculation"), "{err}");
}
