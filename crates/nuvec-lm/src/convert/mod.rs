//! `convert`: a Hugging Face, MLX or GGUF checkpoint to an MLX-format directory, as
//! `mlx_lm.convert` writes one (config.json with MLX's `quantization` keys, safetensors shards of
//! at most 5 GiB with an index, the tokenizer files), optionally cast, quantized or dequantized.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use half::{bf16, f16};
use nuvec::fpquant::quantize_fp;
use nuvec::io::save_safetensors;
use nuvec::quantize::{dequantize, quantize_affine};
use nuvec::{Array, DType, Matrix, QuantMode, QuantSpec, Quantized};
use serde_json::{json, Map, Value};

mod fuse;

use crate::convert_qwen3_5;
use crate::output_dir::check_output;
use crate::quantization::{Legacy, Quantization};
use crate::staged::Staged;
use crate::weights::Weights;
use crate::{hub, Error, Result};

/// Largest shard written, as mlx_lm (5 GiB).
const MAX_SHARD_BYTES: usize = 5 << 30;

/// Tokenizer files copied from a checkpoint directory.
pub(crate) const TOKENIZER_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
    "tokenizer.model",
];

/// What `convert` does besides copying.
#[derive(Debug, Clone, Default)]
pub struct ConvertOptions {
    /// Quantize every linear and embedding weight whose width divides into groups.
    pub quantize: Option<QuantSpec>,
    /// Store the non-quantized float tensors (and new scales) in this dtype; default: config.json's
    /// `torch_dtype` when it is one of float16, bfloat16, float32, else as stored.
    pub dtype: Option<DType>,
    /// Turn quantized weights back into dense ones.
    pub dequantize: bool,
    /// Replace an existing output directory.
    pub force: bool,
    /// An mlx-lm adapter folder whose LoRA / DoRA terms are added into the weights first
    /// (`nuvec fuse`, mlx_lm.fuse).
    pub adapter: Option<std::path::PathBuf>,
    /// Called as a stage goes through its tensors: `("Dequantize" | "Quantize", done, total)`
    /// before each (quantizing counts every tensor it looks at, kept ones too) and once at the end.
    pub progress: Option<ConvertProgress>,
}

/// A convert-progress callback ([`ConvertOptions::progress`]): `(stage, done, total)`, the last
/// report of a stage with `done == total`.
#[derive(Clone)]
pub struct ConvertProgress(pub std::sync::Arc<ConvertProgressFn>);

/// What a [`ConvertProgress`] calls: `(stage, done, total)`.
pub type ConvertProgressFn = dyn Fn(&str, usize, usize) + Send + Sync;

impl std::fmt::Debug for ConvertProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConvertProgress(..)")
    }
}

impl ConvertOptions {
    fn report(&self, stage: &str, done: usize, total: usize) {
        if let Some(p) = &self.progress {
            (p.0)(stage, done, total);
        }
    }
}

/// A checkpoint in memory: config fields, tensors by name, tokenizer files.
struct Checkpoint {
    config: Map<String, Value>,
    tensors: BTreeMap<String, Array>,
    files: Vec<(String, Vec<u8>)>,
    /// Quantized modules in a layout MLX cannot load (GGUF K-quants' groups of 16), kept out of
    /// `tensors` and `config` until `convert` requantizes or dequantizes them.
    not_mlx: BTreeMap<String, Module>,
    /// Read from a GGUF file: dequantized weights are written in f32 unless a dtype is asked
    /// for, since ggml's `d * q (+ m)` is exact in f32 and not in the f16 its scales are kept in.
    from_gguf: bool,
}

/// A quantized module as one matrix of all its rows (stacked experts' leading axis folded in),
/// and the shape its rows have in the checkpoint (`[rows]`, or `[experts, rows]`).
struct Module {
    q: Quantized,
    rows: Vec<usize>,
}

