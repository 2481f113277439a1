//! The `Batcher` over a model split across real ranks (Open MPI's `mpirun`, CPU ranks): rank 0
//! batches the requests and the other ranks follow its paged cache (`Batcher::follow`); every
//! request gets what `generate` gives it alone on the whole model — mlx-lm's greedy tokens for
//! SmolLM2's oracle prompt, the solo run's tokens for the others, seeded samples included — in a
//! pipeline (its steps as micro-batches) and split by tensors, and a prompt submitted again starts from the prefix cache on
//! every rank alike. Then what such a Batcher refuses, in one process.
#![cfg(feature = "mpi")]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::mpirun::{mpirun, reports, under_mpirun};
use common::*;
use nuvec::distributed::{self, Group};
use nuvec_lm::{
    generate, load_model_pipelined, load_model_sharded, Batcher, BatcherOptions, Event, GenerateOptions, Model,
    RequestId, Sampler, Split,
};

/// How the ranks split the model: `pipeline` or `tensor`.
const MODE: &str = "SPLIT_BATCHER_MODE";

/// The requests: SmolLM2's oracle prompt (greedy, 64 tokens), two prompts of other lengths,
/// one of them sampled with a seed, and the oracle prompt again once the first is done.
fn requests(oracle_prompt: &[u32]) -> Vec<(Vec<u32>, GenerateOptions)> {
    let greedy = |n| GenerateOptions { max_tokens: n, ..Default::default() };
    let sampler = Sampler { temperature: 0.9, top_p: 0.95, ..Default::default() };
    let sampled = GenerateOptions { max_tokens: 20, sampler, seed: Some(3), ignore_eos: true, ..Default::default() };
    vec![
        (oracle_prompt.to_vec(), greedy(64)),
        (seeded_prompt(37, 1, 49_152), greedy(16)),
        (seeded_prompt(5, 2, 49_152), sampled),
    ]
}

fn solo(model: &Model, prompt: &[u32], options: GenerateOptions) -> Vec<u32> {
    generate(model, prompt, options).unwrap().collect::<nuvec_lm::Result<Vec<u32>>>().unwrap()
}

#[test]
fn a_batcher_over_a_split_model_answers_as_the_whole_model() {
    let dir = fixtures().join("smollm2-q4_1");
    let oracle = oracle_json(&dir);
    let prompt = ids(&oracle["prompt_ids"]);
    let whole = nuvec_lm::load_model(&dir).unwrap();
    let expected: Vec<String> =
        requests(&prompt).into_iter().map(|(p, o)| format!("{:?}", solo(&whole, &p, o))).collect();
    assert_eq!(expected[0], format!("{:?}", ids(&oracle["greedy_tokens"])), "the solo run is mlx-lm's");
    // A pipeline's steps of several sequences run as micro-batches: two (one per stage) on two
    // ranks, three on three (every stage's own, then each other stage's in turn).
    for (ranks, mode, micro) in [(2, "pipeline", ""), (3, "pipeline", "3"), (3, "tensor", "")] {
        let env = [(MODE, mode), ("NUVEC_PIPELINE_MICRO_BATCHES", micro)];
        let (out, ok) = mpirun(ranks, "rank_of_a_split_batcher", &env, Duration::from_secs(300));
        assert!(ok, "{mode} over {ranks} ranks:\n{out}");
        assert_eq!(reports(&out, "followed rank 0: ").len(), ranks - 1, "{out}");
        let answers = reports(&out, "request ");
        assert_eq!(answers.len(), 4, "{out}");
        for (i, want) in expected.iter().chain([&expected[0]]).enumerate() {
            assert!(answers.contains(&format!("{i}: {want}").as_str()), "{mode}: request {i} gives {want}:\n{out}");
        }
        let cached = reports(&out, "cached again: ");
        assert!(cached.len() == 1 && cached[0].parse::<usize>().unwrap() >= 16, "a prefix hit on every rank:\n{out}");
    }
}

/// Prompts for the hybrid (Qwen3.5) case, of other lengths: one past a block of 16 positions.
fn hybrid_prompts() -> Vec<Vec<u32>> {
    vec![(0..21).map(|i| 1000 + 37 * i).collect(), vec![5, 6, 7], (0..9).map(|i| 300 + 11 * i).collect()]
}

#[test]
fn a_batcher_over_a_split_hybrid_answers_as_the_whole_model() {
    // Pipelined: each stage a Gated DeltaNet layer (its state in the paged cache's slots) and a
    // gated attention layer; split: every rank a share of each. The prefix cache stays off
    // (each rank's recurrent checkpoints are its own).
    let whole = nuvec_lm::load_model(&fixtures().join("qwen3_5/qwen3_5-f32")).unwrap();
    let greedy = GenerateOptions { max_tokens: 16, ignore_eos: true, ..Default::default() };
    for mode in ["hybrid", "hybrid-tensor"] {
        let (out, ok) = mpirun(2, "rank_of_a_split_batcher", &[(MODE, mode)], Duration::from_secs(120));
        assert!(ok, "{mode}: {out}");
        let answers = reports(&out, "request ");
        for (i, p) in hybrid_prompts().iter().enumerate() {
            let want = format!("{i}: {:?}", solo(&whole, p, greedy.clone()));
            assert!(answers.contains(&want.as_str()), "{mode}: request {want}:\n{out}");
        }
        assert_eq!(reports(&out, "prefix cache: ").concat(), "false", "{out}");
    }
}

