//! GGUF files with SentencePiece vocabularies (`tokenizer.ggml.model = "llama"`), written as
//! llama.cpp's converter writes them (scripts/oracle/more/gguf_spm.py): the tokenizer nuvec
//! builds from one must give the ids, decoded text and chat prompts that the original
//! tokenizer.json gives through transformers (mlx-lm's TokenizerWrapper), as recorded there.

mod common;

use common::*;
use nuvec_lm::gguf_tokenizer::load_gguf_tokenizer;
use nuvec_lm::StreamDecoder;
use serde_json::Value;

fn records(name: &str, file: &str) -> Vec<Value> {
    let path = fixtures().join("gguf_spm").join(name).join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str::<Value>(&text).unwrap().as_array().unwrap().clone()
}

fn tokenizer(name: &str) -> nuvec_lm::Tokenizer {
    let path = fixtures().join("gguf_spm").join(name).join("tokenizer.gguf");
    load_gguf_tokenizer(&path).unwrap_or_else(|e| panic!("{e}"))
}

fn check_encode(name: &str) {
    let tokenizer = tokenizer(name);
    let mut failures = vec![];
    let recs = records(name, "encode.json");
    for r in &recs {
        let text = r["text"].as_str().unwrap();
        let with = tokenizer.encode(text, true).unwrap();
        let plain = tokenizer.encode(text, false).unwrap();
        if with != ids(&r["ids_with_special"]) {
            failures.push(format!("{text:?} with special tokens:\n  {with:?}\n  {:?}", ids(&r["ids_with_special"])));
        }
        if plain != ids(&r["ids_plain"]) {
            failures.push(format!("{text:?}:\n  {plain:?}\n  {:?}", ids(&r["ids_plain"])));
        }
        let decoded = tokenizer.decode(&ids(&r["ids_plain"])).unwrap();
        if decoded != r["decoded"].as_str().unwrap() {
            failures.push(format!("decode of {text:?}: {decoded:?} != {:?}", r["decoded"]));
        }
        // Token by token, as generation streams it: byte-fallback pieces join into characters.
        let mut stream = StreamDecoder::default();
        let mut streamed: String = ids(&r["ids_plain"]).into_iter().map(|id| stream.push(&tokenizer, id)).collect();
        streamed.push_str(&stream.finish());
        if streamed != r["decoded"].as_str().unwrap() {
            failures.push(format!("streamed decode of {text:?}: {streamed:?} != {:?}", r["decoded"]));
        }
    }
    assert!(recs.len() >= 50, "{name}: only {} records", recs.len());
    assert!(failures.is_empty(), "{name}: {} mismatches:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn llama2_gguf_tokenizes_like_the_original() {
    check_encode("llama2");
}

#[test]
fn gemma3_gguf_tokenizes_like_the_original() {
    check_encode("gemma3");
}

/// Llama 2 with its runs of "▁" sharing one score, as in Meta's tokenizer.model: the ranks
/// among tied merges decide how long runs of spaces split.
#[test]
fn llama2_gguf_with_tied_scores_tokenizes_like_the_original() {
    check_encode("llama2_tied");
}

/// What `nuvec convert` writes as tokenizer.json for a GGUF: the same tokenizer, read back.
#[test]
fn the_tokenizer_json_written_for_a_gguf_reads_back_the_same() {
    for name in ["llama2", "gemma3"] {
        let tokenizer = tokenizer(name);
        let json = tokenizer.inner().to_string(false).unwrap();
        let back: tokenizers::Tokenizer = json.parse().unwrap();
        for r in records(name, "encode.json") {
            let text = r["text"].as_str().unwrap();
            for special in [false, true] {
                let got = back.encode(text, special).unwrap().get_ids().to_vec();
                assert_eq!(got, tokenizer.encode(text, special).unwrap(), "{name}: {text:?}");
            }
            let plain = ids(&r["ids_plain"]);
            assert_eq!(back.decode(&plain, false).unwrap(), tokenizer.decode(&plain).unwrap(), "{name}: {text:?}");
        }
    }
}

#[test]
fn special_tokens_and_eos_ids_come_from_the_file() {
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("gguf_spm").join("summary.json")).unwrap())
            .unwrap();
    for (name, bos, eos) in [("llama2", "<s>", "</s>"), ("gemma3", "<bos>", "<end_of_turn>")] {
        let tokenizer = tokenizer(name);
        assert_eq!(tokenizer.eos_token_ids(), ids(&summary[name]["eos_token_ids"]).as_slice(), "{name}");
        // The same strings tokenizer_config.json names (the chat template reads them).
        assert_eq!((tokenizer.bos_token(), tokenizer.eos_token()), (Some(bos), Some(eos)), "{name}");
        assert_eq!(tokenizer.vocab_size(), summary[name]["tokens"].as_u64().unwrap() as usize, "{name}");
    }
}

#[test]
fn gemma3_chat_template_from_the_gguf_renders_like_transformers() {
    let tokenizer = tokenizer("gemma3");
    let template = tokenizer.chat_template().expect("the GGUF carries Gemma 3's chat template");
    let recs = records("gemma3", "chat.json");
    assert!(recs.len() >= 5, "only {} chat records", recs.len());
    for r in recs {
        let mut kwargs = r["kwargs"].as_object().cloned().unwrap_or_default();
        let add_generation_prompt = kwargs.remove("add_generation_prompt").and_then(|v| v.as_bool()).unwrap_or(false);
        let kwargs = tokenizer.template_context(kwargs);
        let rendered = template.render_values(&r["messages"], add_generation_prompt, false, &kwargs).unwrap();
        assert_eq!(rendered, r["rendered"].as_str().unwrap(), "{}", r["label"]);
        assert_eq!(tokenizer.encode(&rendered, false).unwrap(), ids(&r["ids"]), "{}", r["label"]);
    }
}