impl Module {
    /// The module whose parts are `packed` (`[..rows, words]`), `scales` and `biases` (`[..rows,
    /// groups]`; `None` for the floating-point modes).
    fn new(packed: Array, scales: Array, biases: Option<Array>, spec: QuantSpec) -> Result<Self> {
        let rows = packed.shape()[..packed.shape().len().saturating_sub(1)].to_vec();
        let flat = |a: &Array| -> Result<Array> {
            let last = a.shape().last().copied().unwrap_or(0);
            Ok(a.reshape(&[a.len() / last.max(1), last])?)
        };
        let cols = packed.shape().last().copied().unwrap_or(0) * 32 / spec.bits;
        let q = match biases {
            Some(b) => Quantized::new(flat(&packed)?, flat(&scales)?, flat(&b)?, spec, cols)?,
            None => Quantized::new_fp(flat(&packed)?, flat(&scales)?, None, spec, cols)?,
        };
        Ok(Module { q, rows })
    }

    /// `a` (`[all rows, n]`) in the module's row shape.
    fn shaped(&self, a: &Array) -> Result<Array> {
        let mut shape = self.rows.clone();
        shape.push(a.dim(-1));
        Ok(a.reshape(&shape)?)
    }
}

fn read_source(source: &str) -> Result<Checkpoint> {
    let path = hub::resolve(source)?;
    if path.is_file() && path.extension().is_some_and(|e| e == "gguf") {
        let gguf = crate::gguf::read_gguf(&path)?;
        let tok = &gguf.tokenizer;
        let mut tokenizer_config = json!({"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": false});
        for (key, value) in [("bos_token", tok.bos_token()), ("eos_token", tok.eos_token())] {
            if let Some(v) = value {
                tokenizer_config[key] = v.into();
            }
        }
        if let Some(t) = tok.chat_template() {
            tokenizer_config["chat_template"] = t.source().into();
        }
        let tokenizer_json = tok.inner().to_string(false).map_err(|e| Error::Tokenizer {
            file: path.display().to_string(),
            message: format!("cannot write tokenizer.json: {e}"),
        })?;
        let Value::Object(mut config) = gguf.config else { unreachable!("config_json builds an object") };
        let mut tensors: BTreeMap<String, Array> = gguf.tensors.into_iter().collect();
        // Modules in groups of 16 (Q2_K, Q3_K, Q6_K) leave the tensors MLX will read.
        let mut not_mlx = BTreeMap::new();
        let mut specs = vec![];
        for (base, spec) in gguf.specs {
            if spec.validate_mlx().is_ok() {
                specs.push((base, spec));
                continue;
            }
            let mut take = |suffix: &str| tensors.remove(&format!("{base}.{suffix}")).expect("converted together");
            let (packed, scales, biases) = (take("weight"), take("scales"), take("biases"));
            not_mlx.insert(base, Module::new(packed, scales, Some(biases), spec)?);
        }
        if let Some(entry) = quantization_entry(specs.into_iter()) {
            config.insert("quantization".into(), entry.clone());
            config.insert("quantization_config".into(), entry);
        }
        return Ok(Checkpoint {
            config,
            tensors,
            files: vec![
                ("tokenizer.json".into(), tokenizer_json.into_bytes()),
                ("tokenizer_config.json".into(), serde_json::to_vec_pretty(&tokenizer_config).expect("json")),
            ],
            not_mlx,
            from_gguf: true,
        });
    }
    let config_path = path.join("config.json");
    let text = std::fs::read_to_string(&config_path)
        .map_err(|source| Error::Io { path: config_path.display().to_string(), source })?;
    let config: Map<String, Value> = serde_json::from_str(&text)
        .map_err(|e| Error::config(config_path.display().to_string(), format!("is not a valid JSON object ({e})")))?;
    let parsed = crate::config::Config::from_json(&config_path.display().to_string(), &text)?;
    let quantization = Quantization::from_config(&parsed)?;
    let legacy = quantization.legacy;
    let weights = Weights::open(&path, quantization)?;
    let mut tensors: BTreeMap<String, Array> =
        weights.names().into_iter().map(|n| Ok((n.clone(), weights.raw(&n)?))).collect::<Result<_>>()?;
    let mut config = config;
    if let Some(legacy) = legacy {
        // AWQ/GPTQ layers become MLX affine ones, as mlx_lm.convert writes them.
        let mut specs = vec![];
        for name in weights.names().iter().filter(|n| n.ends_with(".qweight")) {
            let base = name.trim_end_matches(".qweight");
            let qweight = &tensors[name];
            let (rows, cols) = match legacy {
                Legacy::Awq { .. } => (qweight.dim(1) * 8, qweight.dim(0)),
                Legacy::Gptq { bits, .. } => (qweight.dim(1), qweight.dim(0) * 32 / bits),
            };
            let Matrix::Quantized(q) = weights.matrix(base, rows, cols)? else {
                unreachable!("AWQ/GPTQ layers are quantized")
            };
            for suffix in ["qweight", "qzeros", "scales", "g_idx"] {
                tensors.remove(&format!("{base}.{suffix}"));
            }
            tensors.insert(format!("{base}.weight"), q.packed.clone());
            tensors.insert(format!("{base}.scales"), q.scales.clone());
            tensors.insert(format!("{base}.biases"), q.biases.clone());
            specs.push((base.to_string(), q.spec));
        }
        config.remove("quantization_config");
        if let Some(entry) = quantization_entry(specs.into_iter()) {
            config.insert("quantization".into(), entry.clone());
            config.insert("quantization_config".into(), entry);
        }
    }
    let mut files = vec![];
    for name in TOKENIZER_FILES {
        let p = path.join(name);
        if p.exists() {
            files.push((
                name.to_string(),
                std::fs::read(&p).map_err(|source| Error::Io { path: p.display().to_string(), source })?,
            ));
        }
    }
    Ok(Checkpoint { config, tensors, files, not_mlx: BTreeMap::new(), from_gguf: false })
}

