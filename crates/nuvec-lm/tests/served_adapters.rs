//! Served adapters (`LoadOptions::served_adapters`, chosen per request by
//! `GenerateOptions::adapter`): one model holding two adapters made by mlx-lm's own layers
//! (`tests/support/mlx_adapter.py`) runs requests of the base model and of each adapter in the
//! same Batcher steps, and each answers as mlx-lm does with its adapter alone; prompt blocks are
//! shared only among requests of one adapter; a name or id not served is an error.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::fixtures;
use common::mlx_adapter::{make, mlx_run, prompt, scratch, STEPS};
use nuvec_lm::cache::LayerCache;
use nuvec_lm::{
    generate, load_with, AdapterId, Batcher, BatcherOptions, Event, GenerateOptions, LoadOptions, Model, RequestId,
    StepBatch,
};

/// mlx-lm's top two closer than this may swap under another summation order (f32 weights).
const CLOSE: f32 = 4e-3;

/// What a request produced: its tokens and the prompt tokens the prefix cache gave it.
#[derive(Default, Debug)]
struct Output {
    tokens: Vec<u32>,
    cached: Option<usize>,
}

fn served(dir: &Path, adapters: &[(&str, &Path)]) -> Model {
    let served_adapters = adapters.iter().map(|(n, p)| (n.to_string(), p.to_path_buf())).collect();
    let options = LoadOptions { served_adapters, ..Default::default() };
    load_with(dir.to_str().unwrap(), &options).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).0
}

fn options(adapter: Option<&str>) -> GenerateOptions {
    GenerateOptions { max_tokens: STEPS, ignore_eos: true, adapter: adapter.map(str::to_string), ..Default::default() }
}

/// Submits every `(prompt, adapter)` to `batcher` at once and steps it until all end.
fn run(batcher: &mut Batcher, requests: &[(Vec<u32>, Option<&str>)]) -> Vec<Output> {
    let ids: Vec<RequestId> = requests.iter().map(|(p, a)| batcher.submit(p.clone(), options(*a)).unwrap()).collect();
    let mut out: BTreeMap<RequestId, Output> = BTreeMap::new();
    while batcher.is_busy() {
        for event in batcher.step().unwrap() {
            match event {
                Event::Token { id, token } => out.entry(id).or_default().tokens.push(token),
                Event::Started { id, cached_tokens } => out.entry(id).or_default().cached = Some(cached_tokens),
                Event::Failed { id, error } => panic!("{id:?} failed: {error}"),
                _ => {}
            }
        }
    }
    ids.iter().map(|id| out.remove(id).unwrap_or_default()).collect()
}

/// Our tokens against mlx-lm's: equal up to a step where mlx-lm's own top two are close.
fn assert_agrees(what: &str, got: &[u32], (want, _, margins): &(Vec<u32>, Vec<f32>, Vec<f32>)) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs mlx-lm's {want:?}");
    if let Some(step) = got.iter().zip(want).position(|(a, b)| a != b) {
        assert!(margins[step] <= CLOSE, "{what}: step {step}: {got:?} vs mlx-lm's {want:?}");
    }
}

fn two_adapters(dir: &Path, case: &str, kinds: [&str; 2]) -> [PathBuf; 2] {
    let made = [0, 1].map(|i| scratch(&format!("served-{case}-{i}")));
    for (i, out) in made.iter().enumerate() {
        make(dir, out, kinds[i], i as u64);
    }
    made
}

