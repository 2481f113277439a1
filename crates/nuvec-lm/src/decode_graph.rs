//! One-token decode steps replayed as a CUDA graph (feature `cuda`; see docs/cuda-graphs.md).
//!
//! A decode step of a dense Llama-family model launches ~10 kernels per layer, each costing
//! about 4 µs of host time: a small model is bound by the host. [`DecodeGraph`] runs the
//! second one-token step of a generation under a stream capture
//! ([`nuvec::backends::cuda::StepGraph`]) and replays that graph for the following steps,
//! with the position and token written to the graph's step scalars (which its position-dependent
//! kernels read on the device: no kernel node is patched on this path) and the caches' offsets
//! moved on by one
//! ([`KvCache::advance`](crate::cache::KvCache::advance)). It captures again when a cache is
//! about to grow (its buffers move every 256 positions) or holds other buffers than the ones
//! captured. Rotating caches (sliding-window layers, `max_kv_size`) take part once their buffers
//! hold the whole ring: the captured write and attention go on around the ring at each replay
//! ([`nuvec::Backend::write_axis1_ring`], [`nuvec::Backend::attention_ring`]), and
//! [`RotatingKvCache::advance_one`](crate::cache::RotatingKvCache::advance_one) moves their
//! counters. A capture that fails leaves the caches as they were before the step, which then
//! runs eagerly, and stops graphs for the rest of the generation. Anything not eligible (the
//! CPU, other families, caches that are not all plain or rotating ones of one float type)
//! runs exactly the eager path.
//!
//! `NUVEC_CUDA_GRAPHS=0` turns graphs off; `force` also tries families not known to capture
//! (for tests of the failure path).

use nuvec::{Array, Device};

use crate::cache::LayerCache;
use crate::{Error, Model, Result};

/// Families whose decode step reads nothing to the host (Llama-style decoders, dense or with
/// Qwen3-MoE's experts, which route on the device; gpt-oss, with its sliding layers' rings).
pub const GRAPH_MODEL_TYPES: &[&str] = &["llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gpt_oss"];

/// Whether decode steps may run as CUDA graphs (`NUVEC_CUDA_GRAPHS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphMode {
    /// Every step eager (`0`, `off`).
    Off,
    /// Graphs for the families in [`GRAPH_MODEL_TYPES`] (unset, `1`, `on`).
    On,
    /// Graphs tried for any family; a capture that fails falls back (`force`, for tests).
    Force,
}

impl GraphMode {
    /// `NUVEC_CUDA_GRAPHS` of `device`: its setting (`nuvec::tuning::configure`), else the
    /// environment's.
    pub fn for_device(device: nuvec::Device) -> Result<Self> {
        match nuvec::tuning::setting("NUVEC_CUDA_GRAPHS", device) {
            Ok(v) => Self::parse(&v),
            Err(_) => Ok(GraphMode::On),
        }
    }

    /// Parses a `NUVEC_CUDA_GRAPHS` value.
    pub fn parse(value: &str) -> Result<Self> {
        match value.trim() {
            "0" | "off" | "false" => Ok(GraphMode::Off),
            "" | "1" | "on" | "true" => Ok(GraphMode::On),
            "force" => Ok(GraphMode::Force),
            other => Err(Error::Invalid(format!("NUVEC_CUDA_GRAPHS={other:?}: use 0 (off), 1 (on) or force"))),
        }
    }
}

/// Why a one-token step cannot be a graph (`None`: it can): the mode, the model type, whether
/// the model is on a CUDA device, and its caches.
pub fn ineligible(mode: GraphMode, model_type: &str, on_cuda: bool, cache: &[LayerCache]) -> Option<&'static str> {
    if mode == GraphMode::Off {
        return Some("NUVEC_CUDA_GRAPHS=0");
    }
    if !on_cuda {
        return Some("the model is not on a CUDA device");
    }
    if mode == GraphMode::On && !GRAPH_MODEL_TYPES.contains(&model_type) {
        return Some("the model family's decode step is not known to be capturable");
    }
    let mut offsets = cache.iter().map(LayerCache::offset);
    let Some(first) = offsets.next() else {
        return Some("the model has no layers");
    };
    if offsets.any(|o| o != first) {
        return Some("the caches hold different numbers of positions");
    }
    // Plain or rotating caches of one float type (f32, f16 or bf16: the step's kernels take it
    // as a constant).
    let dtype_of = |c: &LayerCache| match c {
        LayerCache::Plain(kv) => kv.buffers().map(|(k, _)| k.dtype()),
        LayerCache::Rotating(r) => r.buffers().map(|(k, _)| k.dtype()),
        _ => None,
    };
    let dtype = dtype_of(&cache[0]);
    if !dtype.is_some_and(|d| d.is_float()) || cache.iter().any(|c| dtype_of(c) != dtype) {
        return Some("a cache is not a plain or rotating cache holding positions, or the caches differ in type");
    }
    None
}

