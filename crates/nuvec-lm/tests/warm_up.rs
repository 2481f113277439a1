//! `Model::warm_up` runs on every family's cache kinds (plain, sliding windows, recurrent
//! states, experts) and leaves the model as it was: a greedy generation after it gives the
//! tokens the same prompt gives before it.

mod common;

use common::{default_gguf, fixtures, seeded_prompt};
use nuvec_lm::{generate, load, load_dir, GenerateOptions, Model};

fn greedy(model: &Model) -> Vec<u32> {
    let prompt = seeded_prompt(12, 7, model.vocab_size());
    let options = GenerateOptions { max_tokens: 8, ignore_eos: true, ..Default::default() };
    generate(model, &prompt, options).unwrap().map(Result::unwrap).collect()
}

#[test]
fn warm_up_runs_every_cache_kind_and_changes_no_token() {
    let cases = [
        "llama-q4g64",
        "qwen3_moe-q4g64",
        "qwen3_5/qwen3_5-f32",
        "gemma4/gemma4-f32",
        "gemma4/gemma4_moe-f32",
        "gpt_oss/gpt_oss-f32",
    ];
    let mut models: Vec<(String, Model)> =
        cases.iter().map(|c| (c.to_string(), load_dir(&fixtures().join(c)).unwrap().0)).collect();
    models.push(("SmolLM2 (GGUF)".into(), load(default_gguf().to_str().unwrap()).unwrap().0));
    for (case, model) in &models {
        let before = greedy(model);
        model.warm_up().unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(greedy(model), before, "{case}: tokens after warm_up");
    }
}
