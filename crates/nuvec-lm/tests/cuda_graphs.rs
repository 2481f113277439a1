//! One-token decode steps replayed as CUDA graphs against the same steps run eagerly (feature
//! `cuda`; run on a machine with an NVIDIA GPU, one test thread: see docs/cuda-graphs.md).
//!
//! A replay runs the eager path's kernels, which read the step's position and token from the
//! graph's step scalars (split attention recomputes the eager chunk from the device kv length),
//! so its logits must equal the eager step's bit for bit at every position, with no kernel node
//! patched from the host per replay. Each case decodes 300 steps on
//! two caches of one model, one through `DecodeGraph` in each mode, feeding both the eager
//! run's greedy tokens; the run crosses the caches' growth at 256 positions (so the graph is
//! captured twice), on dense models, on Qwen3-MoE (routing and experts on the device) and on
//! gpt-oss (sinks, and sliding layers whose rotating caches wrap around their ring of 8 at every
//! eighth replay), and with every cache a rotating one (`max_kv_size` 40, 4 positions kept). The
//! failure case forces a capture on the MoE model with its experts run the composed way, which
//! reads the routing to the host: the capture must fail, leave the caches as they were, and every
//! step must still equal the eager one.
//!
//! Fixtures: `$NUVEC_GPU_FIXTURES` (case directories with config.json and the safetensors),
//! else `$NUVEC_FIXTURES`. No usable GPU fails the tests.
#![cfg(feature = "cuda")]

use std::time::{Duration, Instant};

use nuvec_lm::cache::{CacheOptions, KvDtype, LayerCache};
use nuvec_lm::decode_graph::{DecodeGraph, GraphMode};
use nuvec_lm::{load_model_on, Model};

mod common;
use common::gpu_cases::{argmax, case_dir, prompt};

const STEPS: usize = 300;
const PROMPT: usize = 12;

fn load(case: &str) -> Model {
    load_model_on(&case_dir(case), nuvec::Device::Cuda(0)).unwrap_or_else(|e| panic!("{case}: loading on cuda:0: {e}"))
}

fn prefilled(model: &Model, prompt: &[u32], options: &CacheOptions) -> Vec<LayerCache> {
    let mut cache = model.make_cache(options).unwrap();
    model.prefill(prompt, &mut cache).unwrap();
    cache
}

/// Decodes `steps` tokens on two caches, eagerly and through a `DecodeGraph` in `mode`, feeding
/// both the eager greedy tokens; every step's logits must be equal bit for bit. Returns the
/// graph runner and the time each side took.
fn lockstep(case: &str, mode: GraphMode, steps: usize) -> (DecodeGraph, Duration, Duration) {
    lockstep_with(case, mode, steps, &CacheOptions { kv_dtype: Some(KvDtype::F32), ..Default::default() })
}

fn lockstep_with(
    case: &str,
    mode: GraphMode,
    steps: usize,
    options: &CacheOptions,
) -> (DecodeGraph, Duration, Duration) {
    let model = load(case);
    let ids = prompt(model.vocab_size(), PROMPT);
    let (head, last) = ids.split_at(PROMPT - 1);
    let mut eager_cache = prefilled(&model, head, options);
    let mut graph_cache = prefilled(&model, head, options);
    let mut eager = DecodeGraph::new(GraphMode::Off);
    let mut graphs = DecodeGraph::new(mode);
    let (mut eager_time, mut graph_time) = (Duration::ZERO, Duration::ZERO);
    let mut token = last[0];
    for step in 0..steps {
        let position = eager_cache[0].offset();
        let t = Instant::now();
        let a = eager.step(&model, &mut eager_cache, token).unwrap().to_vec::<f32>().unwrap();
        eager_time += t.elapsed();
        let t = Instant::now();
        let b = graphs
            .step(&model, &mut graph_cache, token)
            .unwrap_or_else(|e| panic!("{case}: graph step {step}: {e}"))
            .to_vec::<f32>()
            .unwrap();
        graph_time += t.elapsed();
        assert_eq!(a.len(), b.len(), "{case} step {step}");
        if let Some(i) = a.iter().zip(&b).position(|(x, y)| x.to_bits() != y.to_bits()) {
            panic!(
                "{case} step {step} (position {position}, {} replayed, {} captures): logit {i} is {} eagerly, {} \
                 from the graph",
                graphs.replayed_steps(),
                graphs.captures(),
                a[i],
                b[i]
            );
        }
        for (l, (x, y)) in eager_cache.iter().zip(&graph_cache).enumerate() {
            assert_eq!(x.offset(), y.offset(), "{case} step {step}: layer {l}'s cache offset");
        }
        token = argmax(&a);
    }
    (graphs, eager_time, graph_time)
}

