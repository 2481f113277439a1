//! Pipeline parallelism over real ranks (Open MPI's `mpirun`, CPU ranks): each rank reads only its
//! stage's tensors, and every rank generates mlx-lm's greedy tokens (SmolLM2's real weights), and
//! the solo run's sampled tokens with a seed and without one; gpt-oss and the Qwen3.5 hybrids
//! pipelined generate the whole model's tokens. Then what a pipeline refuses.
#![cfg(feature = "mpi")]

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::mpirun::{mpirun, reports, under_mpirun};
use common::*;
use nuvec::distributed::{self, Group};
use nuvec_lm::{
    generate, load_with, FinishReason, GenerateOptions, LoadOptions, LoadProgress, Pipeline, Sampler, Split,
};

/// The split the ranks load with (`even`, or counts).
const SPLIT: &str = "PIPELINE_TEST_SPLIT";

fn sampled(seed: Option<u64>) -> GenerateOptions {
    let sampler = Sampler { temperature: 0.9, top_p: 0.95, ..Default::default() };
    GenerateOptions { max_tokens: 24, sampler, seed, ignore_eos: true, ..Default::default() }
}

fn tokens(model: &nuvec_lm::Model, prompt: &[u32], options: GenerateOptions) -> Vec<u32> {
    generate(model, prompt, options).unwrap().collect::<nuvec_lm::Result<Vec<u32>>>().unwrap()
}

#[test]
fn every_rank_of_a_pipeline_generates_the_solo_tokens() {
    let dir = fixtures().join("smollm2-q4_1");
    let oracle = oracle_json(&dir);
    let prompt = ids(&oracle["prompt_ids"]);
    let (model, _) = nuvec_lm::load(dir.to_str().unwrap()).unwrap();
    let solo = format!("{:?}", tokens(&model, &prompt, sampled(Some(5))));
    // Two stages of 15 layers; three uneven ones (rank 0 last: 10, 12, 8).
    for (ranks, split) in [(2, "even"), (3, "10,12,8")] {
        let (out, ok) = mpirun(ranks, "rank_of_a_pipeline", &[(SPLIT, split)], Duration::from_secs(300));
        assert!(ok, "{ranks} ranks, split {split}:\n{out}");
        assert_eq!(reports(&out, "greedy as mlx-lm: ").len(), ranks, "{out}");
        let seeded = reports(&out, "with a seed: ");
        assert_eq!(seeded.len(), ranks, "{out}");
        assert!(seeded.iter().all(|s| *s == solo), "every rank samples the solo run's tokens {solo}:\n{out}");
        let unseeded = reports(&out, "without a seed: ");
        assert_eq!(unseeded.len(), ranks, "{out}");
        assert!(unseeded.iter().all(|s| *s == unseeded[0]), "every rank draws rank 0's seed:\n{out}");
    }
}

/// Tensors of `dir`'s checkpoint that rank `rank`'s stage (`layers`) holds: its layers', the
/// embeddings on the first stage, the final norm (and the tied embeddings) on rank 0.
fn stage_tensors(dir: &Path, stage: &nuvec_lm::Stage) -> usize {
    let file = nuvec::io::SafetensorsFile::open(dir.join("model.safetensors")).unwrap();
    let layers = stage.layers();
    file.tensors()
        .keys()
        .filter(|name| {
            if let Some(rest) = name.strip_prefix("model.layers.") {
                return layers.contains(&rest.split('.').next().unwrap().parse::<usize>().unwrap());
            }
            let embeddings = name.starts_with("model.embed_tokens.");
            (embeddings && (stage.embeds() || stage.has_head()))
                || (name.starts_with("model.norm.") && stage.has_head())
        })
        .count()
}

