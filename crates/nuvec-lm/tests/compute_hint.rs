//! The model's compute type, as the backends see it: `Model::compute_dtype()` is the float type
//! mlx-lm computes each fixture checkpoint in (oracle.json's `dtype`, the checkpoint's float
//! types as mlx-lm loads them), and `Model::forward`, `forward_last` and `prefill` run the
//! decoder and the output head inside `nuvec::with_compute_dtype` with it (what the CUDA backend's default prefill
//! precision, `Auto`, reads to choose bf16 or f32 attention), scoped to the call.

use std::sync::{Arc, Mutex};

use nuvec::{Array, DType, Device};

use nuvec_lm::models::Architecture;
use nuvec_lm::{load_model_on, Model, StepBatch};

mod common;

/// Which call (`hidden` or `logits`) saw which hint.
type Seen = Vec<(&'static str, Option<DType>)>;

/// Records the hint each `hidden` and `logits` call saw.
struct Probe {
    seen: Arc<Mutex<Seen>>,
}

impl Architecture for Probe {
    fn hidden(&self, step: &mut StepBatch) -> nuvec_lm::Result<Array> {
        let tokens = step.tokens();
        self.seen.lock().unwrap().push(("hidden", nuvec::compute_dtype_hint()));
        Ok(Array::from_slice(&vec![0f32; tokens.len() * 4], &[tokens.len(), 4])?)
    }
    fn logits(&self, hidden: &Array) -> nuvec_lm::Result<Array> {
        self.seen.lock().unwrap().push(("logits", nuvec::compute_dtype_hint()));
        Ok(hidden.clone())
    }
    fn num_layers(&self) -> usize {
        0
    }
}

#[test]
fn forward_runs_the_decoder_with_the_models_compute_dtype() {
    let seen = Arc::new(Mutex::new(vec![]));
    let mut model = Model::new(Box::new(Probe { seen: seen.clone() }), "probe", 4, vec![]);
    assert_eq!(model.compute_dtype(), DType::F32, "a custom architecture computes in f32 unless told");
    let mut cache = model.new_cache();
    model.forward(&[1, 2], &mut cache).unwrap();
    model.set_compute_dtype(DType::BF16);
    model.forward_last(&[3], &mut cache).unwrap();
    model.set_compute_dtype(DType::F16);
    model.prefill(&[4], &mut cache).unwrap();
    let (f32_, bf16, f16) = (Some(DType::F32), Some(DType::BF16), Some(DType::F16));
    let want = [("hidden", f32_), ("logits", f32_), ("hidden", bf16), ("logits", bf16), ("hidden", f16)];
    assert_eq!(*seen.lock().unwrap(), want);
    assert_eq!(nuvec::compute_dtype_hint(), None, "nothing is left behind after the calls");
}

#[test]
fn compute_dtype_is_the_one_mlx_lm_computes_in() {
    let mut checked = 0;
    for dir in common::cases() {
        // GGUF files compute in f16 (llama.cpp's activations), not what the oracle's converted
        // checkpoint says.
        let gguf =
            std::fs::read_dir(&dir).unwrap().flatten().any(|e| e.path().extension().is_some_and(|x| x == "gguf"));
        let oracle = common::oracle_json(&dir);
        let Some([dtype]) = oracle["dtype"].as_array().map(Vec::as_slice) else { continue };
        if gguf {
            continue;
        }
        let want = match dtype.as_str() {
            Some("float32") => DType::F32,
            Some("bfloat16") => DType::BF16,
            Some("float16") => DType::F16,
            other => panic!("{}: oracle dtype {other:?}", dir.display()),
        };
        let model = load_model_on(&dir, Device::Cpu).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        assert_eq!(model.compute_dtype(), want, "{}: mlx-lm computes it in {dtype}", dir.display());
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} fixture cases with one float dtype: rerun scripts/setup-oracle.sh");
    println!("RESULT compute_dtype matches mlx-lm's for {checked} fixture cases");
}