fn cast(a: &Array, dtype: DType) -> Result<Array> {
    if a.dtype() == dtype || !a.dtype().is_float() {
        return Ok(a.clone());
    }
    let v = a.to_f32_vec()?;
    Ok(match dtype {
        DType::F32 => Array::from_slice(&v, a.shape())?,
        DType::F16 => Array::from_slice(&v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>(), a.shape())?,
        DType::BF16 => Array::from_slice(&v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>(), a.shape())?,
        other => return Err(Error::Invalid(format!("--dtype {other} is not a float type"))),
    })
}

/// The quantized modules (those with `.scales`), with the spec config.json gives each (its own
/// entry, else the default), checked against the shapes.
fn quantized_modules(
    config: &Map<String, Value>,
    tensors: &BTreeMap<String, Array>,
) -> Result<BTreeMap<String, Module>> {
    let parsed = crate::config::Config::from_json("config.json", &Value::Object(config.clone()).to_string())?;
    let quantization = Quantization::from_config(&parsed)?;
    let mut out = BTreeMap::new();
    for name in tensors.keys().filter(|n| n.ends_with(".scales")) {
        let base = name.trim_end_matches(".scales");
        let bad =
            |message: String| Error::Weights { file: "config.json".into(), message: format!("{base}: {message}") };
        let spec = match quantization.overrides.get(base) {
            Some(Some(spec)) => *spec,
            Some(None) => return Err(bad("listed as unquantized, but it has scales".into())),
            None => quantization.default.ok_or_else(|| bad("has scales but config.json has no quantization".into()))?,
        };
        let get = |suffix: &str| {
            tensors.get(&format!("{base}.{suffix}")).cloned().ok_or_else(|| bad(format!("{base}.{suffix} is missing")))
        };
        let (packed, scales) = (get("weight")?, get("scales")?);
        if scales.dtype() == DType::U8 {
            // fpquant: as mlx-lm, an unlisted module's floating-point mode is told by its shapes.
            let spec = fp_spec_of(&packed, &scales, spec)
                .ok_or_else(|| bad(format!("uint8 scales {:?} fit none of mxfp4, mxfp8, nvfp4", scales.shape())))?;
            let global = tensors.get(&format!("{base}.global_scale"));
            if global.is_some() {
                return Err(bad("nvfp4 global scales are not converted yet".into()));
            }
            out.insert(base.to_string(), Module::new(packed, scales, None, spec)?);
            continue;
        }
        out.insert(base.to_string(), Module::new(packed, scales, Some(get("biases")?), spec)?);
    }
    Ok(out)
}

