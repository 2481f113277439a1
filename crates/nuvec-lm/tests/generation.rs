//! Generation semantics on a scripted model whose every step's logits we choose: end of
//! sequence, stop tokens, stop strings across tokens and inside characters, holdback in the
//! streamed text, min_tokens, ignore_eos, max_tokens 0 and 1, log-probabilities and seeds.

use std::sync::Mutex;

use nuvec::Array;

use nuvec_lm::models::Architecture;
use nuvec_lm::{
    generate, FinishReason, GenerateOptions, Model, Sampler, StepBatch, Stop, Stopped, TextStream, Tokenizer,
};
use serde_json::json;

const EOS: u32 = 300;

/// Byte-level vocabulary: ids 0..256 are single bytes, then a few multi-byte tokens.
const EXTRA: &[&str] = &["Hel", "lo wor", "ld", "abc", "d", "bc", "<eos>", "é!"];

fn tokenizer() -> Tokenizer {
    // GPT-2's byte alphabet, so ids 0..256 decode to the byte of the same value.
    let chars = nuvec_lm::token_bytes::byte_level_chars();
    let mut vocab = serde_json::Map::new();
    for (b, c) in chars.iter().enumerate() {
        vocab.insert(c.to_string(), json!(b));
    }
    let byte_level = |s: &str| -> String { s.bytes().map(|b| chars[b as usize]).collect() };
    for (i, t) in EXTRA.iter().enumerate() {
        vocab.insert(byte_level(t), json!(256 + i));
    }
    let json = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": EOS, "content": "<|end|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []}
    });
    let inner: tokenizers::Tokenizer = json.to_string().parse().unwrap();
    Tokenizer::from_parts(inner, "test tokenizer".into(), None, Some("<|end|>".into()), vec![EOS], None).unwrap()
}

fn id(token: &str) -> u32 {
    256 + EXTRA.iter().position(|t| *t == token).unwrap() as u32
}

/// Emits `script[i]` as the clear favourite at step i (then the next entries as runners-up),
/// counting steps by the positions it has seen.
struct Scripted {
    script: Vec<u32>,
    seen: Mutex<usize>,
    prompt_len: usize,
}

const VOCAB: usize = 320;

impl Architecture for Scripted {
    fn hidden(&self, step: &mut StepBatch) -> nuvec_lm::Result<Array> {
        let tokens = step.tokens();
        let mut seen = self.seen.lock().unwrap();
        *seen += tokens.len();
        let step = *seen - self.prompt_len;
        let mut logits = vec![0f32; tokens.len() * VOCAB];
        let row = &mut logits[(tokens.len() - 1) * VOCAB..];
        for (rank, &t) in self.script.iter().skip(step).take(3).enumerate() {
            row[t as usize] = row[t as usize].max(10.0 - 3.0 * rank as f32);
        }
        Ok(Array::from_slice(&logits, &[tokens.len(), VOCAB])?)
    }

    fn logits(&self, hidden: &Array) -> nuvec_lm::Result<Array> {
        Ok(hidden.clone())
    }

    fn num_layers(&self) -> usize {
        1
    }
}

fn model(script: &[u32], prompt_len: usize) -> Model {
    let arch = Scripted { script: script.to_vec(), seen: Mutex::new(0), prompt_len };
    Model::new(Box::new(arch), "scripted", VOCAB, vec![EOS])
}

/// Runs a generation, returning (tokens, streamed text, finish reason).
fn run(script: &[u32], options: GenerateOptions) -> (Vec<u32>, String, FinishReason) {
    let tok = tokenizer();
    let prompt = [1u32, 2, 3];
    let m = model(script, prompt.len());
    let mut text = TextStream::new(&tok, &options);
    let mut g = generate(&m, &prompt, options).unwrap();
    let mut tokens = vec![];
    let mut out = String::new();
    for t in g.by_ref() {
        let t = t.unwrap();
        tokens.push(t);
        out += &text.push(t);
    }
    out += &text.finish();
    (tokens, out, g.finish_reason().cloned().unwrap())
}

#[test]
fn ends_at_eos_without_yielding_it() {
    let (tokens, text, reason) = run(&[id("Hel"), id("ld"), EOS, b'x' as u32], GenerateOptions::default());
    assert_eq!(tokens, vec![id("Hel"), id("ld")]);
    assert_eq!(text, "Helld");
    assert_eq!(reason, FinishReason::EndOfSequence);
}

#[test]
fn max_tokens_zero_and_one() {
    let script = [id("Hel"), id("ld"), EOS];
    let (tokens, text, reason) = run(&script, GenerateOptions { max_tokens: 0, ..Default::default() });
    assert!(tokens.is_empty() && text.is_empty());
    assert_eq!(reason, FinishReason::Length);
    let (tokens, _, reason) = run(&script, GenerateOptions { max_tokens: 1, ..Default::default() });
    assert_eq!(tokens, vec![id("Hel")]);
    assert_eq!(reason, FinishReason::Length);
}