#[test]
fn each_request_answers_as_mlx_lm_with_its_adapter() {
    for (case, kinds) in [("llama-f32", ["lora", "dora"]), ("qwen3-q4g64", ["dora", "lora"])] {
        let dir = fixtures().join(case);
        let [a, b] = two_adapters(&dir, case, kinds);
        let model = served(&dir, &[("a", &a), ("b", &b)]);
        assert_eq!(model.adapter_names(), ["a", "b"]);
        let short = prompt(&dir);
        // Longer than one pass of the few-row adapter op, so a prefill chunk beside decode rows.
        let long: Vec<u32> = short.iter().cycle().take(100).copied().collect();
        let mut requests = vec![];
        for p in [&short, &long] {
            for adapter in [None, Some("a"), Some("b"), Some("a")] {
                requests.push((p.clone(), adapter));
            }
        }
        let path = |name: Option<&str>| match name {
            None => None,
            Some("a") => Some(a.as_path()),
            Some(_) => Some(b.as_path()),
        };
        let want: Vec<_> = requests.iter().map(|(p, name)| mlx_run(&dir, path(*name), p)).collect();
        // The adapters matter: mlx-lm answers otherwise with each.
        for (i, j) in [(0, 1), (0, 2), (1, 2)] {
            assert_ne!(want[i + 4].0, want[j + 4].0, "{case}: requests {i} and {j} get the same answer in mlx-lm");
        }
        for invariant in [false, true] {
            let options = BatcherOptions { blocks: Some(256), batch_invariant: invariant, ..Default::default() };
            let mut batcher = Batcher::new(&model, options).unwrap();
            let got = run(&mut batcher, &requests);
            for (i, ((p, name), (out, want))) in requests.iter().zip(got.iter().zip(&want)).enumerate() {
                let what = format!("{case} (invariant {invariant}) request {i}: adapter {name:?}, {} tokens", p.len());
                assert_agrees(&what, &out.tokens, want);
            }
        }
        for d in [&a, &b] {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

#[test]
fn prompt_blocks_are_shared_only_among_one_adapter_s_requests() {
    let dir = fixtures().join("llama-f32");
    let [a, b] = two_adapters(&dir, "prefix", ["lora", "lora"]);
    let model = served(&dir, &[("a", &a), ("b", &b)]);
    let long: Vec<u32> = prompt(&dir).iter().cycle().take(100).copied().collect();
    let options = BatcherOptions { blocks: Some(256), block_size: 16, ..Default::default() };
    let mut batcher = Batcher::new(&model, options).unwrap();
    let (base, with_a) = (mlx_run(&dir, None, &long), mlx_run(&dir, Some(&a), &long));
    // One after another: each finds what the ones before it left in the cache.
    let full = (long.len() - 1) / 16 * 16;
    for (adapter, cached, want) in
        [(None, 0, &base), (Some("a"), 0, &with_a), (Some("a"), full, &with_a), (None, full, &base)]
    {
        let out = run(&mut batcher, &[(long.clone(), adapter)]).remove(0);
        assert_eq!(out.cached, Some(cached), "adapter {adapter:?}");
        assert_agrees(&format!("adapter {adapter:?} after a hit of {cached}"), &out.tokens, want);
    }
    for d in [&a, &b] {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[test]
fn adapters_not_served_are_errors_naming_those_that_are() {
    let dir = fixtures().join("llama-f32");
    let [a, b] = two_adapters(&dir, "errors", ["lora", "dora"]);
    let model = served(&dir, &[("a", &a), ("b", &b)]);
    let mut batcher = Batcher::new(&model, BatcherOptions { blocks: Some(64), ..Default::default() }).unwrap();
    let p = prompt(&dir);
    let err = batcher.submit(p.clone(), options(Some("c"))).unwrap_err().to_string();
    assert!(err.contains("\"c\"") && err.contains("a, b"), "{err}");
    // One generation alone does not take a served adapter (the Batcher does).
    let err = generate(&model, &p, options(Some("a"))).err().unwrap().to_string();
    assert!(err.contains("Batcher") && err.contains("adapter_path"), "{err}");
    // A step naming an adapter the model does not hold.
    let mut cache: Vec<LayerCache> = model.new_cache();
    let mut step = StepBatch::new();
    step.push_adapted(&p, &mut cache, Some(AdapterId(2))).unwrap();
    let err = model.step(&mut step).unwrap_err().to_string();
    assert!(err.contains("adapter 2") && err.contains("serves 2"), "{err}");
    // A model without served adapters says how to serve some.
    let plain = served(&dir, &[]);
    let err = plain.adapter_id("a").unwrap_err().to_string();
    assert!(err.contains("--lora-modules"), "{err}");
    // Names must differ, and an adapter on every request does not mix with served ones.
    let load = |options: LoadOptions| load_with(dir.to_str().unwrap(), &options).err().unwrap().to_string();
    let twice = vec![("a".to_string(), a.clone()), ("a".to_string(), b.clone())];
    let err = load(LoadOptions { served_adapters: twice, ..Default::default() });
    assert!(err.contains("two served adapters are named \"a\""), "{err}");
    let served_adapters = vec![("a".to_string(), a.clone())];
    let err = load(LoadOptions { served_adapters, adapter_path: Some(b.clone()), ..Default::default() });
    assert!(err.contains("nuvec fuse"), "{err}");
    // Adapters on MoE experts are refused as for --adapter-path.
    let moe = fixtures().join("qwen3_moe-f32");
    let experts = scratch("served-moe");
    make(&moe, &experts, "lora", 0);
    let served_adapters = vec![("e".to_string(), experts.clone())];
    let err = load_with(moe.to_str().unwrap(), &LoadOptions { served_adapters, ..Default::default() })
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("switch_mlp") && err.contains("not supported"), "{err}");
    for d in [&a, &b, &experts] {
        let _ = std::fs::remove_dir_all(d);
    }
}