/// Steps `batcher` until idle: each request's tokens, and the cached tokens it started with.
fn drain(batcher: &mut Batcher) -> BTreeMap<RequestId, (Vec<u32>, usize)> {
    let mut out: BTreeMap<RequestId, (Vec<u32>, usize)> = BTreeMap::new();
    while batcher.is_busy() {
        for event in batcher.step().unwrap() {
            match event {
                Event::Token { id, token } => out.entry(id).or_default().0.push(token),
                Event::Started { id, cached_tokens } => out.entry(id).or_default().1 = cached_tokens,
                Event::Failed { id, error } => panic!("{id:?} failed: {error}"),
                _ => {}
            }
        }
    }
    out
}

#[test]
#[ignore = "a rank of a_batcher_over_a_split_model_answers_as_the_whole_model, under mpirun"]
fn rank_of_a_split_batcher() {
    if !under_mpirun() {
        return;
    }
    let dir = fixtures().join("smollm2-q4_1");
    let group = distributed::init(true).unwrap();
    let mode = std::env::var(MODE).unwrap();
    let model = match mode.as_str() {
        "pipeline" => load_model_pipelined(&dir, &group, Split::Even).unwrap(),
        "hybrid" => load_model_pipelined(&fixtures().join("qwen3_5/qwen3_5-f32"), &group, Split::Even).unwrap(),
        "hybrid-tensor" => load_model_sharded(&fixtures().join("qwen3_5/qwen3_5-f32"), &group).unwrap(),
        _ => load_model_sharded(&dir, &group).unwrap(),
    };
    if group.rank() != 0 {
        Batcher::follow(&model).unwrap();
        println!("followed rank 0: rank {}", group.rank());
        return;
    }
    if mode.starts_with("hybrid") {
        let mut batcher = Batcher::new(&model, BatcherOptions { max_batch: 4, ..Default::default() }).unwrap();
        println!("prefix cache: {}", batcher.prefix_caching());
        let greedy = GenerateOptions { max_tokens: 16, ignore_eos: true, ..Default::default() };
        let ids: Vec<RequestId> =
            hybrid_prompts().into_iter().map(|p| batcher.submit(p, greedy.clone()).unwrap()).collect();
        let out = drain(&mut batcher);
        for (i, id) in ids.iter().enumerate() {
            println!("request {i}: {:?}", out[id].0);
        }
        return;
    }
    let prompt = ids(&oracle_json(&dir)["prompt_ids"]);
    let options = BatcherOptions { max_batch: 4, ..Default::default() };
    let mut batcher = Batcher::new(&model, options).unwrap();
    let mut ids = vec![];
    for (p, o) in requests(&prompt) {
        ids.push(batcher.submit(p, o).unwrap());
    }
    let mut out = drain(&mut batcher);
    let again = batcher.submit(prompt, GenerateOptions { max_tokens: 64, ..Default::default() }).unwrap();
    ids.push(again);
    out.append(&mut drain(&mut batcher));
    for (i, id) in ids.iter().enumerate() {
        println!("request {i}: {:?}", out[id].0);
    }
    println!("cached again: {}", out[&again].1);
}

#[test]
fn what_a_batcher_over_a_split_model_refuses_is_named() {
    if under_mpirun() {
        return;
    }
    let dir = fixtures().join("llama-q4g64");
    let staged = load_model_pipelined(&dir, &Group::alone(), Split::Even).unwrap();
    let prompt = [1, 15, 27, 3];
    let greedy = GenerateOptions { max_tokens: 8, ignore_eos: true, ..Default::default() };
    let mut batcher = Batcher::new(&staged, BatcherOptions { blocks: Some(8), ..Default::default() }).unwrap();
    let id = batcher.submit(prompt.to_vec(), greedy.clone()).unwrap();
    let mut tokens = vec![];
    while batcher.is_busy() {
        for event in batcher.step().unwrap() {
            if let Event::Token { id: i, token } = event {
                assert_eq!(i, id);
                tokens.push(token);
            }
        }
    }
    let whole = nuvec_lm::load_model(&dir).unwrap();
    assert_eq!(tokens, solo(&whole, &prompt, greedy), "a pipeline of one rank batches as the whole model");
    drop(batcher);
    let e = Batcher::follow(&staged).unwrap_err().to_string();
    assert!(e.contains("Batcher::follow on rank 0"), "{e}");
    let e = Batcher::follow(&whole).unwrap_err().to_string();
    assert!(e.contains("not split across ranks"), "{e}");
    let pipelined = BatcherOptions { pipeline: Some(true), ..Default::default() };
    let e = Batcher::new(&staged, pipelined).map(drop).unwrap_err().to_string();
    assert!(e.contains("pipeline = Some(true) over a model split across ranks"), "{e}");
    let hybrid = load_model_pipelined(&fixtures().join("qwen3_5/qwen3_5-f32"), &Group::alone(), Split::Even).unwrap();
    let cached = BatcherOptions { prefix_cache: Some(true), ..Default::default() };
    let e = Batcher::new(&hybrid, cached).map(drop).unwrap_err().to_string();
    assert!(e.contains("prefix_cache = Some(true) over a qwen3_5 model split across ranks"), "{e}");
    assert!(!Batcher::new(&hybrid, Default::default()).unwrap().prefix_caching());
    let speculating = BatcherOptions { speculation: Some(Default::default()), ..Default::default() };
    let e = Batcher::with_draft(&staged, &whole, speculating).map(drop).unwrap_err().to_string();
    assert!(e.contains("speculative decoding on a model split across ranks"), "{e}");
}