#[test]
fn stop_string_across_tokens() {
    let tok = tokenizer();
    let script = [id("Hel"), id("lo wor"), id("ld"), EOS];
    let options = GenerateOptions { stop: Stop::strings(&tok, ["o w"]).unwrap(), ..Default::default() };
    let (tokens, text, reason) = run(&script, options);
    assert_eq!(tokens, vec![id("Hel"), id("lo wor")]);
    assert_eq!(text, "Hell");
    // "lo wor" ends in "o wor": the match and what follows it are 5 bytes.
    assert_eq!(reason, FinishReason::Stop(Stopped::String { index: 0, cut: 5 }));
}

#[test]
fn stop_string_inside_a_split_character() {
    let tok = tokenizer();
    // "é" is 0xC3 0xA9: two byte tokens; the stop string is "é" itself.
    let script = [b'a' as u32, 0xC3, 0xA9, b'b' as u32, EOS];
    let options = GenerateOptions { stop: Stop::strings(&tok, ["é"]).unwrap(), ..Default::default() };
    let (tokens, text, reason) = run(&script, options);
    assert_eq!(tokens, vec![b'a' as u32, 0xC3, 0xA9]);
    assert_eq!(text, "a");
    assert_eq!(reason, FinishReason::Stop(Stopped::String { index: 0, cut: 2 }));

    // Without a stop, the character comes out whole once both halves are there.
    let (_, text, _) = run(&script, GenerateOptions::default());
    assert_eq!(text, "aéb");
}

#[test]
fn overlapping_candidates_end_at_the_earliest_match() {
    let tok = tokenizer();
    let script = [id("abc"), id("d"), EOS];
    // "abcd" would complete at the second token, "bc" completes at the first.
    let options = GenerateOptions { stop: Stop::strings(&tok, ["abcd", "bc"]).unwrap(), ..Default::default() };
    let (tokens, text, reason) = run(&script, options);
    assert_eq!(tokens, vec![id("abc")]);
    assert_eq!(text, "a");
    assert_eq!(reason, FinishReason::Stop(Stopped::String { index: 1, cut: 2 }));
}

#[test]
fn held_back_text_is_released_when_no_stop_follows() {
    let tok = tokenizer();
    let script = [id("abc"), b'x' as u32, EOS];
    let options = GenerateOptions { stop: Stop::strings(&tok, ["cd"]).unwrap(), ..Default::default() };
    let mut text = TextStream::new(&tok, &options);
    assert_eq!(text.push(id("abc")), "ab", "the 'c' could begin the stop string");
    assert_eq!(text.push(b'x' as u32), "cx");
    let (_, all, reason) = run(&script, options);
    assert_eq!(all, "abcx");
    assert_eq!(reason, FinishReason::EndOfSequence);
}

#[test]
fn match_at_the_very_start() {
    let tok = tokenizer();
    let script = [id("Hel"), id("ld"), EOS];
    let options = GenerateOptions { stop: Stop::strings(&tok, ["Hel"]).unwrap(), ..Default::default() };
    let (tokens, text, reason) = run(&script, options);
    assert_eq!(tokens, vec![id("Hel")]);
    assert_eq!(text, "");
    assert_eq!(reason, FinishReason::Stop(Stopped::String { index: 0, cut: 3 }));
}

#[test]
fn stop_tokens_are_not_yielded() {
    let script = [id("Hel"), id("<eos>"), id("ld")];
    let options = GenerateOptions { stop: Stop::tokens([id("<eos>")]), ..Default::default() };
    let (tokens, text, reason) = run(&script, options);
    assert_eq!(tokens, vec![id("Hel")]);
    assert_eq!(text, "Hel");
    assert_eq!(reason, FinishReason::Stop(Stopped::Token(id("<eos>"))));
}

#[test]
fn min_tokens_bans_endings_until_reached() {
    let tok = tokenizer();
    // The script wants EOS first; the runner-up is "Hel".
    let script = [EOS, id("Hel"), id("ld"), EOS];
    let options = GenerateOptions { min_tokens: 1, ..Default::default() };
    let (tokens, _, reason) = run(&script, options);
    assert_eq!(tokens[0], id("Hel"), "EOS has zero probability before min_tokens");
    assert_eq!(reason, FinishReason::EndOfSequence);

    // A stop string completed before min_tokens does not end generation.
    let script = [id("Hel"), id("ld"), id("Hel"), EOS];
    let options = GenerateOptions { min_tokens: 2, stop: Stop::strings(&tok, ["Hel"]).unwrap(), ..Default::default() };
    let (tokens, text, reason) = run(&script, options);
    assert_eq!(tokens, vec![id("Hel"), id("ld"), id("Hel")]);
    assert_eq!(text, "Helld");
    assert_eq!(reason, FinishReason::Stop(Stopped::String { index: 0, cut: 3 }));
}

