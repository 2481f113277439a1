//! GGUFs of llama.cpp's `gemma4` architecture load as mlx-lm's `gemma4_text` and answer as
//! mlx-lm does on the dense f32 checkpoint of the same values (recorded by
//! `scripts/oracle/more/gguf_gemma4.py`, written as llama.cpp's converter writes them: sliding
//! layers from `attention.sliding_window_pattern`, per-layer `feed_forward_length` and
//! `head_count_kv` arrays, the full layers' proportional rope as `rope_freqs`, the experts' gate
//! and up rows fused, the router's scales renamed, the `gemma4` tokenizer): the tokenizer
//! encodes the prompt to the recorded ids, the logits are within f32 rounding teacher-forced and
//! the greedy tokens equal mlx-lm's; `nuvec convert` writes each as an MLX checkpoint that mlx-lm
//! loads and answers from with the same tokens.
//!
//! - `gguf-gemma4`: sliding and full layers, KV-shared layers with double-wide MLPs, per-layer
//!   inputs, soft-capping, tied embeddings.
//! - `gguf-gemma4moe`: the mixture of experts beside the dense MLP, values that are the keys on
//!   full layers (no `attn_v`, one key/value head there).

mod common;

use common::gguf_oracle::{answers_like_mlx_lm, converts_to_checkpoints_mlx_lm_answers_from};
use nuvec_lm::gguf_tokenizer::load_gguf_tokenizer;

#[test]
fn gemma4_gguf_answers_like_mlx_lm() {
    answers_like_mlx_lm("gguf-gemma4", "gemma4_text");
}

#[test]
fn gemma4_gguf_converts_to_checkpoints_mlx_lm_answers_from() {
    converts_to_checkpoints_mlx_lm_answers_from("gguf-gemma4");
}

#[test]
fn gemma4moe_gguf_answers_like_mlx_lm() {
    answers_like_mlx_lm("gguf-gemma4moe", "gemma4_text");
}

#[test]
fn gemma4moe_gguf_converts_to_checkpoints_mlx_lm_answers_from() {
    converts_to_checkpoints_mlx_lm_answers_from("gguf-gemma4moe");
}

/// The `gemma4` vocabulary (pieces with "▁" for spaces, byte fallback, the merges written out)
/// encodes texts to transformers' ids for the tokenizer.json it was converted from — spaces,
/// runs of spaces and newlines, tabs, accents, CJK, emoji (byte fallback), special tokens in the
/// text — with and without BOS, and decodes them back; generation ends at `<eos>` and at the end
/// of a turn.
#[test]
fn gemma4_tokenizer_matches_transformers() {
    let dir = common::fixtures().join("gguf-gemma4");
    let tokenizer = load_gguf_tokenizer(&dir.join("model.gguf")).unwrap();
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_cases.json")).unwrap()).unwrap();
    let cases = cases.as_array().unwrap();
    assert!(cases.len() >= 10);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want = common::ids(&case["ids"]);
        assert_eq!(tokenizer.encode(text, false).unwrap(), want, "{text:?}");
        assert_eq!(tokenizer.encode(text, true).unwrap(), common::ids(&case["ids_with_bos"]), "{text:?} with BOS");
        assert_eq!(tokenizer.decode(&want).unwrap(), text, "{text:?} decoded");
    }
}

