//! `convert` writes checkpoints that mlx-lm loads and answers from exactly as nuvec does: the
//! SmolLM2 GGUF converted to MLX format (exact, no re-quantization), and an f32 checkpoint
//! quantized by nuvec with MLX's own algorithm (bit-identical to mlx_lm.convert's tensors).

mod common;

use std::path::PathBuf;

use common::gguf_oracle::mlx_lm;
use common::*;
use nuvec::{DType, QuantMode, QuantSpec};
use nuvec_lm::convert::{convert, ConvertOptions};
use nuvec_lm::{generate, GenerateOptions, Message};

fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nuvec-convert-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    dir
}

fn ours(model_path: &str, chat: bool, max_tokens: usize, prompt: &str) -> (Vec<u32>, Vec<u32>) {
    let (model, tokenizer) = nuvec_lm::load(model_path).unwrap();
    let ids = if chat {
        let template = tokenizer.chat_template().unwrap();
        let text = template.render(&[Message::new("user", prompt)], true, &Default::default()).unwrap();
        tokenizer.encode(&text, false).unwrap()
    } else {
        tokenizer.encode(prompt, true).unwrap()
    };
    let tokens = generate(&model, &ids, GenerateOptions { max_tokens, ..Default::default() })
        .unwrap()
        .map(|t| t.unwrap())
        .collect();
    (ids, tokens)
}

#[test]
fn gguf_converts_exactly_and_loads_in_mlx_lm() {
    let gguf = default_gguf();
    let dir = out_dir("smollm2");
    convert(gguf.to_str().unwrap(), &dir, &ConvertOptions::default()).unwrap();

    let question = "What is the capital of France?";
    let from_gguf = ours(gguf.to_str().unwrap(), true, 64, question);
    let from_mlx_dir = ours(dir.to_str().unwrap(), true, 64, question);
    assert_eq!(from_gguf, from_mlx_dir, "the converted checkpoint answers differently from its GGUF");
    let mlx = mlx_lm(&dir, "chat", 64, question);
    assert_eq!(mlx, from_gguf, "mlx-lm on our conversion vs nuvec on the GGUF");

    // The oracle's own exact conversion gives the same answer.
    let oracle = oracle_json(&fixtures().join("smollm2-q4_1"));
    assert_eq!(from_gguf.1, ids(&oracle["greedy_tokens"]));

    // An existing output is refused, as mlx_lm.convert does, unless forced.
    let err = convert(gguf.to_str().unwrap(), &dir, &ConvertOptions::default()).unwrap_err().to_string();
    assert!(err.contains("already exists") && err.contains("--force"), "{err}");
    convert(gguf.to_str().unwrap(), &dir, &ConvertOptions { force: true, ..Default::default() }).unwrap();

    // Dequantized, it has no quantized tensors left and still loads.
    let dense = out_dir("smollm2-dense");
    convert(dir.to_str().unwrap(), &dense, &ConvertOptions { dequantize: true, ..Default::default() }).unwrap();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dense.join("config.json")).unwrap()).unwrap();
    assert!(config.get("quantization").is_none());
    let (model, _) = nuvec_lm::load_dir(&dense).unwrap();
    assert_eq!(model.vocab_size(), 49152);
    std::fs::remove_dir_all(&dir).ok();
    std::fs::remove_dir_all(&dense).ok();
}

