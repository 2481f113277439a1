//! The rejection rule for guesses a draft model draws (`DraftModel::sampling`): whatever the
//! draft's distribution, every token must follow the target's. A sampled target (temperature 1,
//! top-k 5) with a draft that draws from a sharper distribution of its 4-bit copy generates three
//! tokens under 1,500 seeds, two guesses verified in the first pass; the first two tokens' pairs
//! are held to the target's own distribution by a chi-square test (significance 0.001; the seeds
//! are fixed, so the outcome is too), and both outcomes of the rule (guesses taken and guesses
//! replaced by a residual draw) must occur.

mod common;

use common::{fixtures, ids, oracle_json};
use nuvec_lm::sample::log_softmax;
use nuvec_lm::speculative::{speculative_generate, DraftModel};
use nuvec_lm::{GenerateOptions, Model, Sampler};
use rand::SeedableRng;

/// The target's distribution after `context`, as its sampler draws from it.
fn distribution(model: &Model, context: &[u32], sampler: &Sampler) -> Vec<f64> {
    let mut cache = model.make_cache(&Default::default()).unwrap();
    let logits = model.forward_last(context, &mut cache).unwrap().to_vec::<f32>().unwrap();
    let mut logprobs = log_softmax(&logits);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    sampler.distribution(&mut logprobs, &[], &mut rng).unwrap()
}

/// The chi-square statistic's value that a true distribution exceeds with probability 0.001,
/// for `df` degrees of freedom (Wilson and Hilferty's approximation).
fn critical(df: usize) -> f64 {
    let df = df as f64;
    let a = 2.0 / (9.0 * df);
    df * (1.0 - a + 3.090 * a.sqrt()).powi(3)
}

#[test]
fn drawn_guesses_leave_the_targets_distribution() {
    let dir = fixtures().join("qwen3-f32");
    let prompt = ids(&oracle_json(&dir)["prompt_ids"]);
    let target = nuvec_lm::load(dir.to_str().unwrap()).unwrap().0;
    let draft = nuvec_lm::load(fixtures().join("qwen3-q4g64").to_str().unwrap()).unwrap().0;
    let sampler = Sampler { temperature: 1.0, top_k: 5, ..Default::default() };
    let sharper = Sampler { temperature: 0.5, top_k: 5, ..Default::default() };

    // The target's distribution of the two tokens: the first's, then the second's after each.
    let first = distribution(&target, &prompt, &sampler);
    let mut expected: Vec<((u32, u32), f64)> = vec![];
    for (t1, &p1) in first.iter().enumerate().filter(|(_, &p)| p > 0.0) {
        let second = distribution(&target, &[&prompt[..], &[t1 as u32]].concat(), &sampler);
        for (t2, &p2) in second.iter().enumerate().filter(|(_, &p)| p > 0.0) {
            expected.push(((t1 as u32, t2 as u32), p1 * p2));
        }
    }

    let runs = 1500;
    let mut counts = std::collections::HashMap::<(u32, u32), usize>::new();
    let (mut drafted, mut accepted) = (0, 0);
    for seed in 0..runs as u64 {
        // Three tokens, so that the first pass verifies two drawn guesses; the first two are tested.
        let options =
            GenerateOptions { max_tokens: 3, sampler: sampler.clone(), seed: Some(seed), ..Default::default() };
        let proposer = DraftModel::sampling(&draft, 512, sharper.clone(), Some(seed + 1_000_000)).unwrap();
        let mut g = speculative_generate(&target, &prompt, options, proposer, 2).unwrap();
        let tokens = g.by_ref().collect::<nuvec_lm::Result<Vec<u32>>>().unwrap();
        assert_eq!(tokens.len(), 3, "seed {seed}");
        *counts.entry((tokens[0], tokens[1])).or_default() += 1;
        drafted += g.stats().drafted;
        accepted += g.stats().accepted;
    }
    let unexpected: usize =
        counts.iter().filter(|(pair, _)| !expected.iter().any(|(e, _)| e == *pair)).map(|(_, n)| n).sum();
    assert_eq!(unexpected, 0, "pairs the target's sampler cannot give");

    // Cells expected at least 5 times each; the rest pooled into one.
    let (mut chi2, mut cells, mut pooled) = (0.0, 0, (0.0, 0usize));
    for (pair, p) in &expected {
        let (want, got) = (p * runs as f64, counts.get(pair).copied().unwrap_or(0));
        if want >= 5.0 {
            chi2 += (got as f64 - want).powi(2) / want;
            cells += 1;
        } else {
            pooled = (pooled.0 + want, pooled.1 + got);
        }
    }
    if pooled.0 >= 5.0 {
        chi2 += (pooled.1 as f64 - pooled.0).powi(2) / pooled.0;
        cells += 1;
    }
    let limit = critical(cells - 1);
    println!(
        "RESULT chi-square {chi2:.1} over {cells} cells (limit {limit:.1}); {accepted} of {drafted} guesses taken"
    );
    assert!(cells >= 5, "too few cells for a test: {cells}");
    assert!(chi2 < limit, "the tokens do not follow the target's distribution: chi-square {chi2:.1} >= {limit:.1}");
    let rate = accepted as f64 / drafted as f64;
    assert!((0.1..0.95).contains(&rate), "both outcomes of the rule must occur: {accepted} of {drafted} taken");
}
