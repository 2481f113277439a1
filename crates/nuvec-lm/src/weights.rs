//! A checkpoint's tensors: one safetensors file or a sharded set, mapped, looked up by the
//! checkpoint's own names and checked against the shapes the model expects.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nuvec::io::SafetensorsFile;
use nuvec::quantize;
use nuvec::{Array, DType, Device, Matrix, QuantMode, QuantSpec, Quantized};

use crate::adapter::Adapter;
use crate::load::LoadProgress;
use crate::quantization::{Legacy, Quantization};
use crate::{Error, Result};

mod fp;

/// A shard named by the index's weight_map: a relative path that stays inside the checkpoint
/// directory (no `..`, not absolute), so an index cannot make the loader read other files.
fn shard_name<'a>(index: &str, tensor: &str, shard: &'a serde_json::Value) -> Result<&'a str> {
    use std::path::Component;
    let name = shard.as_str().ok_or_else(|| {
        Error::config(index, format!("weight_map.{tensor} = {shard} is not a file name; fix the index"))
    })?;
    let plain = !name.is_empty() && Path::new(name).components().all(|c| matches!(c, Component::Normal(_)));
    if !plain {
        return Err(Error::config(
            index,
            format!(
                "weight_map.{tensor} = {name:?} leaves the checkpoint directory; shards must be file names \
                 inside it (fix the index)"
            ),
        ));
    }
    Ok(name)
}

/// The tensors of a checkpoint directory.
#[derive(Debug)]
pub struct Weights {
    dir: PathBuf,
    files: Vec<SafetensorsFile>,
    index: HashMap<String, usize>,
    /// Tensors converted at load (from GGUF), by name.
    converted: HashMap<String, Array>,
    quantization: Quantization,
    /// Where every tensor and matrix handed out is put (uploaded from the mapped file).
    device: Device,
    /// The names read so far: what is left over after a model is built is a tensor it does not
    /// use, which mlx-lm's strict `load_weights` refuses.
    read: Mutex<HashSet<String>>,
    /// The adapter every projection loaded from here takes its part of.
    adapter: Option<Adapter>,
    /// Adapters each projection also holds the terms of, for the rows that choose them.
    served: Vec<Adapter>,
    /// Told of each tensor read for the first time: `(read, in the checkpoint)`.
    progress: Option<LoadProgress>,
}

