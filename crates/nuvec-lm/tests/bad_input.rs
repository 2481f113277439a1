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
    // Refused up front, before the model runs.
    let err = nuvec_lm::generate(&model, &[99], GenerateOptions::default()).err().unwrap().to_string();
    assert!(err.contains("prompt token 99 is outside the vocabulary of 64"), "{err}");
}

/// The hub cache tests share one test, as HF_HUB_CACHE is process-wide.
#[test]
fn hub_cache_lookups() {
    let hub = std::env::temp_dir().join(format!("nuvec-hub-{}", std::process::id()));
    std::fs::remove_dir_all(&hub).ok();
    std::env::set_var("HF_HUB_CACHE", &hub);
    // Offline: a repo id not in the cache is an error naming it, not a download.
    std::env::set_var("HF_HUB_OFFLINE", "1");
    let err = nuvec_lm::load("nobody/no-such-model").unwrap_err().to_string();
    assert_mentions(&err, &["nobody/no-such-model", "Hugging Face cache", "downloads are off", "HF_HUB_OFFLINE"]);

    // refs/main must name a snapshot inside the repo's cache directory.
    let c = checkpoint("hub-outside", config(), tensors());
    let repo = hub.join("models--org--tiny");
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(repo.join("snapshots/abc123")).unwrap();
    let outside = c.dir.display().to_string();
    for bad in ["../../../../../../../..".to_string() + &outside, outside.clone(), "a/b".into(), "..".into()] {
        std::fs::write(repo.join("refs/main"), &bad).unwrap();
        let err = nuvec_lm::load("org/tiny").unwrap_err().to_string();
        assert_mentions(&err, &["refs/main", "not a commit hash"]);
    }
    // A snapshot that is a symlink out of the cache.
    std::fs::write(repo.join("refs/main"), "def456").unwrap();
    std::os::unix::fs::symlink(&c.dir, repo.join("snapshots/def456")).unwrap();
    let err = nuvec_lm::load("org/tiny").unwrap_err().to_string();
    assert_mentions(&err, &["refs/main", "def456", "outside"]);
    // A snapshot file linked out of the cache (they link into blobs/, inside it).
    std::fs::write(repo.join("refs/main"), "abc123").unwrap();
    let blobs = repo.join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(c.dir.join(f), blobs.join(f)).unwrap();
        std::os::unix::fs::symlink(format!("../../blobs/{f}"), repo.join("snapshots/abc123").join(f)).unwrap();
    }
    nuvec_lm::load("org/tiny").expect("a snapshot linking into blobs/ loads");
    std::os::unix::fs::symlink(c.dir.join("config.json"), repo.join("snapshots/abc123/generation_config.json"))
        .unwrap();
    let err = nuvec_lm::load("org/tiny").unwrap_err().to_string();
    assert_mentions(&err, &["refs/main", "generation_config.json", "outside"]);
    std::fs::remove_dir_all(&hub).ok();
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

#[test]
fn values_no_model_can_run_with() {
    for (name, key, value) in [
        ("eps0", "rms_norm_eps", json!(0.0)),
        ("eps-neg", "rms_norm_eps", json!(-1e-5)),
        ("theta0", "rope_theta", json!(0.0)),
        ("theta-neg", "rope_theta", json!(-10000.0)),
        ("layers0", "num_hidden_layers", json!(0)),
    ] {
        let mut cfg = config();
        cfg[key] = value;
        let c = checkpoint(name, cfg, tensors());
        assert_mentions(&load_err(&c.dir), &["config.json", key]);
    }
    let mut cfg = config();
    cfg["rope_scaling"] = json!({"rope_type": "default", "rope_theta": -1.0});
    let c = checkpoint("theta-nested", cfg, tensors());
    assert_mentions(&load_err(&c.dir), &["config.json", "rope_scaling.rope_theta"]);
}

#[test]
fn norms_with_nan_or_infinity() {
    for (name, bad) in [("nan", f32::NAN), ("inf", f32::INFINITY)] {
        let mut t = tensors();
        let mut values = vec![1f32; 32];
        values[3] = bad;
        t[2].1 = Array::from_slice(&values, &[32]).unwrap();
        let c = checkpoint(name, config(), t);
        assert_mentions(&load_err(&c.dir), &["model.safetensors", "input_layernorm.weight", "NaN or infinite"]);
    }
}

#[test]
fn eos_outside_the_vocabulary() {
    let mut cfg = config();
    cfg["eos_token_id"] = json!([1, 64]);
    let c = checkpoint("eos", cfg, tensors());
    assert_mentions(&load_err(&c.dir), &["config.json", "eos_token_id", "64", "outside the vocabulary"]);
    let c = checkpoint("eos-generation", config(), tensors());
    std::fs::write(c.dir.join("generation_config.json"), r#"{"eos_token_id": 1000}"#).unwrap();
    assert_mentions(&load_err(&c.dir), &["generation_config.json", "eos_token_id", "1000"]);
}

#[test]
fn tensors_the_model_does_not_use() {
    let mut t = tensors();
    for i in 0..7 {
        t.push((format!("model.layers.0.extra_{i}.weight"), Array::from_slice(&[0f32; 4], &[4]).unwrap()));
    }
    let c = checkpoint("extra", config(), t);
    let err = load_err(&c.dir);
    assert_mentions(&err, &["7 tensors are not used", "model.layers.0.extra_0.weight", "and 2 more", "model_type"]);
    // What mlx-lm's llama sanitize drops loads: rotary inv_freq, and lm_head when tied.
    let mut t = tensors();
    t.push(("model.layers.0.self_attn.rotary_emb.inv_freq".into(), Array::from_slice(&[0f32; 8], &[8]).unwrap()));
    t.push(("lm_head.weight".into(), Array::from_slice(&vec![0f32; 64 * 32], &[64, 32]).unwrap()));
    let c = checkpoint("sanitized", config(), t);
    nuvec_lm::load_dir(&c.dir).expect("tensors mlx-lm drops are skipped");
}

#[test]
fn shard_index_that_leaves_the_directory() {
    let c = checkpoint("index", config(), tensors());
    let outside = checkpoint("index-outside", config(), tensors());
    let absolute = outside.dir.join("model.safetensors").display().to_string();
    for shard in [absolute.as_str(), "../elsewhere/model.safetensors", "sub/../../model.safetensors"] {
        let index = json!({"weight_map": {"model.embed_tokens.weight": shard}});
        std::fs::write(c.dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
        let err = load_err(&c.dir);
        assert_mentions(&err, &["model.safetensors.index.json", "weight_map.model.embed_tokens.weight", "leaves"]);
    }
}
