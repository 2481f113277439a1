//! GGUFs of llama.cpp's Qwen3.5 hybrid architectures (`qwen35`, `qwen35moe`) load as mlx-lm's
//! `qwen3_5` / `qwen3_5_moe` and answer as mlx-lm does on the dense f32 checkpoint of the same
//! values (recorded by `scripts/oracle/more/gguf_qwen35.py`, written as llama.cpp's converter
//! writes them: `ssm_a` as -exp(A_log), the value heads tiled in every linear-attention tensor,
//! `ssm_out`'s columns included, the convolution squeezed, the norms as 1 + w): the tokenizer
//! encodes the prompt to the recorded ids, the logits are within f32 rounding teacher-forced and
//! the greedy tokens equal mlx-lm's; `nuvec convert` writes each as an MLX checkpoint that mlx-lm
//! loads and answers from with the same tokens, and with `-d` (in f32) as a dense one that
//! answers as the oracle's own checkpoint.
//!
//! - `qwen35`: Gated DeltaNet layers and gated full attention every second layer, a dense MLP.
//! - `qwen35moe`: the same with 8 stacked experts and a shared expert under its sigmoid gate.

mod common;

use common::gguf_oracle::{answers_like_mlx_lm, converts_to_checkpoints_mlx_lm_answers_from};

#[test]
fn qwen35_gguf_answers_like_mlx_lm() {
    answers_like_mlx_lm("gguf-qwen35", "qwen3_5");
}

#[test]
fn qwen35_gguf_converts_to_checkpoints_mlx_lm_answers_from() {
    converts_to_checkpoints_mlx_lm_answers_from("gguf-qwen35");
}

#[test]
fn qwen35moe_gguf_answers_like_mlx_lm() {
    answers_like_mlx_lm("gguf-qwen35moe", "qwen3_5_moe");
}

#[test]
fn qwen35moe_gguf_converts_to_checkpoints_mlx_lm_answers_from() {
    converts_to_checkpoints_mlx_lm_answers_from("gguf-qwen35moe");
}

/// Metadata that cannot describe the file's tensors gives an error naming the key: value heads
/// that are not a multiple of the key heads, and recurrent-layer flags that are not the pattern
/// `full_attention_interval` gives (the one the model runs).
#[test]
fn qwen35_metadata_that_cannot_be_right() {
    let valid = std::fs::read(common::fixtures().join("gguf-qwen35/model.gguf")).unwrap();
    let find = |needle: &[u8]| valid.windows(needle.len()).position(|w| w == needle).expect("present") + needle.len();
    // A u32 value follows its key and its 4-byte type.
    let cases: [(&str, &[u8], &[&str]); 2] = [
        (
            "qwen35.ssm.time_step_rank",
            b"qwen35.ssm.time_step_rank",
            &["time_step_rank = 3", "multiple of the key heads"],
        ),
        ("qwen35.full_attention_interval", b"qwen35.full_attention_interval", &["recurrent_layers", "not mapped"]),
    ];
    for (name, key, words) in cases {
        let mut bytes = valid.clone();
        let at = find(key) + 4;
        bytes[at..at + 4].copy_from_slice(&3u32.to_le_bytes());
        let path = std::env::temp_dir().join(format!("nuvec-qwen35-{name}-{}.gguf", std::process::id()));
        std::fs::write(&path, &bytes).unwrap();
        let err = match nuvec_lm::load(path.to_str().unwrap()) {
            Ok(_) => panic!("{name}: a broken file loaded"),
            Err(e) => e.to_string(),
        };
        std::fs::remove_file(&path).ok();
        assert!(words.iter().all(|w| err.contains(w)), "{name}: {err}");
    }
}