/// The floating-point spec whose shape `packed` / `scales` hold: `listed` when it fits, else the
/// one mode that does.
fn fp_spec_of(packed: &Array, scales: &Array, listed: QuantSpec) -> Option<QuantSpec> {
    let fits = |spec: QuantSpec| {
        let (p, s) = (packed.shape(), scales.shape());
        let cols = p.last().copied().unwrap_or(0) * 32 / spec.bits;
        p.len() >= 2
            && p.len() == s.len()
            && p[..p.len() - 1] == s[..s.len() - 1]
            && s[s.len() - 1] * spec.group_size == cols
    };
    let candidates = [listed.mode, QuantMode::Mxfp4, QuantMode::Mxfp8, QuantMode::Nvfp4];
    candidates
        .into_iter()
        .filter_map(|mode| {
            let (bits, group_size) = mode.fixed_shape()?;
            Some(QuantSpec { mode, bits, group_size })
        })
        .find(|&spec| fits(spec))
}

/// config.json's quantization entry for `modules`: the most common spec as the default, the
/// others listed per module, as MLX writes mixed checkpoints.
fn quantization_entry(modules: impl Iterator<Item = (String, QuantSpec)>) -> Option<Value> {
    let modules: Vec<(String, QuantSpec)> = modules.collect();
    let mut counts: HashMap<(&str, usize, usize), (usize, QuantMode)> = HashMap::new();
    for (_, spec) in &modules {
        counts.entry((spec.mode.name(), spec.bits, spec.group_size)).or_insert((0, spec.mode)).0 += 1;
    }
    let (&(_, bits, group_size), &(_, mode)) = counts.iter().max_by_key(|(k, (n, _))| (*n, std::cmp::Reverse(**k)))?;
    let default = QuantSpec { mode, bits, group_size };
    let mut entry = spec_json(&default);
    for (base, spec) in &modules {
        if *spec != default {
            entry[base] = spec_json(spec);
        }
    }
    Some(entry)
}

fn spec_json(spec: &QuantSpec) -> Value {
    json!({"group_size": spec.group_size, "bits": spec.bits, "mode": spec.mode.name()})
}