#[test]
fn ignore_eos_makes_eos_ordinary() {
    let script = [id("Hel"), EOS, id("ld"), EOS, EOS, EOS];
    let options = GenerateOptions { ignore_eos: true, max_tokens: 3, ..Default::default() };
    let (tokens, _, reason) = run(&script, options);
    assert_eq!(tokens, vec![id("Hel"), EOS, id("ld")]);
    assert_eq!(reason, FinishReason::Length);
}

#[test]
fn logprobs_of_each_yielded_token() {
    let tok = tokenizer();
    let prompt = [1u32, 2, 3];
    let script = [id("Hel"), id("ld"), EOS];
    let m = model(&script, prompt.len());
    let mut g = generate(&m, &prompt, GenerateOptions { logprobs: Some(3), ..Default::default() }).unwrap();
    let tokens: Vec<u32> = g.by_ref().map(|t| t.unwrap()).collect();
    let lp = g.logprobs();
    assert_eq!(lp.len(), tokens.len());
    for (entry, &t) in lp.iter().zip(&tokens) {
        assert_eq!(entry.token, t);
        assert_eq!(entry.top.len(), 3);
        assert_eq!(entry.top[0].0, t);
        assert!(entry.top.windows(2).all(|w| w[0].1 >= w[1].1));
        assert!(entry.logprob <= 0.0 && (entry.logprob - entry.top[0].1).abs() < 1e-6);
    }
    let too_many = GenerateOptions { logprobs: Some(21), ..Default::default() };
    assert!(generate(&m, &prompt, too_many).err().unwrap().to_string().contains("at most 20"));
    let _ = tok;
}

#[test]
fn seeds_reproduce_whatever_else_runs() {
    // A flat script: every token is equally likely, so sampling is pure randomness.
    let prompt = [1u32];
    let sampled = GenerateOptions {
        sampler: Sampler { temperature: 1.0, ..Default::default() },
        seed: Some(7),
        ignore_eos: true,
        max_tokens: 16,
        ..Default::default()
    };
    let alone = {
        let m = model(&[], 1);
        generate(&m, &prompt, sampled.clone()).unwrap().map(|t| t.unwrap()).collect::<Vec<_>>()
    };
    // Interleave the same request with another seeded one.
    let (m1, m2) = (model(&[], 1), model(&[], 1));
    let mut a = generate(&m1, &prompt, sampled.clone()).unwrap();
    let mut b = generate(&m2, &prompt, GenerateOptions { seed: Some(8), ..sampled.clone() }).unwrap();
    let mut together = vec![];
    for _ in 0..16 {
        together.push(a.next().unwrap().unwrap());
        b.next();
    }
    assert_eq!(alone, together);
    assert!(alone.iter().collect::<std::collections::HashSet<_>>().len() > 4, "{alone:?} is not random");
}

#[test]
fn invalid_settings_name_the_field() {
    let tok = tokenizer();
    let m = model(&[], 1);
    let cases: Vec<(GenerateOptions, &str)> = vec![
        (
            GenerateOptions { sampler: Sampler { xtc_threshold: 0.6, ..Default::default() }, ..Default::default() },
            "xtc_threshold",
        ),
        (
            GenerateOptions { sampler: Sampler { xtc_probability: 1.5, ..Default::default() }, ..Default::default() },
            "xtc_probability",
        ),
        (GenerateOptions { sampler: Sampler { top_k: VOCAB, ..Default::default() }, ..Default::default() }, "top_k"),
        (
            GenerateOptions {
                processors: nuvec_lm::LogitsProcessors { repetition_penalty: Some(-1.0), ..Default::default() },
                ..Default::default()
            },
            "repetition_penalty",
        ),
        (
            GenerateOptions {
                processors: nuvec_lm::LogitsProcessors { logit_bias: vec![(VOCAB as u32, 1.0)], ..Default::default() },
                ..Default::default()
            },
            "logit_bias",
        ),
        (GenerateOptions { stop: Stop::tokens([VOCAB as u32 + 5]), ..Default::default() }, "stop token"),
    ];
    for (options, field) in cases {
        let err = generate(&m, &[1], options).err().unwrap().to_string();
        assert!(err.contains(field), "{err}");
    }
    let too_many: Vec<String> = (0..65).map(|i| format!("s{i}")).collect();
    assert!(Stop::strings(&tok, &too_many).unwrap_err().to_string().contains("at most 64"));
    assert!(Stop::strings(&tok, [""]).unwrap_err().to_string().contains("1 to 1024 bytes"));
    assert!(Stop::strings(&tok, ["x".repeat(1025)]).unwrap_err().to_string().contains("1 to 1024 bytes"));
}
