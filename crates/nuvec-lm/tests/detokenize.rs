//! The text `nuvec generate` prints is the text mlx_lm.generate prints for the same tokens:
//! `TextStream::with_mlx_lm_spacing` against mlx-lm's streaming detokenizers (recorded by
//! scripts/oracle/more/detokenize.py), and the raw stream against the tokenizer's own decoding.

mod common;

use common::{fixtures, ids};
use nuvec_lm::{GenerateOptions, TextStream, Tokenizer};

fn stream(mut text: TextStream, tokens: &[u32]) -> String {
    let mut out: String = tokens.iter().map(|&t| text.push(t)).collect();
    out.push_str(&text.finish());
    out
}

#[test]
fn printed_text_is_mlx_lms() {
    let mut trimmed = 0;
    for name in ["qwen3", "llama3_1", "gptoss", "llama2", "gemma3"] {
        let path = fixtures().join(format!("detokenize/{name}.json"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let record: serde_json::Value = serde_json::from_str(&text).unwrap();
        let tokenizer = Tokenizer::load(&fixtures().join("tokenizers").join(name), &[]).unwrap();
        let options = GenerateOptions::default();
        for case in record["cases"].as_array().unwrap() {
            let tokens = ids(&case["ids"]);
            let printed = case["printed"].as_str().unwrap();
            let ours = stream(TextStream::new(&tokenizer, &options).with_mlx_lm_spacing(), &tokens);
            assert_eq!(ours, printed, "{name} ({}): {:?} -> {tokens:?}", record["detokenizer"], case["text"]);
            let raw = stream(TextStream::new(&tokenizer, &options), &tokens);
            assert_eq!(raw, tokenizer.decode(&tokens).unwrap(), "{name}: the raw stream is the tokenizer's decoding");
            trimmed += usize::from(raw != ours);
        }
    }
    // The recorded cases include texts whose leading space mlx-lm drops.
    assert!(trimmed >= 5, "only {trimmed} cases differ between mlx-lm's text and the raw text");
}
