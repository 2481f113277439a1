//! Bad checkpoints and settings give clear errors naming the file and the field; nothing panics.
//! Each test builds a tiny Llama checkpoint of its own and breaks one thing.

use std::path::{Path, PathBuf};

use nuvec::io::save_safetensors;
use nuvec::Array;
use serde_json::{json, Value};

struct Checkpoint {
    dir: PathBuf,
}

impl Drop for Checkpoint {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

fn config() -> Value {
    json!({
        "model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1, "intermediate_size": 64,
        "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-5, "vocab_size": 64,
        "tie_word_embeddings": true
    })
}

fn tensors() -> Vec<(String, Array)> {
    let t = |name: &str, shape: &[usize]| {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n).map(|i| ((i * 7919 % 101) as f32 - 50.0) / 500.0).collect();
        (name.to_string(), Array::from_slice(&values, shape).unwrap())
    };
    vec![
        t("model.embed_tokens.weight", &[64, 32]),
        t("model.norm.weight", &[32]),
        t("model.layers.0.input_layernorm.weight", &[32]),
        t("model.layers.0.post_attention_layernorm.weight", &[32]),
        t("model.layers.0.self_attn.q_proj.weight", &[32, 32]),
        t("model.layers.0.self_attn.k_proj.weight", &[16, 32]),
        t("model.layers.0.self_attn.v_proj.weight", &[16, 32]),
        t("model.layers.0.self_attn.o_proj.weight", &[32, 32]),
        t("model.layers.0.mlp.gate_proj.weight", &[64, 32]),
        t("model.layers.0.mlp.up_proj.weight", &[64, 32]),
        t("model.layers.0.mlp.down_proj.weight", &[32, 64]),
    ]
}

const TOKENIZER: &str = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
"model":{"type":"WordLevel","vocab":{"<unk>":0,"hello":1,"world":2},"unk_token":"<unk>"}}"#;