#[test]
#[ignore = "a rank of every_rank_of_a_pipeline_generates_the_solo_tokens, under mpirun"]
fn rank_of_a_pipeline() {
    if !under_mpirun() {
        return;
    }
    let dir = fixtures().join("smollm2-q4_1");
    let oracle = oracle_json(&dir);
    let group = distributed::init(true).unwrap();
    let split = Split::parse(&std::env::var(SPLIT).unwrap()).unwrap();
    // Each first read of a tensor reports the count so far; the load's end reports them all.
    let reports = Arc::new(Mutex::new(vec![]));
    let seen = reports.clone();
    let progress = LoadProgress(Arc::new(move |done, _| seen.lock().unwrap().push(done)));
    let pipeline = Pipeline { group: group.clone(), split };
    let options = LoadOptions { pipeline: Some(pipeline), progress: Some(progress), ..Default::default() };
    let (model, _) = load_with(dir.to_str().unwrap(), &options).unwrap();
    let stage = model.stage().expect("loaded as a stage").clone();
    let rank = group.rank();
    assert_eq!(model.num_layers(), stage.layers().len());
    let read = reports.lock().unwrap().iter().rev().nth(1).copied();
    assert_eq!(read, Some(stage_tensors(&dir, &stage)), "rank {rank} reads only its stage's tensors");

    let prompt = ids(&oracle["prompt_ids"]);
    let mut generation = generate(&model, &prompt, GenerateOptions { max_tokens: 64, ..Default::default() }).unwrap();
    let greedy = generation.by_ref().collect::<nuvec_lm::Result<Vec<u32>>>().unwrap();
    assert_eq!(greedy, ids(&oracle["greedy_tokens"]), "rank {rank}");
    assert_eq!(generation.finish_reason(), Some(&FinishReason::EndOfSequence));
    drop(generation);
    println!("greedy as mlx-lm: rank {rank} of {}, layers {:?}", group.size(), stage.layers());
    // The same stage cut from the model loaded whole.
    let mut cut = nuvec_lm::load_model(&dir).unwrap();
    cut.pipeline(&group, Split::parse(&std::env::var(SPLIT).unwrap()).unwrap()).unwrap();
    assert_eq!(cut.stage().unwrap().layers(), stage.layers());
    let greedy = GenerateOptions { max_tokens: 64, ..Default::default() };
    assert_eq!(tokens(&cut, &prompt, greedy), ids(&oracle["greedy_tokens"]), "rank {rank}, cut from the whole");
    println!("with a seed: {:?}", tokens(&model, &prompt, sampled(Some(5))));
    println!("without a seed: {:?}", tokens(&model, &prompt, sampled(None)));
}

/// Families beside the Llama decoder's, each a stage of a sliding (or linear) and a full layer
/// on two ranks: gpt-oss (windows of 8 positions, sinks), the Qwen3.5 hybrids (a Gated DeltaNet
/// and a gated attention layer each; mlx-lm's layout, a Hugging Face original's, the MoE one).
const OTHER_FAMILIES: [&str; 4] =
    ["gpt_oss/gpt_oss-q4g64", "qwen3_5/qwen3_5-f32", "qwen3_5/qwen3_5-hf", "qwen3_5/qwen3_5_moe-f32"];

#[test]
fn other_families_pipelined_generate_the_whole_models_tokens() {
    let (out, ok) = mpirun(2, "rank_of_other_families_pipelined", &[], Duration::from_secs(180));
    assert!(ok, "{out}");
    for case in OTHER_FAMILIES {
        assert_eq!(reports(&out, &format!("{case} as the whole model: ")).len(), 2, "{out}");
    }
}