fn graphs_equal_eager(case: &str) {
    let (graphs, eager, graph) = lockstep(case, GraphMode::On, STEPS);
    assert_eq!(graphs.stopped(), None, "{case}: graphs stopped (run with --test-threads=1)");
    // Step 1 eager, step 2 captured, replays until the caches are full at 256 positions, one
    // eager step that grows them, a second capture, replays to the end.
    assert_eq!(graphs.captures(), 2, "{case}: captures");
    assert_eq!(graphs.replayed_steps(), STEPS - 4, "{case}: replayed steps");
    assert_eq!(graphs.patched_nodes(), Some(0), "{case}: kernel nodes patched per replay");
    println!(
        "RESULT {case}: {STEPS} steps bit-identical, {} replayed, {} captures, {} patched nodes per replay; eager \
         {:.1} us/step, graph path {:.1} us/step (each with its logits copied to the host)",
        graphs.replayed_steps(),
        graphs.captures(),
        graphs.patched_nodes().unwrap_or(0),
        eager.as_secs_f64() * 1e6 / STEPS as f64,
        graph.as_secs_f64() * 1e6 / STEPS as f64
    );
}

#[test]
fn graphs_equal_eager_mistral_q4() {
    graphs_equal_eager("mistral-q4g64");
}

#[test]
fn graphs_equal_eager_qwen3_q4() {
    graphs_equal_eager("qwen3-q4g64");
}

#[test]
fn graphs_equal_eager_qwen3_moe_q4() {
    graphs_equal_eager("qwen3_moe-q4g64");
}

#[test]
fn graphs_equal_eager_gpt_oss_q4() {
    // Its sliding layers' rings are whole from the first step (which cuts the prompt's 11
    // positions to the window of 8); its full layers grow at 256 as the others'.
    graphs_equal_eager("gpt_oss/gpt_oss-q4g64");
}

#[test]
fn graphs_equal_eager_with_rotating_caches() {
    // Every layer a ring of 40 keeping its first 4 positions: the first step grows the buffers to
    // the whole ring, the second is captured, every later one replays (wrapping from 40 to 4).
    let case = "mistral-q4g64";
    let options = CacheOptions { kv_dtype: Some(KvDtype::F32), max_kv_size: Some(40), ..Default::default() };
    let (graphs, _, _) = lockstep_with(case, GraphMode::On, STEPS, &options);
    assert_eq!(graphs.stopped(), None, "{case}: graphs stopped");
    assert_eq!((graphs.captures(), graphs.replayed_steps()), (1, STEPS - 2), "{case}: captures, replays");
    assert_eq!(graphs.patched_nodes(), Some(0), "{case}: kernel nodes patched per replay");
    println!("RESULT {case} (max_kv_size 40): {STEPS} steps bit-identical, {} replayed", graphs.replayed_steps());
}

#[test]
fn moe_capture_fails_and_falls_back_to_eager() {
    let case = "qwen3_moe-q4g64";
    // With the experts run each over its rows (the routing read to the host), a capture fails on
    // that read, after which every step is the eager one (checked bit for bit by `lockstep`).
    nuvec::backends::cuda::set_moe_gather_rows(Some(0));
    let (graphs, _, _) = lockstep(case, GraphMode::Force, 24);
    nuvec::backends::cuda::set_moe_gather_rows(None);
    let why = graphs.stopped().unwrap_or_else(|| panic!("{case}: a forced capture of an MoE step did not fail"));
    assert!(why.contains("cannot be captured"), "{case}: {why}");
    assert_eq!((graphs.captures(), graphs.replayed_steps()), (0, 0), "{case}");
    println!("RESULT {case}: forced capture failed as expected ({why}); 24 steps equal to eager");
}

#[test]
fn generation_with_graphs_gives_the_eager_tokens() {
    let case = "mistral-q4g64";
    let model = load(case);
    let ids = prompt(model.vocab_size(), PROMPT);
    let run = |graphs: &str| {
        // One test thread (see the file notes): the variable is read when the generation starts.
        std::env::set_var("NUVEC_CUDA_GRAPHS", graphs);
        let options = nuvec_lm::GenerateOptions {
            max_tokens: STEPS,
            ignore_eos: true,
            cache: CacheOptions { kv_dtype: Some(KvDtype::F32), ..Default::default() },
            ..Default::default()
        };
        let mut g = nuvec_lm::generate(&model, &ids, options).unwrap();
        let tokens: Vec<u32> = g.by_ref().map(|t| t.unwrap()).collect();
        std::env::remove_var("NUVEC_CUDA_GRAPHS");
        (tokens, g.decode_graph().replayed_steps(), g.decode_graph().stopped().map(String::from))
    };
    let (eager, none, _) = run("0");
    let (graphs, replayed, stopped) = run("1");
    assert_eq!(none, 0, "{case}: NUVEC_CUDA_GRAPHS=0 replayed steps");
    assert_eq!(stopped, None, "{case}");
    assert!(replayed >= STEPS - 8, "{case}: only {replayed} of {STEPS} steps replayed");
    assert_eq!(graphs, eager, "{case}: tokens with graphs vs without");
    println!("RESULT {case} generate: {STEPS} tokens equal with and without graphs ({replayed} steps replayed)");
}
