//! The tokenizer a GGUF file carries in its `tokenizer.ggml.*` metadata, rebuilt as the
//! tokenizer.json it was converted from would describe it: byte-level BPE (`gpt2`, here) and
//! SentencePiece (`llama`, in [`crate::gguf_spm`]).

use std::path::Path;

use nuvec::io::{GgufFile, GgufValue};
use serde_json::{json, Map, Value};

use crate::chat::ChatTemplate;
use crate::gguf::{meta, meta_str};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// The split patterns llama.cpp names by `tokenizer.ggml.pre`, as tokenizer.json pre-tokenizers.
fn pre_tokenizer(pre: &str) -> Option<(Value, bool)> {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |pattern: &str| json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false});
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    // o200k (gpt-oss, GPT-4o): cased words with their contractions, numbers in threes.
    const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    // (pre-tokenizer, ignore_merges)
    Some(match pre {
        "gpt2" | "default" => (byte_level(true), false),
        "smollm" => (
            json!({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level(true)]}),
            false,
        ),
        "llama-bpe" | "llama3" => {
            (json!({"type": "Sequence", "pretokenizers": [split(LLAMA3), byte_level(false)]}), true)
        }
        "qwen2" => (json!({"type": "Sequence", "pretokenizers": [split(QWEN2), byte_level(false)]}), false),
        "gpt-4o" => (json!({"type": "Sequence", "pretokenizers": [split(GPT4O), byte_level(false)]}), true),
        _ => return None,
    })
}

/// Reads only the tokenizer of a GGUF file (its `tokenizer.*` metadata; the tensors are not
/// looked at), with the chat template and end-of-sequence ids the file names.
pub fn load_gguf_tokenizer(path: &Path) -> Result<Tokenizer> {
    tokenizer(&GgufFile::open(path)?)
}

/// The tokenizer a GGUF file describes, built as a tokenizer.json would describe it.
pub(crate) fn tokenizer(file: &GgufFile) -> Result<Tokenizer> {
    let label = file.path().display().to_string();
    match meta_str(file, "tokenizer.ggml.model")? {
        "gpt2" => byte_level_tokenizer(file),
        "llama" => crate::gguf_spm::sentencepiece_tokenizer(file),
        "gemma4" => crate::gguf_spm::gemma4_tokenizer(file),
        model => Err(Error::Unsupported(format!(
            "{label}: GGUF tokenizer model {model:?} is not built yet (byte-level BPE \"gpt2\", \
             SentencePiece \"llama\" and Gemma 4's \"gemma4\" are)"
        ))),
    }
}

/// A byte-level BPE vocabulary (`tokenizer.ggml.model = "gpt2"`) with its merges.
fn byte_level_tokenizer(file: &GgufFile) -> Result<Tokenizer> {
    let label = file.path().display().to_string();
    let pre = file.get("tokenizer.ggml.pre").and_then(GgufValue::as_str).unwrap_or("default");
    let (pre_tokenizer, ignore_merges) = pre_tokenizer(pre)
        .ok_or_else(|| Error::Unsupported(format!("{label}: GGUF pre-tokenizer {pre:?} is not mapped yet")))?;
    let tokens: Vec<&str> = meta(file, "tokenizer.ggml.tokens")?
        .as_array()
        .unwrap_or(&[])
        .iter()
        .map(|t| t.as_str().unwrap_or(""))
        .collect();
    let types: Vec<u64> = file
        .get("tokenizer.ggml.token_type")
        .and_then(GgufValue::as_array)
        .map(|t| t.iter().map(|v| v.as_u64().unwrap_or(1)).collect())
        .unwrap_or_default();
    let merges: Vec<&str> = file
        .get("tokenizer.ggml.merges")
        .and_then(GgufValue::as_array)
        .map(|m| m.iter().filter_map(GgufValue::as_str).collect())
        .unwrap_or_default();
    let mut vocab = Map::new();
    let mut added = vec![];
    for (id, &token) in tokens.iter().enumerate() {
        vocab.entry(token.to_string()).or_insert(id.into());
        // Token types: 3 control, 4 user-defined — both are added tokens, matched whole.
        let kind = types.get(id).copied().unwrap_or(1);
        if kind == 3 || kind == 4 {
            added.push(json!({"id": id, "content": token, "single_word": false, "lstrip": false, "rstrip": false, "normalized": kind == 4, "special": kind == 3}));
        }
    }
    let token_of = |key: &str| {
        file.get(key).and_then(GgufValue::as_u64).and_then(|id| tokens.get(id as usize)).map(|t| t.to_string())
    };
    let bos = token_of("tokenizer.ggml.bos_token_id");
    let eos = token_of("tokenizer.ggml.eos_token_id");
    let add_bos = file.get("tokenizer.ggml.add_bos_token").and_then(GgufValue::as_bool).unwrap_or(false);
    let post_processor = match (&bos, add_bos) {
        (Some(b), true) => {
            let id = file.get("tokenizer.ggml.bos_token_id").and_then(GgufValue::as_u64).unwrap_or(0);
            json!({"type": "TemplateProcessing",
                   "single": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                   "pair": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": b, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                   "special_tokens": {b: {"id": b, "ids": [id], "tokens": [b]}}})
        }
        _ => Value::Null,
    };
    let json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges}
    });
    let inner: tokenizers::Tokenizer = json.to_string().parse().map_err(|e| Error::Tokenizer {
        file: label.clone(),
        message: format!("the GGUF vocabulary does not make a tokenizer: {e}"),
    })?;
    finish(file, inner, bos, eos, &[])
}

/// The parts every vocabulary kind shares: end-of-sequence ids (EOS, EOT, and the vocabulary
/// kind's own `ends`) and the chat template.
pub(crate) fn finish(
    file: &GgufFile,
    inner: tokenizers::Tokenizer,
    bos: Option<String>,
    eos: Option<String>,
    ends: &[u32],
) -> Result<Tokenizer> {
    let label = file.path().display().to_string();
    let vocab = inner.get_vocab_size(true) as u64;
    let mut eos_ids: Vec<u32> = vec![];
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
        if let Some(id) = file.get(key).and_then(GgufValue::as_u64) {
            // An id past the vocabulary can never be sampled: generation would never stop.
            if id >= vocab {
                return Err(Error::config(
                    &label,
                    format!("GGUF metadata {key} = {id} is outside the vocabulary of {vocab} tokens; fix or drop it"),
                ));
            }
            if !eos_ids.contains(&(id as u32)) {
                eos_ids.push(id as u32);
            }
        }
    }
    for &id in ends {
        if !eos_ids.contains(&id) {
            eos_ids.push(id);
        }
    }
    let key = "tokenizer.chat_template";
    let template = match file.get(key) {
        None => None,
        Some(v) => {
            let source = v
                .as_str()
                .ok_or_else(|| Error::config(&label, format!("GGUF metadata {key} is not a string; fix or drop it")))?;
            Some(ChatTemplate::new(source.to_string(), &format!("{label}: {key}"))?)
        }
    };
    Tokenizer::from_parts(inner, label, bos, eos, eos_ids, template)
}