#[test]
fn quantizing_matches_mlx_lm_convert() {
    let source = fixtures().join("qwen3-f32");
    let dir = out_dir("qwen3-q4");
    let spec = QuantSpec { mode: QuantMode::Affine, bits: 4, group_size: 64 };
    convert(source.to_str().unwrap(), &dir, &ConvertOptions { quantize: Some(spec), ..Default::default() }).unwrap();

    // Bit-identical to the tensors mlx_lm.convert wrote for the same weights (the oracle's case).
    let theirs = nuvec::io::SafetensorsFile::open(fixtures().join("qwen3-q4g64/model.safetensors")).unwrap();
    let ours_file = nuvec::io::SafetensorsFile::open(dir.join("model.safetensors")).unwrap();
    let mut compared = 0;
    for name in theirs.tensors().keys() {
        let (a, b) = (theirs.array(name).unwrap(), ours_file.array(name).unwrap());
        assert_eq!(a.shape(), b.shape(), "{name}");
        assert_eq!(a.to_f32_vec().unwrap(), b.to_f32_vec().unwrap(), "{name} differs from mlx_lm.convert's");
        compared += 1;
    }
    assert!(compared > 10);

    let prompt = "The capital of France is";
    let mlx = mlx_lm(&dir, "raw", 16, prompt);
    assert_eq!(ours(dir.to_str().unwrap(), false, 16, prompt), mlx);

    // Quantizing twice is refused; so is asking for both directions.
    let again = ConvertOptions { quantize: Some(spec), force: true, ..Default::default() };
    let err = convert(dir.to_str().unwrap(), &out_dir("twice"), &again).unwrap_err().to_string();
    assert!(err.contains("already quantized"), "{err}");
    let both = ConvertOptions { quantize: Some(spec), dequantize: true, ..Default::default() };
    assert!(convert(source.to_str().unwrap(), &out_dir("both"), &both).is_err());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn casting_to_bf16() {
    let source = fixtures().join("qwen3-f32");
    let dir = out_dir("qwen3-bf16");
    convert(source.to_str().unwrap(), &dir, &ConvertOptions { dtype: Some(DType::BF16), ..Default::default() })
        .unwrap();
    let file = nuvec::io::SafetensorsFile::open(dir.join("model.safetensors")).unwrap();
    assert!(file.tensors().values().all(|t| t.dtype == DType::BF16));
    let prompt = "The capital of France is";
    let (_, mlx) = mlx_lm(&dir, "raw", 4, prompt);
    assert_eq!(mlx.len(), 4, "mlx-lm loads the bf16 conversion");
    nuvec_lm::load_dir(&dir).unwrap();
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn awq_and_gptq_convert_to_mlx_affine() {
    for case in ["llama-awq4", "llama-gptq8"] {
        let source = fixtures().join(case);
        let dir = out_dir(case);
        convert(source.to_str().unwrap(), &dir, &ConvertOptions::default()).unwrap();
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
        assert!(config["quantization"]["bits"].is_u64(), "{case}: {}", config["quantization"]);
        let oracle = oracle_json(&source);
        let prompt = oracle["prompt"].as_str().unwrap();
        let (ids_ours, ours_tokens) = ours(dir.to_str().unwrap(), false, 16, prompt);
        assert_eq!(ours_tokens, ids(&oracle["greedy_tokens"])[..16], "{case}: converted checkpoint vs the oracle");
        // mlx-lm reads the conversion as the same weights (its scales are f32, so it computes in f32).
        assert_eq!(mlx_lm(&dir, "raw", 16, prompt), (ids_ours, ours_tokens), "{case}: mlx-lm on our conversion");
        std::fs::remove_dir_all(&dir).ok();
    }
}

/// A mixture-of-experts checkpoint (experts stacked in 3-D tensors, as mlx-lm writes Qwen3-MoE):
/// `-q` quantizes the stacks as mlx_lm.convert does (bit for bit its tensors, the router at 8
/// bits as its `quant_predicate` keeps it; mlx-lm answers from the result as nuvec does), and `-d` writes
/// quantized ones dense in their stacked shape, answering as mlx-lm's record of the quantized
/// original up to f32 rounding.
#[test]
fn stacked_experts_convert_both_ways() {
    let source = fixtures().join("qwen3_moe-f32");
    let dir = out_dir("moe-q4");
    let spec = QuantSpec { mode: QuantMode::Affine, bits: 4, group_size: 64 };
    convert(source.to_str().unwrap(), &dir, &ConvertOptions { quantize: Some(spec), ..Default::default() }).unwrap();
    let theirs = nuvec::io::SafetensorsFile::open(fixtures().join("qwen3_moe-q4g64/model.safetensors")).unwrap();
    let ours_file = nuvec::io::SafetensorsFile::open(dir.join("model.safetensors")).unwrap();
    assert_eq!(ours_file.tensors().len(), theirs.tensors().len(), "the same tensors as mlx_lm.convert's");
    for name in theirs.tensors().keys() {
        let (a, b) = (theirs.array(name).unwrap(), ours_file.array(name).unwrap());
        assert_eq!(a.shape(), b.shape(), "{name}");
        assert_eq!(a.to_f32_vec().unwrap(), b.to_f32_vec().unwrap(), "{name} differs from mlx_lm.convert's");
    }
    let prompt = "The capital of France is";
    assert_eq!(ours(dir.to_str().unwrap(), false, 16, prompt), mlx_lm(&dir, "raw", 16, prompt));
    std::fs::remove_dir_all(&dir).ok();

    let source = fixtures().join("qwen3_moe-q4g64");
    let out = out_dir("moe-dense");
    let options = ConvertOptions { dequantize: true, dtype: Some(DType::F32), ..Default::default() };
    convert(source.to_str().unwrap(), &out, &options).unwrap();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert!(config.get("quantization").is_none(), "{config}");
    let (model, _) = nuvec_lm::load(out.to_str().unwrap()).unwrap();
    common::gguf_oracle::check_against_oracle(&model, &ids(&oracle_json(&source)["prompt_ids"]), &source);
    std::fs::remove_dir_all(&out).ok();
}

/// `mlx_lm.convert` run by the oracle's Python on `source` with `args`, into `out`.
fn mlx_lm_convert(source: &std::path::Path, out: &std::path::Path, args: &[&str]) {
    let python = std::env::var("NUVEC_ORACLE_PYTHON").expect("NUVEC_ORACLE_PYTHON is not set: run scripts/test.sh");
    let run = std::process::Command::new(python)
        .args(["-m", "mlx_lm", "convert", "--hf-path"])
        .arg(source)
        .arg("--mlx-path")
        .arg(out)
        .args(args)
        .output()
        .expect("run the oracle's python");
    assert!(
        run.status.success(),
        "mlx_lm.convert failed on {}:\n{}",
        source.display(),
        String::from_utf8_lossy(&run.stderr)
    );
}

/// Qwen3.5 converts as mlx_lm.convert converts it, tensor for tensor and bit for bit: a Hugging
/// Face original cast to bf16 (its language model renamed, convolutions moved to [C, K, 1], the
/// `1 + w` norms stored shifted, A_log left in f32), and an MLX-layout MoE checkpoint quantized
/// to 4 bits (the router and the shared expert's gate at 8); mlx-lm answers from ours as nuvec
/// does.
#[test]
fn qwen3_5_converts_as_mlx_lm_convert_does() {
    let q4 = QuantSpec { mode: QuantMode::Affine, bits: 4, group_size: 64 };
    for (case, dtype, quantize, args) in [
        ("qwen3_5/qwen3_5-hf", Some(DType::BF16), None, &["--dtype", "bfloat16"][..]),
        // In f32, so that mlx-lm and nuvec compute alike (in bf16 mlx-lm rounds every activation).
        ("qwen3_5/qwen3_5_moe-f32", None, Some(q4), &["-q", "--q-bits", "4", "--q-group-size", "64"]),
    ] {
        let source = fixtures().join(case);
        let (ours_dir, theirs_dir) = (out_dir("q35-ours"), out_dir("q35-theirs"));
        mlx_lm_convert(&source, &theirs_dir, args);
        let options = ConvertOptions { dtype, quantize, ..Default::default() };
        convert(source.to_str().unwrap(), &ours_dir, &options).unwrap();
        let tensors = |dir: &std::path::Path| {
            let mut all = std::collections::BTreeMap::new();
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "safetensors") {
                    let file = nuvec::io::SafetensorsFile::open(&path).unwrap();
                    for name in file.tensors().keys() {
                        all.insert(name.clone(), file.array(name).unwrap());
                    }
                }
            }
            all
        };
        let (ours_t, theirs_t) = (tensors(&ours_dir), tensors(&theirs_dir));
        let names = |t: &std::collections::BTreeMap<String, nuvec::Array>| t.keys().cloned().collect::<Vec<_>>();
        assert_eq!(names(&ours_t), names(&theirs_t), "{case}: the tensors mlx_lm.convert writes");
        for (name, theirs) in &theirs_t {
            let ours = &ours_t[name];
            assert_eq!((ours.shape(), ours.dtype()), (theirs.shape(), theirs.dtype()), "{case}: {name}");
            let bits = |a: &nuvec::Array| match a.dtype() {
                DType::U32 => a.to_vec::<u32>().unwrap(),
                _ => a.to_f32_vec().unwrap().iter().map(|v| v.to_bits()).collect(),
            };
            assert!(bits(ours) == bits(theirs), "{case}: {name} differs from mlx_lm.convert's");
        }
        let prompt = "The capital of France is";
        assert_eq!(ours(ours_dir.to_str().unwrap(), false, 12, prompt), mlx_lm(&ours_dir, "raw", 12, prompt), "{case}");
        std::fs::remove_dir_all(&ours_dir).ok();
        std::fs::remove_dir_all(&theirs_dir).ok();
    }
}