/// Converts `source` (a directory, a cached repo id or a .gguf file) into an MLX checkpoint at
/// `out`. An existing `out` is refused, as mlx_lm.convert does, unless `force`.
///
/// GGUF's Q2_K, Q3_K and Q6_K tensors are affine groups of 16, which MLX cannot load (mlx 0.32.4
/// quantizes only in groups of 32, 64 and 128). A file holding any is refused unless one of:
/// - `dequantize`: every quantized weight is written dense (exactly llama.cpp's values, in f32
///   unless `dtype` says otherwise);
/// - `quantize`: those tensors alone are requantized with MLX's affine quantizer at the spec
///   given (from their exact dequantized values); every other tensor is written as it is (the
///   simple block types, Q4_K and Q5_K are exact MLX groups of 32 already).
pub fn convert(source: &str, out: &Path, options: &ConvertOptions) -> Result<()> {
    if options.quantize.is_some() && options.dequantize {
        return Err(Error::Invalid("choose either quantize or dequantize, not both".into()));
    }
    if let Some(spec) = &options.quantize {
        spec.validate_mlx().map_err(|m| Error::Invalid(format!("quantization: {m}")))?;
    }
    check_output(out, &hub::resolve(source)?, options.force)?;
    let mut ck = read_source(source)?;
    let model_type = ck.config.get("model_type").and_then(Value::as_str).unwrap_or_default().to_string();
    convert_qwen3_5::sanitize(&model_type, &mut ck.tensors)?;
    let mut quantized = quantized_modules(&ck.config, &ck.tensors)?;
    if let Some(adapter) = &options.adapter {
        fuse::fuse(&mut ck, &mut quantized, adapter, options.dequantize)?;
    }
    if let Some(first) = ck.not_mlx.keys().next() {
        if options.quantize.is_none() && !options.dequantize {
            return Err(Error::Unsupported(format!(
                "{source}: {} quantized tensors (the first: {first}) are GGUF Q2_K/Q3_K/Q6_K blocks, affine \
                 groups of 16, which MLX cannot load: pass -q (with --q-bits/--q-group-size) to requantize \
                 them with MLX's quantizer, or -d to write every weight dense",
                ck.not_mlx.len()
            )));
        }
    }
    let requantize = options.quantize.is_some() && !ck.not_mlx.is_empty();
    if options.quantize.is_some() && !requantize && (!quantized.is_empty() || ck.config.contains_key("quantization")) {
        return Err(Error::Invalid(format!(
            "{source} is already quantized: cannot quantize it again (pass -d to dequantize)"
        )));
    }
    let dtype = options.dtype.or_else(|| match ck.config.get("torch_dtype").and_then(Value::as_str) {
        Some("float16") => Some(DType::F16),
        Some("bfloat16") => Some(DType::BF16),
        Some("float32") => Some(DType::F32),
        _ => None,
    });
    if let Some(dtype) = dtype {
        for (name, a) in ck.tensors.iter_mut() {
            if !convert_qwen3_5::keeps_dtype(&model_type, name) {
                *a = cast(a, dtype)?;
            }
        }
        quantized = quantized_modules(&ck.config, &ck.tensors)?;
    }
    if options.dequantize {
        quantized.append(&mut ck.not_mlx);
        let total = quantized.len();
        for (done, (base, m)) in quantized.iter().enumerate() {
            options.report("Dequantize", done, total);
            let q = &m.q;
            // As mlx_lm.convert -d: affine weights take the (cast) scales' dtype (a GGUF's: f32,
            // `from_gguf`); the floating-point modes come out of mx.dequantize as bfloat16
            // whatever --dtype says (exact: their values have at most 6 significant bits).
            let affine = dtype.unwrap_or(if ck.from_gguf { DType::F32 } else { q.scales.dtype() });
            let target = if q.spec.mode == QuantMode::Affine { affine } else { DType::BF16 };
            let dense = m.shaped(&cast(&Array::from_slice(&dequantize(q)?, &[q.rows(), q.cols()])?, target)?)?;
            ck.tensors.remove(&format!("{base}.scales"));
            ck.tensors.remove(&format!("{base}.biases"));
            ck.tensors.insert(format!("{base}.weight"), dense);
        }
        options.report("Dequantize", total, total);
        quantized.clear();
        ck.config.remove("quantization");
        ck.config.remove("quantization_config");
    }
    if let (Some(spec), true) = (options.quantize, requantize) {
        let requantized = std::mem::take(&mut ck.not_mlx);
        let total = requantized.len();
        for (done, (base, m)) in requantized.into_iter().enumerate() {
            options.report("Quantize", done, total);
            let (q, rows, cols) = (&m.q, m.q.rows(), m.q.cols());
            if !cols.is_multiple_of(spec.group_size) {
                return Err(Error::Invalid(format!(
                    "{source}: {base} has {cols} columns, not a multiple of --q-group-size {}",
                    spec.group_size
                )));
            }
            let q = quantize_affine(&dequantize(q)?, rows, cols, spec, dtype.unwrap_or(DType::F32))?;
            ck.tensors.insert(format!("{base}.weight"), m.shaped(&q.packed)?);
            ck.tensors.insert(format!("{base}.scales"), m.shaped(&q.scales)?);
            ck.tensors.insert(format!("{base}.biases"), m.shaped(&q.biases)?);
            quantized.insert(base, Module { q, rows: m.rows });
        }
        options.report("Quantize", total, total);
    } else if let Some(spec) = options.quantize {
        let names: Vec<String> = ck.tensors.keys().cloned().collect();
        let total = names.len();
        for (done, name) in names.into_iter().enumerate() {
            options.report("Quantize", done, total);
            let a = &ck.tensors[&name];
            // Matrices, and experts stacked as mlx-lm's SwitchLinear holds them ([experts, rows,
            // cols]), which mlx quantizes too: each row's groups alone, so the stack quantizes as
            // one matrix of all its rows.
            let stacked = a.shape().len() == 3 && (name.contains(".switch_mlp.") || name.contains(".experts."));
            let dense_matrix = name.ends_with(".weight") && (a.shape().len() == 2 || stacked) && a.dtype().is_float();
            if !dense_matrix || !a.dim(-1).is_multiple_of(spec.group_size) {
                continue; // as mlx: norms stay, and so does a matrix whose width does not divide
            }
            let shape = a.shape().to_vec();
            let (rows, cols) = (a.len() / shape[shape.len() - 1], shape[shape.len() - 1]);
            let base = name.trim_end_matches(".weight").to_string();
            let spec = quant_override(&model_type, &base).unwrap_or(spec);
            let q = if spec.mode == QuantMode::Affine {
                quantize_affine(&a.to_f32_vec()?, rows, cols, spec, a.dtype())?
            } else {
                quantize_fp(&a.to_f32_vec()?, rows, cols, spec)?
            };
            let module = Module { q, rows: shape[..shape.len() - 1].to_vec() };
            ck.tensors.insert(format!("{base}.scales"), module.shaped(&module.q.scales)?);
            if module.q.spec.mode.has_biases() {
                ck.tensors.insert(format!("{base}.biases"), module.shaped(&module.q.biases)?);
            }
            ck.tensors.insert(name, module.shaped(&module.q.packed)?);
            quantized.insert(base, module);
        }
        options.report("Quantize", total, total);
    }
    if let Some(entry) = quantization_entry(quantized.iter().map(|(b, m)| (b.clone(), m.q.spec))) {
        ck.config.insert("quantization".into(), entry.clone());
        ck.config.insert("quantization_config".into(), entry);
    }
    let stage = Staged::dir(out)?;
    write(stage.path(), &ck).map_err(crate::staged::write_error(out))?;
    loads_back(stage.path()).map_err(|e| {
        Error::Invalid(format!(
            "the converted checkpoint does not load back, so it was not saved ({} is unchanged): {e}",
            out.display()
        ))
    })?;
    stage.commit()
}

