//! The sampler's filters and the logits processors against mlx-lm's own functions on fixed
//! logits (records from scripts/oracle/make_sampler_records.py), and sampled distributions
//! against the distribution mlx-lm's sampler draws from (a seeded chi-square test).

mod common;

use common::fixtures;
use nuvec_lm::sample::{apply_min_p, apply_top_k, apply_top_p, apply_xtc};
use nuvec_lm::{LogitsProcessors, Sampler};
use rand::SeedableRng;
use serde_json::Value;

fn records() -> Value {
    let path = fixtures().join("samplers.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// A recorded vector; null stands for -inf.
fn vector(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().map_or(f32::NEG_INFINITY, |f| f as f32)).collect()
}

fn assert_same(ours: &[f32], theirs: &[f32], what: &str) {
    assert_eq!(ours.len(), theirs.len(), "{what}");
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        let same =
            (a.is_infinite() && b.is_infinite() && a.signum() == b.signum()) || (a - b).abs() <= 1e-5 * (1.0 + b.abs());
        assert!(same, "{what}: token {i}: ours {a}, mlx-lm {b}");
    }
}

#[test]
fn filters_match_mlx_lm() {
    let records = records();
    let filters = records["filters"].as_array().unwrap();
    // scripts/oracle/make_sampler_records.py records 10 filters for each of its 3 logits cases.
    assert!(filters.len() >= 30, "samplers.json has {} filter records, the oracle script makes 30", filters.len());
    for r in filters {
        let mut lp = vector(&r["logprobs"]);
        let what = format!("{} {} {r}", r["case"], r["filter"]);
        match r["filter"].as_str().unwrap() {
            "top_p" => apply_top_p(&mut lp, r["top_p"].as_f64().unwrap() as f32),
            "min_p" => apply_min_p(
                &mut lp,
                r["min_p"].as_f64().unwrap() as f32,
                r["min_tokens_to_keep"].as_u64().unwrap() as usize,
            ),
            "xtc" => {
                let special: Vec<u32> =
                    r["special"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
                apply_xtc(&mut lp, r["xtc_threshold"].as_f64().unwrap() as f32, &special)
            }
            "top_k" => apply_top_k(&mut lp, r["top_k"].as_u64().unwrap() as usize),
            other => panic!("unknown filter {other}"),
        }
        assert_same(&lp, &vector(&r["out"]), &what);
    }
}

#[test]
fn processors_match_mlx_lm() {
    let records = records();
    let processors = records["processors"].as_array().unwrap();
    // 6 processor settings for each of the oracle script's 3 logits cases.
    assert!(
        processors.len() >= 18,
        "samplers.json has {} processor records, the oracle script makes 18",
        processors.len()
    );
    for r in processors {
        let s = &r["settings"];
        let size = |k: &str| s.get(k).and_then(Value::as_u64).map_or(20, |v| v as usize);
        let penalty = |k: &str| s.get(k).and_then(Value::as_f64).map(|v| v as f32);
        let processors = LogitsProcessors {
            repetition_penalty: penalty("repetition_penalty"),
            repetition_context_size: size("repetition_context_size"),
            presence_penalty: penalty("presence_penalty"),
            presence_context_size: size("presence_context_size"),
            frequency_penalty: penalty("frequency_penalty"),
            frequency_context_size: size("frequency_context_size"),
            logit_bias: s
                .get("logit_bias")
                .and_then(Value::as_object)
                .map(|m| m.iter().map(|(k, v)| (k.parse().unwrap(), v.as_f64().unwrap() as f32)).collect())
                .unwrap_or_default(),
        };
        processors.validate(64).unwrap();
        let history: Vec<u32> = r["history"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let mut logits = vector(&r["logits"]);
        processors.apply(&history, &mut logits);
        assert_same(&logits, &vector(&r["out"]), &format!("{} {s}", r["case"]));
    }
}

/// Wilson-Hilferty approximation of the chi-square quantile at p = 0.999.
fn chi_square_critical(df: f64) -> f64 {
    let z = 3.09;
    df * (1.0 - 2.0 / (9.0 * df) + z * (2.0 / (9.0 * df)).sqrt()).powi(3)
}

#[test]
fn sampled_distributions_match_mlx_lm() {
    let records = records();
    let distributions = records["distributions"].as_array().unwrap();
    // 3 sampler settings for each of the oracle script's 3 logits cases.
    assert!(
        distributions.len() >= 9,
        "samplers.json has {} distribution records, the oracle script makes 9",
        distributions.len()
    );
    for (n, r) in distributions.iter().enumerate() {
        let sampler = Sampler {
            temperature: r["temperature"].as_f64().unwrap() as f32,
            top_p: r["top_p"].as_f64().unwrap() as f32,
            min_p: r["min_p"].as_f64().unwrap() as f32,
            top_k: r["top_k"].as_u64().unwrap() as usize,
            ..Default::default()
        };
        let lp = vector(&r["logprobs"]);
        let expected: Vec<f64> = r["probs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        for plain in [false, true].into_iter().filter(|&p| !p || sampler.draws_plainly(lp.len())) {
            let draws = 20_000;
            let mut counts = vec![0usize; lp.len()];
            // Fixed seed: the test is deterministic and cannot flake.
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(n as u64);
            for _ in 0..draws {
                let token = match plain {
                    // A temperature alone: the raw logits' draw (the logprobs are logits too).
                    true => nuvec_lm::sample::categorical_from_logits(&lp, sampler.scale(), &mut rng),
                    false => sampler.sample(&mut lp.clone(), &[], &mut rng),
                };
                counts[token as usize] += 1;
            }
            // Never a token mlx-lm gives zero probability.
            for (i, (&c, &p)) in counts.iter().zip(&expected).enumerate() {
                assert!(
                    !(p == 0.0 && c > 0),
                    "case {n} (plain draw: {plain}): drew token {i} {c} times; mlx-lm's sampler never draws it"
                );
            }
            // Chi-square over tokens expected at least 5 times; the rest pooled.
            let (mut chi2, mut df, mut pooled_e, mut pooled_o) = (0.0, 0usize, 0.0, 0.0);
            for (&c, &p) in counts.iter().zip(&expected) {
                let e = p * draws as f64;
                if e >= 5.0 {
                    chi2 += (c as f64 - e).powi(2) / e;
                    df += 1;
                } else {
                    pooled_e += e;
                    pooled_o += c as f64;
                }
            }
            if pooled_e >= 5.0 {
                chi2 += (pooled_o - pooled_e).powi(2) / pooled_e;
                df += 1;
            }
            let df = (df.max(2) - 1) as f64;
            assert!(
                chi2 < chi_square_critical(df),
                "case {n} ({r:?}, plain draw: {plain}): chi2 {chi2:.1} over {df} dof"
            );
        }
    }
}

/// A generator whose every word is `word`: `gen::<f64>()` then gives `(word >> 11) * 2^-53`.
struct Fixed(u64);

impl rand::RngCore for Fixed {
    fn next_u32(&mut self) -> u32 {
        (self.0 >> 32) as u32
    }
    fn next_u64(&mut self) -> u64 {
        self.0
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        dest.fill(0);
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        dest.fill(0);
        Ok(())
    }
}

/// The host path's draw from a row of logits at `temperature` alone with the uniform `k * 2^-53`.
fn host_draw(row: &[f32], temperature: f32, k: u64) -> u32 {
    let scale = Sampler { temperature, ..Default::default() }.scale();
    nuvec_lm::sample::categorical_from_logits(row, scale, &mut Fixed(k << 11))
}

#[test]
fn draws_where_the_logits_are_are_the_host_draws_wherever_they_say_so() {
    use rand::Rng;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let mut rows: Vec<Vec<f32>> = vec![];
    for &n in &[2usize, 7, 1000, 49_152] {
        // Spread logits, a peaked row, a row of exact ties, large offsets, and -inf entries.
        let spread: Vec<f32> = (0..n).map(|_| rng.gen_range(-8.0f32..8.0)).collect();
        let mut peaked = spread.clone();
        peaked[n / 2] = 30.0;
        let offset: Vec<f32> = spread.iter().map(|v| v * 4.0 + 900.0).collect();
        let mut banned = spread.clone();
        banned.iter_mut().step_by(3).for_each(|v| *v = f32::NEG_INFINITY);
        rows.extend([spread, peaked, vec![1.5; n], offset, banned]);
    }
    let (mut certain, mut drawn, mut left_to_the_host) = (0usize, 0usize, 0usize);
    for row in &rows {
        let n = row.len();
        for &temperature in &[0.3f32, 1.0, 1.7] {
            let sampler = Sampler { temperature, ..Default::default() };
            assert!(sampler.draws_plainly(n));
            // Uniforms at random, and on the host's own interval ends (a draw there is a tie the
            // device cannot settle, or settles as the host does).
            let mut ks: Vec<u64> = (0..40).map(|_| rng.gen::<u64>() >> 11).collect();
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let weights: Vec<f64> = row.iter().map(|&x| ((x as f64 - max) * sampler.scale() as f64).exp()).collect();
            let total: f64 = weights.iter().sum();
            let mut below = 0.0;
            for w in weights.iter().take(12) {
                below += w;
                let k = ((below / total).min(1.0) * (1u64 << 53) as f64) as u64;
                ks.extend([k.saturating_sub(1), k, k + 1].into_iter().filter(|&k| k < 1 << 53));
            }
            let at_random = 40;
            let x = nuvec::Array::from_slice(&row.repeat(ks.len()), &[ks.len(), n]).unwrap();
            let uniforms: Vec<f64> = ks.iter().map(|&k| k as f64 / (1u64 << 53) as f64).collect();
            let words = x.sample_rows(&vec![sampler.scale(); ks.len()], &uniforms).unwrap().to_vec::<u32>().unwrap();
            for (i, &k) in ks.iter().enumerate() {
                let (token, sure) = (words[3 * i], words[3 * i + 1]);
                if sure == 1 {
                    let host = host_draw(row, temperature, k);
                    assert_eq!(token, host, "n {n}, temperature {temperature}, u {}", uniforms[i]);
                    certain += usize::from(i < at_random);
                }
                drawn += usize::from(i < at_random);
                left_to_the_host += usize::from(sure == 0);
            }
        }
    }
    // Draws at random uniforms are certain but for a chance of about 1e-10 per draw.
    assert_eq!(certain, drawn, "draws at random uniforms certain");
    // Uniforms on the interval ends are left to the host.
    assert!(left_to_the_host > 100, "{left_to_the_host} draws on interval ends left to the host");
}