#[test]
fn each_stage_reports_its_tensors() {
    // ConvertOptions::progress (what `nuvec convert` draws its bar from on a terminal): each
    // stage's reports count up by one from 0 and end at its total.
    let reports = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, usize, usize)>::new()));
    let sink = std::sync::Arc::clone(&reports);
    let progress = nuvec_lm::convert::ConvertProgress(std::sync::Arc::new(move |stage, done, total| {
        sink.lock().unwrap().push((stage.to_string(), done, total))
    }));
    let spec = QuantSpec { mode: QuantMode::Affine, bits: 4, group_size: 64 };
    let cases = [
        ("qwen3-f32", "Quantize", ConvertOptions { quantize: Some(spec), ..Default::default() }),
        ("qwen3-q4g64", "Dequantize", ConvertOptions { dequantize: true, ..Default::default() }),
    ];
    for (case, stage, options) in cases {
        reports.lock().unwrap().clear();
        let dir = out_dir(&format!("progress-{case}"));
        let options = ConvertOptions { progress: Some(progress.clone()), ..options };
        convert(fixtures().join(case).to_str().unwrap(), &dir, &options).unwrap();
        let got = reports.lock().unwrap().clone();
        let total = got.first().map(|r| r.2).unwrap_or(0);
        assert!(total > 0, "{case}: no reports");
        let want: Vec<(String, usize, usize)> = (0..=total).map(|d| (stage.to_string(), d, total)).collect();
        assert_eq!(got, want, "{case}");
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[test]
fn a_load_reports_each_tensor_once() {
    // LoadOptions::progress (what the CLI draws its load bar from): 1, 2, ... up to what the
    // model reads, each tensor once (a quantized weight's three parts are three), then the
    // checkpoint's total once more when the model is built.
    let reports = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(usize, usize)>::new()));
    let sink = std::sync::Arc::clone(&reports);
    let progress =
        nuvec_lm::LoadProgress(std::sync::Arc::new(move |done, total| sink.lock().unwrap().push((done, total))));
    for case in ["qwen3-f32", "qwen3-q4g64"] {
        reports.lock().unwrap().clear();
        let dir = fixtures().join(case);
        let options = nuvec_lm::LoadOptions { progress: Some(progress.clone()), ..Default::default() };
        nuvec_lm::load_model_with(&dir, &options).unwrap();
        let got = reports.lock().unwrap().clone();
        let total = nuvec::io::SafetensorsFile::open(dir.join("model.safetensors")).unwrap().tensors().len();
        let mut want: Vec<(usize, usize)> = (1..=total).map(|d| (d, total)).collect();
        want.push((total, total));
        assert_eq!(got, want, "{case}");
    }
}