// Used by the capture path, which only the `cuda` feature builds.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
/// Whether every cache has room for one more position without growing.
fn has_room(cache: &[LayerCache]) -> bool {
    cache.iter().all(|c| match c {
        LayerCache::Plain(kv) => kv.capacity() > c.offset(),
        LayerCache::Rotating(r) => r.steps_in_place(),
        _ => false,
    })
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
/// The storage of every cache's keys and values.
fn buffer_ids(cache: &[LayerCache]) -> Vec<(usize, usize)> {
    buffer_id_iter(cache).collect()
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
/// [`buffer_ids`] without collecting them (a replay compares them every step).
fn buffer_id_iter(cache: &[LayerCache]) -> impl Iterator<Item = (usize, usize)> + '_ {
    cache.iter().filter_map(|c| match c {
        LayerCache::Plain(kv) => kv.buffers().map(|(k, v)| (k.storage_id(), v.storage_id())),
        LayerCache::Rotating(r) => r.buffers().map(|(k, v)| (k.storage_id(), v.storage_id())),
        _ => None,
    })
}

/// Runs one-token decode steps, as CUDA graphs where it can (see the module notes).
#[derive(Debug)]
pub struct DecodeGraph {
    mode: GraphMode,
    /// The logits' shape of the last eager step (`None` before one: the first one-token step
    /// runs eagerly, building what a capture cannot upload).
    out_shape: Option<Vec<usize>>,
    /// Why graphs were given up for this generation.
    stopped: Option<String>,
    replayed: usize,
    captures: usize,
    /// Kernel nodes the last captured graph patches from the host at each replay.
    patched: Option<usize>,
    #[cfg(feature = "cuda")]
    held: Option<Held>,
}

#[cfg(feature = "cuda")]
#[derive(Debug)]
struct Held {
    graph: nuvec::backends::cuda::StepGraph,
    /// The caches' buffers the graph writes.
    buffers: Vec<(usize, usize)>,
}

impl DecodeGraph {
    /// In `mode`.
    pub fn new(mode: GraphMode) -> Self {
        DecodeGraph {
            mode,
            out_shape: None,
            stopped: None,
            replayed: 0,
            captures: 0,
            patched: None,
            #[cfg(feature = "cuda")]
            held: None,
        }
    }

    /// In the mode `NUVEC_CUDA_GRAPHS` asks for on `device`.
    pub fn for_device(device: nuvec::Device) -> Result<Self> {
        Ok(Self::new(GraphMode::for_device(device)?))
    }

    /// Steps computed by replaying a graph.
    pub fn replayed_steps(&self) -> usize {
        self.replayed
    }

    /// Graphs captured.
    pub fn captures(&self) -> usize {
        self.captures
    }

    /// Kernel nodes whose parameters each replay of the last captured graph sets from the host
    /// (`None` before any capture). 0 on the Llama/Qwen path: its position-dependent kernels read
    /// the step's scalars on the device instead.
    pub fn patched_nodes(&self) -> Option<usize> {
        self.patched
    }

    /// Why graphs stopped for this generation (a capture failed), if they did.
    pub fn stopped(&self) -> Option<&str> {
        self.stopped.as_deref()
    }

    /// Logits `[1, vocab]` of `token` at the caches' position, extending `cache` by one: a
    /// graph replay, a capture, or the eager [`Model::forward_last`].
    pub fn step(&mut self, model: &Model, cache: &mut [LayerCache], token: u32) -> Result<Array> {
        let on_cuda = model.device() != Device::Cpu;
        if self.stopped.is_some() || ineligible(self.mode, model.model_type(), on_cuda, cache).is_some() {
            return model.forward_last(&[token], cache);
        }
        self.graph_step(model, cache, token)
    }

    fn eager(&mut self, model: &Model, cache: &mut [LayerCache], token: u32) -> Result<Array> {
        let y = model.forward_last(&[token], cache)?;
        self.out_shape = Some(y.shape().to_vec());
        Ok(y)
    }

    #[cfg(not(feature = "cuda"))]
    fn graph_step(&mut self, model: &Model, cache: &mut [LayerCache], token: u32) -> Result<Array> {
        self.eager(model, cache, token)
    }

    #[cfg(feature = "cuda")]
    fn graph_step(&mut self, model: &Model, cache: &mut [LayerCache], token: u32) -> Result<Array> {
        use nuvec::backends::cuda::StepGraph;
        let Device::Cuda(ordinal) = model.device() else {
            return self.eager(model, cache, token);
        };
        let pos = cache.first().map_or(0, LayerCache::offset);
        let room = has_room(cache);
        if let Some(held) = &mut self.held {
            if room && held.buffers.iter().copied().eq(buffer_id_iter(cache)) {
                if let Some(y) = held.graph.replay(pos, token)? {
                    for c in cache.iter_mut() {
                        match c {
                            LayerCache::Plain(kv) => kv.advance(1)?,
                            LayerCache::Rotating(r) => r.advance_one()?,
                            _ => {}
                        }
                    }
                    self.replayed += 1;
                    return Ok(y);
                }
            }
            self.held = None;
        }
        let Some(out_shape) = self.out_shape.clone().filter(|_| room) else {
            // The first one-token step (or one that grows a cache) runs eagerly.
            return self.eager(model, cache, token);
        };
        let before = buffer_ids(cache);
        let counters: Vec<Option<(usize, usize)>> = cache
            .iter()
            .map(|c| match c {
                LayerCache::Rotating(r) => Some(r.counters()),
                _ => None,
            })
            .collect();
        let captured = StepGraph::capture(ordinal, pos, token, &out_shape, || model.forward_last(&[token], cache));
        match captured {
            Ok((y, graph)) => {
                let buffers = buffer_ids(cache);
                if buffers != before {
                    return Err(Error::Invalid(
                        "a captured decode step replaced a KV cache's buffers (it should have failed)".into(),
                    ));
                }
                self.patched = Some(graph.patched_nodes());
                self.held = Some(Held { graph, buffers });
                self.captures += 1;
                Ok(y)
            }
            Err(e) => {
                // Nothing of the captured step ran: undo what it did on the host, then run it (a
                // ring's in-place step cannot be trimmed: its counters go back).
                for (c, counters) in cache.iter_mut().zip(counters) {
                    match (c, counters) {
                        (LayerCache::Rotating(r), Some(counters)) => r.set_counters(counters),
                        (c, _) => {
                            let extra = c.offset().saturating_sub(pos);
                            c.trim(extra)?;
                        }
                    }
                }
                if buffer_ids(cache) != before {
                    return Err(Error::Invalid(format!(
                        "a failed CUDA-graph capture replaced the KV caches' buffers ({e}); run with \
                         NUVEC_CUDA_GRAPHS=0"
                    )));
                }
                self.stopped = Some(e.to_string());
                self.eager(model, cache, token)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{KvCache, RecurrentCache, RotatingKvCache};
    use nuvec::DType;

    fn plain(positions: usize, dtype: DType) -> LayerCache {
        let mut c = KvCache::with_dtype(dtype);
        if positions > 0 {
            let kv = Array::from_slice(&vec![0.5f32; 2 * positions * 4], &[2, positions, 4]).unwrap();
            c.update_and_fetch(&kv, &kv).unwrap();
        }
        LayerCache::Plain(c)
    }

    #[test]
    fn only_llama_style_families_with_plain_caches_of_one_type_on_cuda_are_eligible() {
        let good = vec![plain(3, DType::F32), plain(3, DType::F32)];
        for family in GRAPH_MODEL_TYPES {
            assert_eq!(ineligible(GraphMode::On, family, true, &good), None, "{family}");
        }
        let half = vec![plain(3, DType::BF16), plain(3, DType::BF16)];
        assert_eq!(ineligible(GraphMode::On, "llama", true, &half), None, "bf16 caches");
        assert!(ineligible(GraphMode::Off, "llama", true, &good).is_some());
        assert!(ineligible(GraphMode::On, "llama", false, &good).is_some(), "the CPU never captures");
        for family in ["qwen3_5", "gemma4_text"] {
            assert!(ineligible(GraphMode::On, family, true, &good).is_some(), "{family}");
            assert_eq!(ineligible(GraphMode::Force, family, true, &good), None, "force tries {family}");
        }
        let rings = vec![plain(3, DType::F32), ring(3, 8, 0)];
        assert_eq!(ineligible(GraphMode::On, "gpt_oss", true, &rings), None, "plain and rotating caches");
        let cases: [(&str, Vec<LayerCache>); 6] = [
            ("an empty rotating cache", vec![LayerCache::Rotating(RotatingKvCache::new(8, 0).unwrap())]),
            ("f32 and bf16 caches", vec![plain(3, DType::F32), plain(3, DType::BF16)]),
            ("empty cache", vec![plain(0, DType::F32)]),
            ("uneven offsets", vec![plain(3, DType::F32), plain(4, DType::F32)]),
            ("recurrent layer", vec![plain(3, DType::F32), LayerCache::Recurrent(RecurrentCache::new())]),
            ("no layers", vec![]),
        ];
        for (what, cache) in cases {
            assert!(ineligible(GraphMode::Force, "llama", true, &cache).is_some(), "{what}");
        }
    }

    /// A rotating cache that has seen `positions` (prefilled as one chunk).
    fn ring(positions: usize, max_size: usize, keep: usize) -> LayerCache {
        let mut c = RotatingKvCache::new(max_size, keep).unwrap();
        let kv = Array::from_slice(&vec![0.5f32; 2 * positions * 4], &[2, positions, 4]).unwrap();
        let q = Array::from_slice(&vec![0.5f32; positions * 2 * 4], &[positions, 2, 4]).unwrap();
        c.attend(&q, &kv, &kv, 0.5).unwrap();
        LayerCache::Rotating(c)
    }

    /// A ring steps in place once its buffers hold all of it; advancing it moves its counters as
    /// a one-position step does (wrapping to `keep`), and moves no buffer.
    #[test]
    fn rotating_caches_step_in_place_once_their_ring_is_whole() {
        for (positions, keep) in [(20usize, 0usize), (20, 2), (3, 0), (3, 2)] {
            let (LayerCache::Rotating(mut stepped), LayerCache::Rotating(mut advanced)) =
                (ring(positions, 8, keep), ring(positions, 8, keep))
            else {
                unreachable!()
            };
            let kv = Array::from_slice(&[0.25f32; 8], &[2, 1, 4]).unwrap();
            let q = Array::from_slice(&[0.25f32; 8], &[1, 2, 4]).unwrap();
            // The first step after a prefill reshapes the buffers (a longer chunk cut to the ring,
            // or a short one grown to it): a graph cannot replay it.
            assert!(!stepped.steps_in_place(), "{positions} positions");
            assert!(advanced.advance_one().is_err(), "{positions}: refused before the ring is whole");
            for c in [&mut stepped, &mut advanced] {
                c.attend(&q, &kv, &kv, 0.5).unwrap();
            }
            let ids = LayerCache::Rotating(advanced.clone());
            let ids = buffer_ids(std::slice::from_ref(&ids));
            for step in 0..20 {
                assert!(stepped.steps_in_place() && has_room(&[LayerCache::Rotating(stepped.clone())]));
                stepped.attend(&q, &kv, &kv, 0.5).unwrap();
                advanced.advance_one().unwrap();
                assert_eq!(stepped.counters(), advanced.counters(), "{positions} keep {keep}, step {step}");
            }
            let after = LayerCache::Rotating(advanced);
            assert_eq!(buffer_ids(std::slice::from_ref(&after)), ids, "advancing moves no buffer");
        }
    }

    #[test]
    fn room_and_buffer_identity_follow_the_caches() {
        let mut cache = vec![plain(255, DType::F32)];
        assert!(has_room(&cache));
        let ids = buffer_ids(&cache);
        assert_eq!(ids.len(), 1);
        if let LayerCache::Plain(kv) = &mut cache[0] {
            kv.advance(1).unwrap();
        }
        assert!(!has_room(&cache), "256 of 256 positions: the next step grows the cache");
        assert_eq!(buffer_ids(&cache), ids, "advancing moves no buffer");
        let kv = Array::from_slice(&[0.5f32; 8], &[2, 1, 4]).unwrap();
        if let LayerCache::Plain(c) = &mut cache[0] {
            c.update_and_fetch(&kv, &kv).unwrap();
        }
        assert!(has_room(&cache));
        assert_ne!(buffer_ids(&cache), ids, "growing moves the buffers");
    }

    #[test]
    fn the_mode_parses_and_names_bad_values() {
        assert_eq!(GraphMode::parse("0").unwrap(), GraphMode::Off);
        assert_eq!(GraphMode::parse("1").unwrap(), GraphMode::On);
        assert_eq!(GraphMode::parse("force").unwrap(), GraphMode::Force);
        let err = GraphMode::parse("yes please").unwrap_err().to_string();
        assert!(err.contains("NUVEC_CUDA_GRAPHS"), "{err}");
    }
}