/// Generation ends at the file's EOS and at the end-of-turn tokens llama.cpp ends a Gemma turn
/// with: the fixture's EOS is `<end_of_turn>` (106); with it set to `<eos>` (1), 106 still ends.
#[test]
fn gemma4_tokenizer_ends_at_the_end_of_a_turn() {
    let valid = std::fs::read(common::fixtures().join("gguf-gemma4/model.gguf")).unwrap();
    let key = b"tokenizer.ggml.eos_token_id";
    let at = valid.windows(key.len()).position(|w| w == key).expect("present") + key.len() + 4;
    assert_eq!(valid[at..at + 4], 106u32.to_le_bytes());
    let mut bytes = valid.clone();
    bytes[at..at + 4].copy_from_slice(&1u32.to_le_bytes());
    let path = std::env::temp_dir().join(format!("nuvec-gemma4-eos-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let tokenizer = load_gguf_tokenizer(&path).unwrap();
    std::fs::remove_file(&path).ok();
    let mut eos = tokenizer.eos_token_ids().to_vec();
    eos.sort();
    assert_eq!(eos, [1, 106]);
}

/// Metadata that cannot describe the model gives an error naming the key.
#[test]
fn gemma4_metadata_that_cannot_be_right() {
    let valid = std::fs::read(common::fixtures().join("gguf-gemma4/model.gguf")).unwrap();
    let find = |needle: &[u8]| valid.windows(needle.len()).position(|w| w == needle).expect("present") + needle.len();
    // A u32 value follows its key and its 4-byte type.
    let cases: [(&str, u32, &[&str]); 3] = [
        ("gemma4.attention.shared_kv_layers", 8, &["shared_kv_layers = 8", "none of the 8 layers"]),
        ("gemma4.attention.sliding_window", 0, &["sliding_window = 0"]),
        ("gemma4.rope.dimension_count_swa", 8, &["dimension_count_swa = 8", "not mapped"]),
    ];
    for (key, value, words) in cases {
        let mut bytes = valid.clone();
        let at = find(key.as_bytes()) + 4;
        bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
        let path = std::env::temp_dir().join(format!("nuvec-gemma4-{key}-{}.gguf", std::process::id()));
        std::fs::write(&path, &bytes).unwrap();
        let err = match nuvec_lm::load(path.to_str().unwrap()) {
            Ok(_) => panic!("{key}: a broken file loaded"),
            Err(e) => e.to_string(),
        };
        std::fs::remove_file(&path).ok();
        assert!(words.iter().all(|w| err.contains(w)), "{key}: {err}");
    }
}

/// Gemma 4's own vocabulary as llama.cpp ships it (`models/ggml-vocab-gemma-4.gguf`: the real
/// tokenizer, no weights) passes llama.cpp's tokenizer tests for it (`.inp` texts, `.out` ids,
/// without BOS: spaces, tabs and newline runs, accents, Cyrillic, CJK, emoji, code), and ends
/// generation at `<eos>`, `<turn|>` and `<|tool_response>`. `scripts/setup-oracle.sh` takes the
/// three files from the pinned llama-cpp-python sdist (`NUVEC_LLAMA_VOCAB`).
#[test]
fn gemma4_tokenizer_passes_llama_cpp_vocab_tests() {
    let dir = std::path::PathBuf::from(
        std::env::var("NUVEC_LLAMA_VOCAB").expect("NUVEC_LLAMA_VOCAB is not set: run scripts/test.sh"),
    );
    let tokenizer = load_gguf_tokenizer(&dir.join("ggml-vocab-gemma-4.gguf")).unwrap();
    let inputs = std::fs::read_to_string(dir.join("ggml-vocab-gemma-4.gguf.inp")).unwrap();
    let outputs = std::fs::read_to_string(dir.join("ggml-vocab-gemma-4.gguf.out")).unwrap();
    // llama.cpp's test-tokenizer-0: texts separated by this line, one line of ids per text.
    let sep = "\n__ggml_vocab_test__\n";
    let mut texts: Vec<&str> = inputs.split(sep).collect();
    if texts.last() == Some(&"") {
        texts.pop();
    }
    let ids: Vec<Vec<u32>> =
        outputs.lines().map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect()).collect();
    assert_eq!(texts.len(), ids.len());
    assert!(texts.len() > 40);
    for (text, want) in texts.iter().zip(&ids) {
        assert_eq!(&tokenizer.encode(text, false).unwrap(), want, "{text:?}");
    }
    let mut eos = tokenizer.eos_token_ids().to_vec();
    eos.sort();
    let id = |t: &str| tokenizer.encode(t, false).unwrap();
    assert_eq!(id("<turn|>"), [106]);
    assert_eq!(id("<|tool_response>"), [50]);
    assert_eq!(eos, [1, 50, 106]);
}

/// Gemma 4's own chat template, as its real vocabulary GGUF carries it, renders chats (a system
/// turn, several turns, Unicode, no generation prompt, thinking on) exactly as transformers'
/// apply_chat_template does (`gemma4_chats.json`).
#[test]
fn gemma4_chat_template_renders_like_transformers() {
    let dir = std::path::PathBuf::from(
        std::env::var("NUVEC_LLAMA_VOCAB").expect("NUVEC_LLAMA_VOCAB is not set: run scripts/test.sh"),
    );
    let tokenizer = load_gguf_tokenizer(&dir.join("ggml-vocab-gemma-4.gguf")).unwrap();
    let template = tokenizer.chat_template().expect("Gemma 4's vocabulary carries its chat template");
    let path = common::fixtures().join("gguf-gemma4/gemma4_chats.json");
    let records: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let records = records.as_array().unwrap();
    assert!(records.len() >= 6);
    for r in records {
        let mut kwargs = r["kwargs"].as_object().cloned().unwrap_or_default();
        let add_generation_prompt = kwargs.remove("add_generation_prompt").and_then(|v| v.as_bool()).unwrap_or(false);
        let kwargs = tokenizer.template_context(kwargs);
        let rendered = template.render_values(&r["messages"], add_generation_prompt, false, &kwargs).unwrap();
        assert_eq!(rendered, r["rendered"].as_str().unwrap(), "{}", r["label"]);
    }
}
