//! Speculative decoding on the families whose caches forget: sliding windows (gpt-oss, Gemma 4,
//! any model under `max_kv_size`) and recurrent state (the Qwen3.5 hybrids). A proposer that
//! knows mlx-lm's greedy answer guesses it with deliberate mistakes (and now and then guesses
//! nothing), so passes are accepted whole, cut short and taken back at every position, across
//! the window's wrap; every answer must still be mlx-lm's, token for token.

mod common;

use std::path::Path;

use common::scripted::Scripted;
use common::{fixtures, ids, oracle_json};
use nuvec_lm::cache::CacheOptions;
use nuvec_lm::speculative::{speculative_generate, DraftModel, Proposer, SpeculativeStats};
use nuvec_lm::{generate, GenerateOptions, Model};

fn run<P: Proposer>(
    model: &Model,
    prompt: &[u32],
    options: GenerateOptions,
    proposer: P,
    k: usize,
) -> (Vec<u32>, SpeculativeStats) {
    let mut g = speculative_generate(model, prompt, options, proposer, k).unwrap();
    let tokens = g.by_ref().collect::<nuvec_lm::Result<Vec<u32>>>().unwrap();
    (tokens, g.stats().clone())
}

fn case(name: &str) -> (std::path::PathBuf, Vec<u32>, Vec<u32>) {
    let dir = fixtures().join(name);
    let oracle = oracle_json(&dir);
    (dir.clone(), ids(&oracle["prompt_ids"]), ids(&oracle["greedy_tokens"]))
}

fn load(dir: &Path) -> Model {
    nuvec_lm::load(dir.to_str().unwrap()).unwrap().0
}

/// mlx-lm's greedy answer, with guesses accepted and rejected at every draft position.
fn answers_like_mlx_lm(name: &str) {
    let (dir, prompt, want) = case(name);
    let model = load(&dir);
    let options = GenerateOptions { max_tokens: want.len(), ..Default::default() };
    for k in [1, 3, 5] {
        let proposer = Scripted::new(&want, prompt.len());
        let (got, stats) = run(&model, &prompt, options.clone(), proposer, k);
        println!("RESULT {name} k={k}: {} steps, {}/{} guesses taken", stats.steps, stats.accepted, stats.drafted);
        assert_eq!(got, want, "{name}, k={k}: speculative decoding left mlx-lm's answer");
        assert!(stats.accepted > want.len() / 3, "{name}, k={k}: too few guesses taken: {stats:?}");
        assert!(stats.drafted > stats.accepted, "{name}, k={k}: no guess was rejected: {stats:?}");
    }
}

#[test]
fn gpt_oss_sliding_window_answers_like_mlx_lm() {
    answers_like_mlx_lm("gpt_oss/gpt_oss-f32");
}

#[test]
fn gemma4_sliding_window_answers_like_mlx_lm() {
    answers_like_mlx_lm("gemma4/gemma4-f32");
}

#[test]
fn qwen3_5_recurrent_layers_answer_like_mlx_lm() {
    answers_like_mlx_lm("qwen3_5/qwen3_5-f32");
    answers_like_mlx_lm("qwen3_5/qwen3_5_moe-f32");
}

/// `max_kv_size` makes every cache a ring (here of 16 positions, 4 of them pinned): the answer
/// is the one plain decoding gives under the same bound (mlx-lm has no record of it), across
/// the wrap.
#[test]
fn a_bounded_cache_gives_plain_decodings_tokens() {
    let (dir, prompt, _) = case("llama-f32");
    let model = load(&dir);
    let options = GenerateOptions {
        max_tokens: 48,
        cache: CacheOptions { max_kv_size: Some(16), keep: 4, ..Default::default() },
        ..Default::default()
    };
    let want = generate(&model, &prompt, options.clone()).unwrap().collect::<nuvec_lm::Result<Vec<u32>>>().unwrap();
    for k in [2, 4] {
        let proposer = Scripted::new(&want, prompt.len());
        let (got, stats) = run(&model, &prompt, options.clone(), proposer, k);
        assert_eq!(got, want, "k={k}");
        assert!(stats.accepted > 0 && stats.drafted > stats.accepted, "k={k}: {stats:?}");
    }
}