#[test]
#[ignore = "a rank of other_families_pipelined_generate_the_whole_models_tokens, under mpirun"]
fn rank_of_other_families_pipelined() {
    if !under_mpirun() {
        return;
    }
    let group = distributed::init(true).unwrap();
    for case in OTHER_FAMILIES {
        let dir = fixtures().join(case);
        // Loaded as stages (each reading its own tensors) and cut from the whole model.
        let whole = nuvec_lm::load_model(&dir).unwrap();
        let staged = nuvec_lm::load_model_pipelined(&dir, &group, Split::Even).unwrap();
        let mut cut = nuvec_lm::load_model(&dir).unwrap();
        cut.pipeline(&group, Split::Even).unwrap();
        let prompt: Vec<u32> = (0..12).map(|i| 1000 + 37 * i).collect();
        let greedy = GenerateOptions { max_tokens: 24, ignore_eos: true, ..Default::default() };
        let expected = tokens(&whole, &prompt, greedy.clone());
        assert_eq!(tokens(&staged, &prompt, greedy.clone()), expected, "{case}: rank {}", group.rank());
        assert_eq!(tokens(&cut, &prompt, greedy), expected, "{case}: rank {}, cut from the whole", group.rank());
        println!("{case} as the whole model: rank {} of {}", group.rank(), group.size());
    }
}

#[test]
fn a_pipeline_of_one_rank_is_the_whole_model() {
    if under_mpirun() {
        return;
    }
    let dir = fixtures().join("qwen3_moe-q4g64");
    let prompt = [9707, 11, 1879, 0, 42];
    let (model, _) = nuvec_lm::load(dir.to_str().unwrap()).unwrap();
    let staged = nuvec_lm::load_model_pipelined(&dir, &Group::alone(), Split::Even).unwrap();
    assert_eq!(staged.stage().unwrap().layers(), 0..model.num_layers());
    let greedy = GenerateOptions { max_tokens: 16, ignore_eos: true, ..Default::default() };
    assert_eq!(tokens(&staged, &prompt, greedy.clone()), tokens(&model, &prompt, greedy));
}

#[test]
fn what_a_pipeline_refuses_is_named() {
    if under_mpirun() {
        return;
    }
    let one = Group::alone();
    let refused =
        |dir: &Path, split: Split| nuvec_lm::load_model_pipelined(dir, &one, split).map(drop).unwrap_err().to_string();
    let fx = fixtures();
    let e = refused(&fx.join("gemma4/gemma4-q4g64"), Split::Even);
    assert!(e.contains("Gemma 4 is not pipelined"), "{e}");
    let e = refused(&fx.join("llama-q4g64"), Split::Layers(vec![1, 1]));
    assert!(e.contains("one count per rank"), "{e}");
    let with_head = LoadOptions { mtp: true, ..Default::default() };
    let path = fx.join("qwen3_5_mtp/qwen3_5-mtp");
    let (mut hybrid, _) = load_with(path.to_str().unwrap(), &with_head).unwrap();
    let e = hybrid.pipeline(&one, Split::Even).unwrap_err().to_string();
    assert!(e.contains("multi-token-prediction head on a pipelined model") && hybrid.stage().is_none(), "{e}");
    let mut whole = nuvec_lm::load_model(&fx.join("llama-q4g64")).unwrap();
    let e = whole.pipeline(&one, Split::Layers(vec![1, 1])).unwrap_err().to_string();
    assert!(e.contains("one count per rank") && whole.stage().is_none(), "{e}");
    whole.pipeline(&one, Split::Even).unwrap();
    let e = whole.shard(&one).unwrap_err().to_string();
    assert!(e.contains("pipelined or sharded, not both"), "{e}");
    let pipeline = Some(Pipeline { group: one.clone(), split: Split::Even });
    let gguf = LoadOptions { pipeline: pipeline.clone(), ..Default::default() };
    let e = load_with(default_gguf().to_str().unwrap(), &gguf).map(drop).unwrap_err().to_string();
    assert!(e.contains("a GGUF file is converted whole") && e.contains("nuvec convert"), "{e}");
    let mtp = LoadOptions { pipeline, mtp: true, ..Default::default() };
    let e = load_with(fx.join("llama-q4g64").to_str().unwrap(), &mtp).map(drop).unwrap_err().to_string();
    assert!(e.contains("multi-token-prediction head on a pipelined model"), "{e}");
}