/// mlx-lm's exceptions to `-q` for a family (each model's `quant_predicate`): the layers that
/// route tokens to experts stay at 8 bits in groups of 64, whatever `-q` asks.
fn quant_override(model_type: &str, module: &str) -> Option<QuantSpec> {
    let suffixes: &[&str] = match model_type {
        "qwen3_moe" => &["mlp.gate"],
        "gpt_oss" => &["router"],
        "qwen3_5" | "qwen3_5_moe" | "qwen3_next" => &["mlp.gate", "shared_expert_gate"],
        "gemma4" | "gemma4_text" => &["router.proj"],
        _ => &[],
    };
    let routes = suffixes.iter().any(|s| module.ends_with(s));
    routes.then_some(QuantSpec { mode: QuantMode::Affine, bits: 8, group_size: 64 })
}

/// Whether nuvec can load the checkpoint written at `dir` (its tokenizer too, when it has one).
fn loads_back(dir: &Path) -> Result<()> {
    let model = crate::load_model(dir)?;
    if dir.join("tokenizer.json").exists() {
        crate::tokenizer::Tokenizer::load(dir, model.eos_token_ids())?;
    }
    Ok(())
}

fn write(out: &Path, ck: &Checkpoint) -> Result<()> {
    let io = |p: &Path| {
        let path = p.display().to_string();
        move |source| Error::Io { path, source }
    };
    let mut shards: Vec<Vec<(String, Array)>> = vec![];
    let mut size = 0;
    for (name, a) in &ck.tensors {
        if shards.is_empty() || size + a.nbytes() > MAX_SHARD_BYTES {
            shards.push(vec![]);
            size = 0;
        }
        size += a.nbytes();
        shards.last_mut().expect("pushed above").push((name.clone(), a.clone()));
    }
    let total: usize = ck.tensors.values().map(Array::nbytes).sum();
    let mut weight_map = Map::new();
    let metadata: HashMap<String, String> = [("format".to_string(), "mlx".to_string())].into();
    for (i, shard) in shards.iter().enumerate() {
        let file = if shards.len() == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", i + 1, shards.len())
        };
        save_safetensors(out.join(&file), shard, Some(metadata.clone()))?;
        for (name, _) in shard {
            weight_map.insert(name.clone(), file.clone().into());
        }
    }
    let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    let write_json = |name: &str, v: &Value| {
        let p = out.join(name);
        std::fs::write(&p, serde_json::to_vec_pretty(v).expect("json")).map_err(io(&p))
    };
    write_json("model.safetensors.index.json", &index)?;
    write_json("config.json", &Value::Object(ck.config.clone()))?;
    for (name, bytes) in &ck.files {
        let p = out.join(name);
        std::fs::write(&p, bytes).map_err(io(&p))?;
    }
    Ok(())
}