/// A hybrid as its own draft: its recurrent layers take back the guesses the target rejects
/// (the target samples, the draft guesses greedily), and greedy guesses are all taken.
#[test]
fn a_hybrid_draft_model_rewinds_its_recurrent_state() {
    let (dir, prompt, want) = case("qwen3_5/qwen3_5-f32");
    let (target, draft) = (load(&dir), load(&dir));
    let greedy = GenerateOptions { max_tokens: want.len(), ..Default::default() };
    let (got, stats) = run(&target, &prompt, greedy, DraftModel::new(&draft, 512).unwrap(), 3);
    assert_eq!(got, want, "a greedy draft of the same model");
    assert_eq!(stats.accepted, stats.drafted, "{stats:?}");
    let sampled = GenerateOptions {
        max_tokens: 40,
        sampler: nuvec_lm::Sampler { temperature: 1.5, ..Default::default() },
        seed: Some(11),
        ..Default::default()
    };
    let plain = generate(&target, &prompt, sampled.clone()).unwrap().collect::<nuvec_lm::Result<Vec<u32>>>().unwrap();
    let (got, stats) = run(&target, &prompt, sampled, DraftModel::new(&draft, 512).unwrap(), 3);
    assert_eq!(got, plain, "seeded sampling");
    assert!(stats.drafted > stats.accepted, "some guesses rejected, so the draft rewound: {stats:?}");
}

/// A draft model whose guesses must be what a fresh copy of it, given the same history, would
/// guess: its cache, rewound after every rejection, must hold exactly what it held before.
struct Checked<'a> {
    draft: DraftModel<'a>,
    model: &'a Model,
}

impl Proposer for Checked<'_> {
    fn propose(&mut self, history: &[u32], k: usize) -> nuvec_lm::Result<Vec<u32>> {
        let guesses = self.draft.propose(history, k)?;
        let fresh = DraftModel::new(self.model, 512)?.propose(history, k)?;
        assert_eq!(guesses, fresh, "the draft's guesses after {} tokens of history", history.len());
        Ok(guesses)
    }
}

/// Sliding-window models (gpt-oss, Gemma 4: windows of 8, wrapped by the prompt) as their own
/// drafts. Greedy, every guess is taken and the answer is mlx-lm's. Under a sampling target many
/// guesses are rejected, and the guesses the draft decoded one at a time into its rings are taken
/// back: every proposal must be the one a fresh draft makes from the same history.
#[test]
fn a_sliding_window_draft_model_takes_back_its_guesses() {
    for name in ["gpt_oss/gpt_oss-f32", "gemma4/gemma4-f32"] {
        let (dir, prompt, want) = case(name);
        let (target, draft) = (load(&dir), load(&dir));
        let greedy = GenerateOptions { max_tokens: want.len(), ..Default::default() };
        let (got, stats) = run(&target, &prompt, greedy, DraftModel::new(&draft, 512).unwrap(), 3);
        assert_eq!(got, want, "{name}: a greedy draft of the same model");
        assert_eq!(stats.accepted, stats.drafted, "{name}: {stats:?}");
        for k in [2, 4] {
            let sampled = GenerateOptions {
                max_tokens: 40,
                sampler: nuvec_lm::Sampler { temperature: 0.8, ..Default::default() },
                seed: Some(11 + k as u64),
                ..Default::default()
            };
            let checked = Checked { draft: DraftModel::new(&draft, 512).unwrap(), model: &draft };
            let (got, stats) = run(&target, &prompt, sampled, checked, k);
            println!("RESULT {name} sampled, k={k}: {}/{} guesses taken", stats.accepted, stats.drafted);
            assert_eq!(got.len(), 40);
            assert!(stats.drafted > stats.accepted && stats.accepted > 0, "{name}, k={k}: {stats:?}");
        }
    }
}
