//! LoRA and DoRA adapters on the GPU against the same adapters on the CPU (feature `cuda`; run
//! on a machine with an NVIDIA GPU, see docs/cuda.md): the prompt's last logits within the f32
//! tolerance, and free-running greedy tokens (the decode steps the GPU captures as graphs) equal
//! up to a near tie. The adapters are written here with fixed pseudo-random values in mlx-lm's
//! layout (their agreement with mlx-lm is tests/adapters.rs').
#![cfg(feature = "cuda")]

use std::path::{Path, PathBuf};

use nuvec::io::save_safetensors;
use nuvec::{Array, Device};
use nuvec_lm::{generate, load_model_with, GenerateOptions, LoadOptions, Model};

mod common;
use common::gpu_cases::{case_dir, margin, prompt};

const TOLERANCE: f32 = 2e-3;
const STEPS: usize = 24;

/// An adapter folder on every attention and MLP projection of `case`'s `layers` layers.
fn adapter(case: &str, kind: &str, (hidden, q, kv, inter): (usize, usize, usize, usize), layers: usize) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nuvec-gpu-adapter-{case}-{kind}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut values = |n: usize, amp: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state % 2001) as f32 / 1000.0 - 1.0) * amp
            })
            .collect()
    };
    let rank = 4;
    let mut tensors = vec![];
    for l in 0..layers {
        for (module, inputs, outputs) in [
            ("self_attn.q_proj", hidden, q),
            ("self_attn.k_proj", hidden, kv),
            ("self_attn.v_proj", hidden, kv),
            ("self_attn.o_proj", q, hidden),
            ("mlp.gate_proj", hidden, inter),
            ("mlp.up_proj", hidden, inter),
            ("mlp.down_proj", inter, hidden),
        ] {
            let name = format!("model.layers.{l}.{module}");
            let a = Array::from_slice(&values(inputs * rank, 1.0 / (inputs as f32).sqrt()), &[inputs, rank]).unwrap();
            let b = Array::from_slice(&values(rank * outputs, 0.05), &[rank, outputs]).unwrap();
            tensors.push((format!("{name}.lora_a"), a));
            tensors.push((format!("{name}.lora_b"), b));
            if kind == "dora" {
                let m = values(outputs, 0.5).iter().map(|v| 1.0 + v).collect::<Vec<f32>>();
                tensors.push((format!("{name}.m"), Array::from_slice(&m, &[outputs]).unwrap()));
            }
        }
    }
    save_safetensors(dir.join("adapters.safetensors"), &tensors, None).unwrap();
    let config = serde_json::json!({"fine_tune_type": kind, "num_layers": -1,
        "lora_parameters": {"rank": rank, "scale": 2.0, "dropout": 0.0}});
    std::fs::write(dir.join("adapter_config.json"), config.to_string()).unwrap();
    dir
}

fn load(case: &str, adapter: &Path, device: Device) -> Model {
    // The GPU fixtures hold no tokenizer: the model alone.
    let options = LoadOptions { device, adapter_path: Some(adapter.to_path_buf()), ..Default::default() };
    load_model_with(&case_dir(case), &options).unwrap()
}

fn last_logits(model: &Model, prompt: &[u32]) -> Vec<f32> {
    model.forward_last(prompt, &mut model.new_cache()).unwrap().to_vec::<f32>().unwrap()
}

fn greedy(model: &Model, prompt: &[u32]) -> Vec<u32> {
    let options = GenerateOptions { max_tokens: STEPS, ignore_eos: true, ..Default::default() };
    generate(model, prompt, options).unwrap().map(|t| t.unwrap()).collect()
}

#[test]
fn adapters_on_the_gpu_match_the_cpu() {
    nuvec::backends::cuda::set_matmul_precision(nuvec::backends::cuda::MatmulPrecision::F32);
    for kind in ["lora", "dora"] {
        let case = "qwen3-q4g64";
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(case_dir(case).join("config.json")).unwrap()).unwrap();
        let dim = |k: &str| config[k].as_u64().unwrap() as usize;
        let head = config["head_dim"].as_u64().map_or(dim("hidden_size") / dim("num_attention_heads"), |h| h as usize);
        let (q, kv) = (dim("num_attention_heads") * head, dim("num_key_value_heads") * head);
        let shape = (dim("hidden_size"), q, kv, dim("intermediate_size"));
        let dir = adapter(case, kind, shape, dim("num_hidden_layers"));
        let (cpu, gpu) = (load(case, &dir, Device::Cpu), load(case, &dir, Device::Cuda(0)));
        let prompt = prompt(cpu.vocab_size(), 12);
        let (want, got) = (last_logits(&cpu, &prompt), last_logits(&gpu, &prompt));
        let diff = want.iter().zip(&got).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff <= TOLERANCE, "{kind}: the GPU's logits differ by {diff}");
        let (want, got) = (greedy(&cpu, &prompt), greedy(&gpu, &prompt));
        if let Some(step) = want.iter().zip(&got).position(|(a, b)| a != b) {
            // Only at a near tie of the CPU's own run.
            let mut context = prompt.clone();
            context.extend(&want[..step]);
            let m = margin(&last_logits(&cpu, &context));
            assert!(m <= 2.0 * TOLERANCE, "{kind}: step {step}: {got:?} vs the CPU's {want:?} (margin {m})");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