impl Weights {
    /// Opens every `model*.safetensors` in `dir` (the index's shards when
    /// `model.safetensors.index.json` is there).
    pub fn open(dir: &Path, quantization: Quantization) -> Result<Self> {
        let index_path = dir.join("model.safetensors.index.json");
        let mut names: Vec<PathBuf> = if index_path.exists() {
            let file = index_path.display().to_string();
            let text =
                std::fs::read_to_string(&index_path).map_err(|source| Error::Io { path: file.clone(), source })?;
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| Error::config(&file, format!("is not valid JSON ({e})")))?;
            let map = json
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| Error::config(&file, "has no weight_map object"))?;
            let mut shards = Vec::with_capacity(map.len());
            for (tensor, shard) in map {
                shards.push(dir.join(shard_name(&file, tensor, shard)?));
            }
            shards.sort();
            shards.dedup();
            shards
        } else {
            let entries =
                std::fs::read_dir(dir).map_err(|source| Error::Io { path: dir.display().to_string(), source })?;
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                    name.starts_with("model") && name.ends_with(".safetensors")
                })
                .collect()
        };
        names.sort();
        if names.is_empty() {
            return Err(Error::NotFound(format!(
                "{}: no model*.safetensors files (is this a checkpoint directory?)",
                dir.display()
            )));
        }
        let mut files = Vec::new();
        let mut index = HashMap::new();
        for path in names {
            let file = nuvec::io::open_for_loading(&path)?;
            for name in file.tensors().keys() {
                index.insert(name.clone(), files.len());
            }
            files.push(file);
        }
        Ok(Weights {
            dir: dir.to_path_buf(),
            files,
            index,
            converted: HashMap::new(),
            quantization,
            device: Device::Cpu,
            read: Mutex::default(),
            adapter: None,
            served: vec![],
            progress: None,
        })
    }

    /// Tensors already in memory (converted from another format), named as a checkpoint names
    /// them; `source` names their origin in errors.
    pub fn from_arrays(source: &Path, converted: HashMap<String, Array>) -> Self {
        Weights {
            dir: source.to_path_buf(),
            files: vec![],
            index: HashMap::new(),
            converted,
            quantization: Quantization::default(),
            device: Device::Cpu,
            read: Mutex::default(),
            adapter: None,
            served: vec![],
            progress: None,
        }
    }

    /// The same tensors, reporting to `progress` as they are read.
    pub fn with_progress(mut self, progress: LoadProgress) -> Self {
        self.progress = Some(progress);
        self
    }

    /// Reports every tensor read (the end of a load, whatever the model left unread).
    pub fn report_done(&self) {
        if let Some(p) = &self.progress {
            let total = self.index.len() + self.converted.len();
            (p.0)(total, total);
        }
    }

    /// The same tensors, with `adapter` applied to the projections it names.
    pub fn with_adapter(mut self, adapter: Adapter) -> Self {
        self.adapter = Some(adapter);
        self
    }

    /// The adapter, when one was given.
    pub fn adapter(&self) -> Option<&Adapter> {
        self.adapter.as_ref()
    }

    /// The same tensors, with each projection also holding the terms of `served` (indexed by
    /// [`crate::AdapterId`]), which a step applies to the rows that chose them.
    pub fn with_served_adapters(mut self, served: Vec<Adapter>) -> Self {
        self.served = served;
        self
    }

    /// The served adapters, in [`crate::AdapterId`] order.
    pub fn served_adapters(&self) -> &[Adapter] {
        &self.served
    }

    /// The same tensors, handed out on `device` from now on ([`Weights::tensor`],
    /// [`Weights::matrix`] and [`Weights::experts`] upload what they return; [`Weights::raw`]
    /// stays on the host, where loading converts and checks it).
    pub fn on_device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// The float type mlx-lm computes this checkpoint in: the most common among its float
    /// tensors other than quantization scales and biases (norms, dense weights, embeddings), as
    /// the activations take those tensors' type and a quantized product's result is promoted to
    /// its input's type (an AWQ/GPTQ checkpoint with f16 scales and f32 norms computes in f32).
    /// Tensors converted from GGUF say f16, llama.cpp's type for activations it caches.
    pub fn compute_dtype(&self) -> DType {
        if self.files.is_empty() {
            return DType::F16;
        }
        let mut counts = [0usize; 3];
        let tensors = self.files.iter().flat_map(|f| f.tensors().iter());
        let not_scales = tensors.filter(|(name, _)| !name.ends_with(".scales") && !name.ends_with(".biases"));
        for (_, info) in not_scales {
            match info.dtype {
                DType::F32 => counts[0] += 1,
                DType::F16 => counts[1] += 1,
                DType::BF16 => counts[2] += 1,
                _ => {}
            }
        }
        let most = counts.iter().copied().max().unwrap_or(0);
        [DType::F32, DType::F16, DType::BF16][counts.iter().position(|&c| c == most).unwrap_or(0)]
    }

    /// Where the tensors and matrices handed out are put.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The safetensors files read, in order.
    pub fn files(&self) -> Vec<PathBuf> {
        self.files.iter().map(|f| f.path().to_path_buf()).collect()
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.index.keys().chain(self.converted.keys()).cloned().collect();
        names.sort();
        names
    }

    /// True when the checkpoint has tensor `name`.
    pub fn has(&self, name: &str) -> bool {
        self.index.contains_key(name) || self.converted.contains_key(name)
    }

    fn file_of(&self, name: &str) -> String {
        match self.index.get(name) {
            Some(&i) => self.files[i].path().display().to_string(),
            None => self.dir.display().to_string(),
        }
    }

    fn err(&self, name: &str, message: impl Into<String>) -> Error {
        Error::Weights { file: self.file_of(name), message: format!("{name}: {}", message.into()) }
    }

    /// Every tensor name not read so far ([`Weights::raw`] and everything built on it), sorted.
    pub fn unread(&self) -> Vec<String> {
        let read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        let mut names: Vec<String> = self.names().into_iter().filter(|n| !read.contains(n)).collect();
        names.sort();
        names
    }

    /// The directory or file the tensors come from.
    pub fn source(&self) -> &Path {
        &self.dir
    }

    /// Tensor `name` as it is stored.
    pub fn raw(&self, name: &str) -> Result<Array> {
        if self.has(name) {
            let mut read = self.read.lock().unwrap_or_else(|e| e.into_inner());
            let (first, done) = (read.insert(name.to_string()), read.len());
            drop(read);
            if let (true, Some(p)) = (first, &self.progress) {
                (p.0)(done, self.index.len() + self.converted.len());
            }
        }
        if let Some(a) = self.converted.get(name) {
            return Ok(a.clone());
        }
        let &i = self.index.get(name).ok_or_else(|| {
            self.err(name, "is missing from the checkpoint (a different model or an incomplete download?)")
        })?;
        Ok(self.files[i].array(name)?)
    }

    /// A float tensor of exactly `shape`, on the weights' device.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<Array> {
        Ok(self.host_tensor(name, shape)?.to_device(self.device)?)
    }

    fn host_tensor(&self, name: &str, shape: &[usize]) -> Result<Array> {
        let a = self.raw(name)?;
        if a.shape() != shape {
            return Err(self.err(name, format!("has shape {:?}, the config says {shape:?}", a.shape())));
        }
        if !a.dtype().is_float() {
            return Err(self.err(name, format!("has dtype {}, expected a float type", a.dtype())));
        }
        Ok(a)
    }

    /// A norm's scale `name` of exactly `shape`, on the weights' device, refused when it holds a
    /// NaN or an infinity: every token's hidden state would turn NaN. Norm scales are small
    /// vectors, so reading them all is cheap.
    pub fn norm_tensor(&self, name: &str, shape: &[usize]) -> Result<Array> {
        let a = self.host_tensor(name, shape)?;
        if let Some(i) = a.to_f32_vec()?.iter().position(|v| !v.is_finite()) {
            return Err(self.err(
                name,
                format!("holds a NaN or infinite value (at index {i}); the checkpoint is corrupt: re-download or re-convert it"),
            ));
        }
        Ok(a.to_device(self.device)?)
    }

    /// Like [`Weights::tensor`], `None` when absent.
    pub fn opt_tensor(&self, name: &str, shape: &[usize]) -> Result<Option<Array>> {
        if self.has(name) {
            self.tensor(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }

    /// An AutoAWQ or GPTQ layer (`qweight`, `qzeros`, `scales`), converted to MLX affine.
    fn legacy_matrix(&self, path: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let name = |suffix: &str| format!("{path}.{suffix}");
        let ints = |suffix: &str| -> Result<Vec<i32>> {
            let a = self.raw(&name(suffix))?;
            a.to_vec::<i32>().map_err(|_| self.err(&name(suffix), format!("has dtype {}, expected int32", a.dtype())))
        };
        let scales = self.raw(&name("scales"))?;
        if !scales.dtype().is_float() {
            return Err(self.err(&name("scales"), format!("has dtype {}, expected a float type", scales.dtype())));
        }
        let scales = scales.to_f32_vec()?;
        let fail = |e: nuvec::Error| self.err(&name("qweight"), e.to_string());
        let q = match self.quantization.legacy {
            Some(Legacy::Awq { group_size }) => {
                quantize::from_awq(&ints("qweight")?, &ints("qzeros")?, &scales, cols, rows, group_size)
                    .map_err(fail)?
            }
            Some(Legacy::Gptq { bits, group_size, zero_offset }) => {
                if self.has(&name("g_idx")) {
                    let g_idx = ints("g_idx")?;
                    if g_idx.iter().enumerate().any(|(i, &g)| g as usize != i / group_size) {
                        return Err(Error::Unsupported(format!(
                            "{}: {} permutes its groups (act-order GPTQ), which has no MLX equivalent; \
                             re-quantize with `mlx_lm.convert`",
                            self.file_of(&name("g_idx")),
                            name("g_idx")
                        )));
                    }
                }
                let (qw, qz) = (ints("qweight")?, ints("qzeros")?);
                quantize::from_gptq(&qw, &qz, &scales, (cols, rows), bits, group_size, zero_offset).map_err(fail)?
            }
            None => {
                return Err(
                    self.err(&name("qweight"), "is an AWQ/GPTQ tensor but config.json has no such quantization_config")
                )
            }
        };
        Ok(Matrix::Quantized(q))
    }

    /// The `num` expert matrices `[rows, cols]` of a mixture-of-experts projection, as views
    /// (no copy) into MLX's stacked `{stacked}.weight [experts, rows, cols]` (its scales and biases
    /// likewise), or from Hugging Face's per-expert modules `{per_expert(e)}` when those exist.
    pub fn experts(
        &self,
        stacked: &str,
        per_expert: impl Fn(usize) -> String,
        num: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<Matrix>> {
        let host = self.host_experts(stacked, per_expert, num, rows, cols)?;
        host.into_iter().map(|m| Ok(m.to_device(self.device)?)).collect()
    }

    fn host_experts(
        &self,
        stacked: &str,
        per_expert: impl Fn(usize) -> String,
        num: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<Matrix>> {
        if self.has(&format!("{}.weight", per_expert(0))) {
            return (0..num).map(|e| self.host_matrix(&per_expert(e), rows, cols)).collect();
        }
        let weight = format!("{stacked}.weight");
        let packed = self.raw(&weight)?;
        if packed.shape().len() != 3 || packed.dim(0) != num {
            return Err(self.err(&weight, format!("has shape {:?}, expected {num} stacked experts", packed.shape())));
        }
        let part =
            |suffix: &str, e: usize| -> Result<Array> { Ok(self.raw(&format!("{stacked}.{suffix}"))?.index_first(e)?) };
        (0..num)
            .map(|e| {
                let w = packed.index_first(e)?;
                if !self.has(&format!("{stacked}.scales")) {
                    if w.shape() != [rows, cols] || !w.dtype().is_float() {
                        return Err(self.err(
                            &weight,
                            format!("expert {e} is {} {:?}, expected [{rows}, {cols}]", w.dtype(), w.shape()),
                        ));
                    }
                    return Ok(Matrix::Dense(w));
                }
                if self.raw(&format!("{stacked}.scales"))?.dtype() == DType::U8 {
                    return self.fp_expert(stacked, e, (w, part("scales", e)?), (rows, cols));
                }
                let (scales, biases) = (part("scales", e)?, part("biases", e)?);
                if w.shape().len() != 2 || w.dim(0) != rows || scales.shape().len() != 2 || scales.dim(1) == 0 {
                    return Err(self.err(
                        &weight,
                        format!("quantized expert {e} shapes {:?} do not fit {rows}x{cols}", w.shape()),
                    ));
                }
                let spec =
                    QuantSpec { mode: QuantMode::Affine, bits: w.dim(1) * 32 / cols, group_size: cols / scales.dim(1) };
                let checked = if self.converted.contains_key(&weight) { spec.validate() } else { spec.validate_mlx() };
                checked.map_err(|m| self.err(&weight, m))?;
                Quantized::new(w, scales, biases, spec, cols)
                    .map(Matrix::Quantized)
                    .map_err(|e| self.err(&weight, e.to_string()))
            })
            .collect()
    }

    /// The `[rows, cols]` weight of module `path` (`{path}.weight`), dense or quantized:
    /// a module is quantized when `{path}.scales` exists, with bits and group size read from
    /// the shapes (as mlx-lm does) and checked against the config's entry for it.
    /// The matrix is put on the weights' device.
    pub fn matrix(&self, path: &str, rows: usize, cols: usize) -> Result<Matrix> {
        Ok(self.host_matrix(path, rows, cols)?.to_device(self.device)?)
    }

    fn host_matrix(&self, path: &str, rows: usize, cols: usize) -> Result<Matrix> {
        if self.has(&format!("{path}.qweight")) {
            return self.legacy_matrix(path, rows, cols);
        }
        let weight = format!("{path}.weight");
        let scales = format!("{path}.scales");
        let listed = self.quantization.overrides.get(path);
        if !self.has(&scales) {
            if let Some(Some(spec)) = listed {
                return Err(
                    self.err(&weight, format!("config.json quantizes it ({} bits) but {scales} is missing", spec.bits))
                );
            }
            return Ok(Matrix::Dense(self.host_tensor(&weight, &[rows, cols])?));
        }
        if let Some(None) = listed {
            return Err(self.err(&weight, "config.json lists it as unquantized, but it has scales"));
        }
        let (packed, scales_a) = (self.raw(&weight)?, self.raw(&scales)?);
        if scales_a.dtype() == DType::U8 {
            return self.fp_matrix(path, (packed, scales_a), listed.copied().flatten(), (rows, cols));
        }
        if let Some(Some(want)) = listed {
            if want.mode != QuantMode::Affine {
                return Err(self.err(
                    &weight,
                    format!(
                        "config.json says mode {}, but its scales are {} (affine)",
                        want.mode.name(),
                        scales_a.dtype()
                    ),
                ));
            }
        }
        if packed.shape().len() != 2 || scales_a.shape().len() != 2 || packed.dim(0) != rows || scales_a.dim(0) != rows
        {
            return Err(self.err(
                &weight,
                format!(
                    "quantized shapes {:?} / scales {:?} do not fit a {rows}x{cols} matrix",
                    packed.shape(),
                    scales_a.shape()
                ),
            ));
        }
        let words = packed.dim(1);
        let groups = scales_a.dim(1);
        if (words * 32) % cols != 0 || groups == 0 || !cols.is_multiple_of(groups) {
            return Err(self
                .err(&weight, format!("packed {words} words and {groups} groups per row cannot hold {cols} columns")));
        }
        let spec = QuantSpec { mode: QuantMode::Affine, bits: words * 32 / cols, group_size: cols / groups };
        if let Some(Some(want)) = listed {
            if (want.bits, want.group_size) != (spec.bits, spec.group_size) {
                return Err(self.err(
                    &weight,
                    format!(
                        "config.json says {} bits, group {}, the tensors hold {} bits, group {}",
                        want.bits, want.group_size, spec.bits, spec.group_size
                    ),
                ));
            }
        }
        // Group 16 only comes from GGUF K-quants converted at load; a safetensors checkpoint
        // holds what MLX writes.
        let checked = if self.converted.contains_key(&weight) { spec.validate() } else { spec.validate_mlx() };
        checked.map_err(|m| self.err(&weight, m))?;
        let biases = self.raw(&format!("{path}.biases"))?;
        Ok(Matrix::Quantized(
            Quantized::new(packed, scales_a, biases, spec, cols).map_err(|e| self.err(&weight, e.to_string()))?,
        ))
    }
}

// gpt-oss: Hugging Face's fused expert projections, whose rows (or bias entries) alternate
// between two projections (what mlx-lm's gpt_oss `sanitize` splits with `[..., ::2, :]` and
// `[..., 1::2, :]`).
impl Weights {
    /// Splits the float tensor `name [num, 2 * rows, cols]` into its even rows and its odd rows:
    /// two lists of `num` dense `[rows, cols]` matrices (copies, in the tensor's dtype).
    pub fn deinterleaved_experts(&self, name: &str, num: usize, rows: usize, cols: usize) -> Result<[Vec<Matrix>; 2]> {
        let fused = self.raw(name)?;
        if fused.shape() != [num, 2 * rows, cols] || !fused.dtype().is_float() {
            return Err(self.err(
                name,
                format!(
                    "is {} {:?}; expected a float [{num}, {}, {cols}] (interleaved gate/up rows)",
                    fused.dtype(),
                    fused.shape(),
                    2 * rows
                ),
            ));
        }
        let mut halves = [Vec::with_capacity(num), Vec::with_capacity(num)];
        for e in 0..num {
            let expert = fused.index_first(e)?;
            for (parity, half) in halves.iter_mut().enumerate() {
                let picked = every_other_row(&expert, parity, cols)?.to_device(self.device)?;
                half.push(Matrix::Dense(picked));
            }
        }
        Ok(halves)
    }

    /// Splits the float tensor `name [num, 2 * n]` into its even and its odd entries per row:
    /// two `[num, n]` arrays on the weights' device.
    pub fn deinterleaved_rows(&self, name: &str, num: usize, n: usize) -> Result<[Array; 2]> {
        let fused = self.host_tensor(name, &[num, 2 * n])?;
        let columns = fused.reshape(&[num * 2 * n, 1])?;
        let halves = [0, 1].map(|parity| -> Result<Array> {
            let picked = every_other_row(&columns, parity, 1)?;
            Ok(picked.reshape(&[num, n])?.to_device(self.device)?)
        });
        let [even, odd] = halves;
        Ok([even?, odd?])
    }
}

// gpt-oss: Hugging Face's MXFP4 experts. `{name}_blocks` u8 `[num, rows, cols / 32, 16]` holds
// MLX's mxfp4 codes byte for byte (mlx-lm's sanitize only views each row's bytes as u32 words)
// and `{name}_scales` u8 `[num, rows, cols / 32]` its e8m0 scales; a fused `gate_up_proj`
// alternates gate and up rows.
impl Weights {
    /// The `num` experts' `[rows, cols]` mxfp4 matrices under `name` (`..._blocks`,
    /// `..._scales`): one list, or two (even rows, odd rows) when `fused`.
    pub fn mxfp4_experts(
        &self,
        name: &str,
        num: usize,
        rows: usize,
        cols: usize,
        fused: bool,
    ) -> Result<Vec<Vec<Matrix>>> {
        let (blocks_name, scales_name) = (format!("{name}_blocks"), format!("{name}_scales"));
        let parts = if fused { 2 } else { 1 };
        let groups = cols / 32;
        let (blocks, scales) = (self.raw(&blocks_name)?, self.raw(&scales_name)?);
        let expect = |a: &Array, label: &str, shape: &[usize]| -> Result<()> {
            if a.dtype() != DType::U8 || a.shape() != shape || !cols.is_multiple_of(32) {
                return Err(self.err(
                    label,
                    format!("is {} {:?}; expected u8 {shape:?} (MXFP4 blocks of 32 values)", a.dtype(), a.shape()),
                ));
            }
            Ok(())
        };
        expect(&blocks, &blocks_name, &[num, parts * rows, groups, 16])?;
        expect(&scales, &scales_name, &[num, parts * rows, groups])?;
        let (codes, scale_bytes) = (blocks.to_vec::<u8>()?, scales.to_vec::<u8>()?);
        let spec = QuantSpec { mode: QuantMode::Mxfp4, bits: 4, group_size: 32 };
        let mut out: Vec<Vec<Matrix>> = (0..parts).map(|_| Vec::with_capacity(num)).collect();
        for e in 0..num {
            for (part, list) in out.iter_mut().enumerate() {
                let (mut words, mut row_scales) =
                    (Vec::with_capacity(rows * groups * 4), Vec::with_capacity(rows * groups));
                for r in 0..rows {
                    let source = e * parts * rows + r * parts + part;
                    let bytes = &codes[source * groups * 16..(source + 1) * groups * 16];
                    words.extend(bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])));
                    row_scales.extend_from_slice(&scale_bytes[source * groups..(source + 1) * groups]);
                }
                let packed = Array::from_slice(&words, &[rows, groups * 4])?;
                let q = Quantized::new_fp(packed, Array::from_slice(&row_scales, &[rows, groups])?, None, spec, cols)?;
                list.push(Matrix::Quantized(q).to_device(self.device)?);
            }
        }
        Ok(out)
    }
}

/// Rows `parity, parity + 2, ...` of the float array `a [2 * r, cols]`, copied.
fn every_other_row(a: &Array, parity: usize, cols: usize) -> Result<Array> {
    fn pick<T: nuvec::Element>(a: &Array, parity: usize, cols: usize) -> Result<Array> {
        let data = a.to_vec::<T>()?;
        let picked: Vec<T> = data.chunks(cols).skip(parity).step_by(2).flatten().copied().collect();
        Ok(Array::from_slice(&picked, &[picked.len() / cols.max(1), cols])?)
    }
    match a.dtype() {
        DType::F32 => pick::<f32>(a, parity, cols),
        DType::F16 => pick::<half::f16>(a, parity, cols),
        DType::BF16 => pick::<half::bf16>(a, parity, cols),
        other => Err(Error::Invalid(format!("cannot split rows of a {other} tensor"))),
    }
}