fn checkpoint(name: &str, config: Value, tensors: Vec<(String, Array)>) -> Checkpoint {
    let dir = std::env::temp_dir().join(format!("nuvec-bad-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    save_safetensors(dir.join("model.safetensors"), &tensors, None).unwrap();
    std::fs::write(dir.join("tokenizer.json"), TOKENIZER).unwrap();
    Checkpoint { dir }
}

fn load_err(dir: &Path) -> String {
    match nuvec_lm::load_dir(dir) {
        Ok(_) => panic!("{} loaded, but it is broken", dir.display()),
        Err(e) => e.to_string(),
    }
}

fn assert_mentions(err: &str, parts: &[&str]) {
    for p in parts {
        assert!(err.contains(p), "error {err:?} does not mention {p:?}");
    }
}

#[test]
fn the_good_checkpoint_loads_and_runs() {
    let c = checkpoint("good", config(), tensors());
    let (model, tokenizer) = nuvec_lm::load_dir(&c.dir).unwrap();
    let ids = tokenizer.encode("hello world", true).unwrap();
    assert_eq!(ids, vec![1, 2]);
    let mut cache = model.new_cache();
    let logits = model.forward(&ids, &mut cache).unwrap();
    assert_eq!(logits.shape(), &[2, 64]);
}

#[test]
fn missing_config() {
    let c = checkpoint("noconfig", config(), tensors());
    std::fs::remove_file(c.dir.join("config.json")).unwrap();
    assert_mentions(&load_err(&c.dir), &["config.json"]);
}

#[test]
fn broken_config_json() {
    let c = checkpoint("brokenjson", config(), tensors());
    std::fs::write(c.dir.join("config.json"), "{\"model_type\": \"llama\",").unwrap();
    assert_mentions(&load_err(&c.dir), &["config.json", "not valid JSON"]);
}

#[test]
fn missing_and_mistyped_fields() {
    let mut cfg = config();
    cfg.as_object_mut().unwrap().remove("hidden_size");
    let c = checkpoint("nohidden", cfg, tensors());
    assert_mentions(&load_err(&c.dir), &["config.json", "hidden_size", "missing"]);

    let mut cfg = config();
    cfg["num_attention_heads"] = json!("two");
    let c = checkpoint("badheads", cfg, tensors());
    assert_mentions(&load_err(&c.dir), &["config.json", "num_attention_heads", "integer"]);
}

#[test]
fn unknown_model_type() {
    let mut cfg = config();
    cfg["model_type"] = json!("gptj");
    let c = checkpoint("gptj", cfg, tensors());
    assert_mentions(&load_err(&c.dir), &["config.json", "gptj", "llama"]);
}

#[test]
fn unsupported_quantization() {
    for (name, q, field) in [
        ("bits7", json!({"bits": 7, "group_size": 64}), "bits = 7"),
        ("group48", json!({"bits": 4, "group_size": 48}), "group_size = 48"),
        ("modefoo", json!({"bits": 4, "group_size": 64, "mode": "foo"}), "foo"),
    ] {
        let mut cfg = config();
        cfg["quantization"] = q;
        let c = checkpoint(name, cfg, tensors());
        assert_mentions(&load_err(&c.dir), &["config.json", "quantization", field]);
    }
}

#[test]
fn wrong_tensor_shape_and_dtype() {
    let mut t = tensors();
    t[4].1 = Array::from_slice(&vec![0f32; 16 * 32], &[16, 32]).unwrap();
    let c = checkpoint("shape", config(), t);
    assert_mentions(&load_err(&c.dir), &["model.safetensors", "q_proj.weight", "[16, 32]", "[32, 32]"]);

    let mut t = tensors();
    t[1].1 = Array::from_slice(&[0i32; 32], &[32]).unwrap();
    let c = checkpoint("dtype", config(), t);
    assert_mentions(&load_err(&c.dir), &["model.safetensors", "model.norm.weight", "int32"]);
}

#[test]
fn missing_tensor() {
    let mut t = tensors();
    t.retain(|(n, _)| !n.contains("down_proj"));
    let c = checkpoint("missing", config(), t);
    assert_mentions(&load_err(&c.dir), &["down_proj.weight", "missing"]);
}

#[test]
fn truncated_safetensors() {
    let c = checkpoint("truncated", config(), tensors());
    let path = c.dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
    assert_mentions(&load_err(&c.dir), &["model.safetensors", "truncated"]);
    std::fs::write(&path, &bytes[..5]).unwrap();
    assert_mentions(&load_err(&c.dir), &["model.safetensors"]);
}

#[test]
fn tokenizer_that_does_not_parse() {
    let c = checkpoint("tok", config(), tensors());
    std::fs::write(c.dir.join("tokenizer.json"), "{\"model\": 3}").unwrap();
    assert_mentions(&load_err(&c.dir), &["tokenizer.json", "does not parse"]);
    std::fs::remove_file(c.dir.join("tokenizer.json")).unwrap();
    assert_mentions(&load_err(&c.dir), &["tokenizer.json", "missing"]);
}

#[test]
fn chat_templates_that_fail() {
    let c = checkpoint("template", config(), tensors());
    std::fs::write(
        c.dir.join("tokenizer_config.json"),
        json!({"chat_template": "{% for m in messages %}"}).to_string(),
    )
    .unwrap();
    assert_mentions(&load_err(&c.dir), &["chat template", "does not parse"]);

    let raising =
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}ok";
    std::fs::write(c.dir.join("tokenizer_config.json"), json!({"chat_template": raising}).to_string()).unwrap();
    let (_, tokenizer) = nuvec_lm::load_dir(&c.dir).unwrap();
    let template = tokenizer.chat_template().unwrap();
    let err =
        template.render(&[nuvec_lm::Message::new("system", "x")], true, &Default::default()).unwrap_err().to_string();
    assert_mentions(&err, &["chat template", "System role not supported"]);
    assert_eq!(template.render(&[nuvec_lm::Message::new("user", "x")], true, &Default::default()).unwrap(), "ok");
}

#[test]
fn invalid_sampler_settings() {
    use nuvec_lm::{GenerateOptions, Sampler};
    for (sampler, field) in [
        (Sampler { temperature: -1.0, ..Default::default() }, "temperature"),
        (Sampler { top_p: 1.5, ..Default::default() }, "top_p"),
        (Sampler { min_p: -0.1, ..Default::default() }, "min_p"),
        (Sampler { min_tokens_to_keep: 0, ..Default::default() }, "min_tokens_to_keep"),
    ] {
        let err = GenerateOptions { sampler, ..Default::default() }.validate().unwrap_err().to_string();
        assert!(err.contains(field), "{err}");
    }
    let c = checkpoint("empty-prompt", config(), tensors());
    let (model, _) = nuvec_lm::load_dir(&c.dir).unwrap();
    let err = nuvec_lm::generate(&model, &[], GenerateOptions::default()).err().unwrap().to_string();
    assert!(err.contains("prompt is empty"), "{err}");
    let err =
        nuvec_lm::generate(&model, &[99], GenerateOptions::default()).unwrap().next().unwrap().unwrap_err().to_string();
    assert!(err.contains("outside the vocabulary"), "{err}");
}

#[test]
fn repo_id_not_in_cache() {
    std::env::set_var("HF_HUB_CACHE", std::env::temp_dir().join("nuvec-empty-hub"));
    let err = nuvec_lm::load("nobody/no-such-model").unwrap_err().to_string();
    assert_mentions(&err, &["nobody/no-such-model", "Hugging Face cache", "does not download"]);
}

#[test]
fn unconvertible_hf_quantizations() {
    for (name, q, words) in [
        ("fp8", json!({"quant_method": "fp8"}), vec!["fp8", "mlx_lm.convert"]),
        ("compressed", json!({"quant_method": "compressed-tensors"}), vec!["compressed-tensors", "mlx_lm.convert"]),
        ("awq3", json!({"quant_method": "awq", "bits": 3, "group_size": 64}), vec!["AutoAWQ", "3 bits"]),
        ("gptq2", json!({"quant_method": "gptq", "bits": 2, "group_size": 64}), vec!["bits", "4 or 8"]),
        ("gptq-g48", json!({"quant_method": "gptq", "bits": 4, "group_size": 48}), vec!["group_size", "48"]),
    ] {
        let mut cfg = config();
        cfg["quantization_config"] = q;
        let c = checkpoint(name, cfg, tensors());
        assert_mentions(&load_err(&c.dir), &words);
    }
}

#[test]
fn act_order_gptq_is_refused() {
    // A 4-bit GPTQ q_proj whose g_idx permutes the groups.
    let mut cfg = config();
    cfg["quantization_config"] = json!({"quant_method": "gptq", "bits": 4, "group_size": 32});
    let mut t = tensors();
    t.retain(|(n, _)| n != "model.layers.0.self_attn.q_proj.weight");
    let mut g_idx = vec![0i32; 32];
    g_idx[0] = 1; // channel 0 in group 1: not i / group_size
    t.push((
        "model.layers.0.self_attn.q_proj.qweight".into(),
        Array::from_slice(&vec![0i32; 4 * 32], &[4, 32]).unwrap(),
    ));
    t.push(("model.layers.0.self_attn.q_proj.qzeros".into(), Array::from_slice(&[0i32; 4], &[1, 4]).unwrap()));
    t.push(("model.layers.0.self_attn.q_proj.scales".into(), Array::from_slice(&[0.01f32; 32], &[1, 32]).unwrap()));
    t.push(("model.layers.0.self_attn.q_proj.g_idx".into(), Array::from_slice(&g_idx, &[32]).unwrap()));
    let c = checkpoint("actorder", cfg, t);
    assert_mentions(&load_err(&c.dir), &["g_idx", "act-order", "mlx_lm.convert"]);
}
