//! One device's CUDA knobs, read once when the device starts: each is the device's setting
//! (`nuvec::tuning::configure`), else the environment's, else its default. A value the knob does
//! not take fails the device's start, naming the knob (`nuvec::tuning::refusal`), rather than
//! quietly running the default. The ops read them from the device's `State`.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::tuning::{find, refusal};
use crate::{Device, Error, Result};

use super::ops::prefill::MatmulPrecision;
use super::ops::qimma::Mode as QimmaMode;

/// Every CUDA knob of one device, parsed.
pub(crate) struct Knobs {
    /// `NUVEC_CUDA_ALLOC_CACHE_MB`: freed bytes the caching allocator keeps.
    pub(crate) alloc_cache_bytes: usize,
    /// `NUVEC_PDL`: launches with programmatic stream serialization (sm_90+ as well).
    pub(crate) pdl: bool,
    /// `NUVEC_FLASH_ATTENTION`: bf16 attention on the flash kernels (sm_80+ as well).
    pub(crate) flash_attention: bool,
    /// `NUVEC_CUDA_MATMUL`: the matmul precision.
    pub(crate) matmul: MatmulPrecision,
    /// `NUVEC_PAGED_FLASH`: many sequences' paged decode on the tensor cores.
    pub(crate) paged_flash: bool,
    /// `NUVEC_PAGED_PREFIX_MIN_KEYS`: the least keys a step's sequences must share for it to read
    /// them once for all (0: never); below it, the partials a group adds cost more than the reads
    /// it saves.
    pub(crate) paged_prefix_min_keys: usize,
    /// `NUVEC_ATTS_BATCH_BLOCKS`: blocks a paged decode step of many sequences aims its launch at
    /// (0: every sequence split as it is alone). A few waves of the GPU's multiprocessors: enough
    /// to keep them busy, few enough that each block has keys to amortize its start and its
    /// partial's merge.
    pub(crate) atts_batch_blocks: usize,
    /// `NUVEC_PAGED_FLASH_MIN_KEYS`: keys per split of the tensor-core paged decode at least (a
    /// multiple of 32): a step of few sequences would otherwise cut each into chunks of 32 keys,
    /// most of a warp's time then its start and its partial's merge.
    pub(crate) paged_flash_min_keys: usize,
    /// `NUVEC_QDEC_WGMMA`: the warpgroup register kernels always, never, or by their rule.
    pub(crate) qdec_wgmma: Option<bool>,
    /// `NUVEC_QDEC_TPB`: most weight tiles per block of the bf16 register kernels (2 unless 1).
    pub(crate) qdec_tpb: usize,
    /// `NUVEC_QDEC_ROWS`: most input rows the bf16 register kernels take (64 unless 16 or 32).
    pub(crate) qdec_rows: usize,
    /// `NUVEC_QDEC_SCALED_FROM`: the fewest input rows at which 4-bit weights with f16 or f32
    /// scales (GGUF's simple blocks and K-quants) take the bf16 register kernels, each weight
    /// decoded in f32 and rounded to bf16 (above 64 never): fewer rows take the integer register
    /// kernels up to 16 and the qmma kernels above.
    pub(crate) qdec_scaled_from: usize,
    /// `NUVEC_QIMMA`: which few-row register kernels run.
    pub(crate) qimma: QimmaMode,
    /// `NUVEC_MOE_GATHER_ROWS`: most rows whose experts run as gathered products.
    pub(crate) moe_gather_rows: usize,
    /// `NUVEC_MOE_GROUPED_ROWS`: rows from which experts run as grouped products.
    pub(crate) moe_grouped_rows: usize,
    /// `NUVEC_MOE_GROUPED`: grouped expert products allowed at all.
    pub(crate) moe_grouped: bool,
    /// `NUVEC_NORM_FOLD`: a decode step's norm folded into the next integer GEMV.
    pub(crate) norm_fold: bool,
    /// `NUVEC_GATE_UP_SILU`: gate, up and silu(gate) * up in one decode launch.
    pub(crate) gate_up_silu: bool,
    /// `NUVEC_ROPE_KV`: rope and the cache write in one decode launch.
    pub(crate) rope_kv: bool,
    /// `NUVEC_QGEMV_VARIANT`: the one-row 4-bit GEMV shape forced, by its knob value.
    pub(crate) qgemv_variant: Option<String>,
    /// `NUVEC_QGEMV_INT`: the integer dot-product GEMVs.
    pub(crate) qgemv_int: bool,
    /// `NUVEC_PRODUCER_PARTS`: the producers writing the integer GEMVs' parts (`None`: all).
    pub(crate) producer_parts: Option<Vec<String>>,
    /// `NUVEC_STAGED_UPLOADS`: small uploads through page-locked staging memory.
    pub(crate) staged_uploads: bool,
    /// `NUVEC_DECODE_STREAM`: prefill decodes quantized weights on a second stream.
    pub(crate) decode_stream: bool,
}

/// A process-wide choice a test or benchmark sets over every device's knob ([`Switch::set`]).
pub(crate) struct Switch(AtomicU8);

impl Switch {
    /// Nothing chosen: each device's knob decides.
    pub(crate) const fn unset() -> Self {
        Switch(AtomicU8::new(0))
    }

    /// Chooses `on` for the rest of the process.
    pub(crate) fn set(&self, on: bool) {
        self.0.store(if on { 2 } else { 1 }, Ordering::Relaxed);
    }

    /// The choice, else `knob`.
    pub(crate) fn or(&self, knob: bool) -> bool {
        match self.0.load(Ordering::Relaxed) {
            1 => false,
            2 => true,
            _ => knob,
        }
    }
}

impl Default for Knobs {
    /// Every knob at its default (what an unset environment gives).
    fn default() -> Self {
        Knobs::from_values(|_| None).expect("the defaults parse")
    }
}

impl Knobs {
    /// Device `ordinal`'s knobs.
    pub(crate) fn read(ordinal: usize) -> Result<Knobs> {
        let device = Device::Cuda(ordinal);
        Knobs::from_values(|name| crate::tuning::setting(name, device).ok())
    }

    /// The knobs from `value` (a knob's name to its text, `None` unset), each text checked
    /// against what its knob takes; an empty text is the default. Each knob is read by
    /// `cuda_knob("NAME")`, where the knob registry's test finds its reader.
    fn from_values(value: impl Fn(&'static str) -> Option<String>) -> Result<Knobs> {
        let cuda_knob = |name: &'static str| -> Result<Option<String>> {
            let knob = find(name).expect("a declared knob");
            match value(name) {
                Some(v) if v.is_empty() => Ok(None),
                Some(v) => match refusal(knob, &v) {
                    Some(why) => Err(Error::Setting(why)),
                    None => Ok(Some(v)),
                },
                None => Ok(None),
            }
        };
        let on_unless_0 = |v: Option<String>| v.as_deref() != Some("0");
        let on_if_1 = |v: Option<String>| v.as_deref() == Some("1");
        let count = |v: Option<String>, default: usize| v.map_or(default, |v| v.trim().parse().unwrap_or(default));
        Ok(Knobs {
            alloc_cache_bytes: count(cuda_knob("NUVEC_CUDA_ALLOC_CACHE_MB")?, super::alloc::DEFAULT_LIMIT >> 20)
                .saturating_mul(1 << 20),
            pdl: on_unless_0(cuda_knob("NUVEC_PDL")?),
            flash_attention: on_unless_0(cuda_knob("NUVEC_FLASH_ATTENTION")?),
            // A value the knob takes (checked) is a precision's name.
            matmul: cuda_knob("NUVEC_CUDA_MATMUL")?.and_then(|v| v.parse().ok()).unwrap_or(MatmulPrecision::DEFAULT),
            paged_flash: on_unless_0(cuda_knob("NUVEC_PAGED_FLASH")?),
            paged_prefix_min_keys: count(cuda_knob("NUVEC_PAGED_PREFIX_MIN_KEYS")?, 256),
            atts_batch_blocks: count(cuda_knob("NUVEC_ATTS_BATCH_BLOCKS")?, 2048),
            // Whole warps' worth of keys (the knob takes multiples of 32 only), at least one.
            paged_flash_min_keys: count(cuda_knob("NUVEC_PAGED_FLASH_MIN_KEYS")?, 96).next_multiple_of(32).max(32),
            qdec_wgmma: match cuda_knob("NUVEC_QDEC_WGMMA")?.as_deref() {
                Some("0") => Some(false),
                Some("1") => Some(true),
                _ => None,
            },
            qdec_tpb: if cuda_knob("NUVEC_QDEC_TPB")?.as_deref() == Some("1") { 1 } else { 2 },
            qdec_rows: match cuda_knob("NUVEC_QDEC_ROWS")?.as_deref() {
                Some("16") => 16,
                Some("32") => 32,
                _ => 64,
            },
            qdec_scaled_from: count(cuda_knob("NUVEC_QDEC_SCALED_FROM")?, 9),
            qimma: match cuda_knob("NUVEC_QIMMA")?.as_deref() {
                Some("0") => QimmaMode::Off,
                Some("1") => QimmaMode::All,
                Some("int") => QimmaMode::Registers,
                _ => QimmaMode::Decoded,
            },
            moe_gather_rows: count(cuda_knob("NUVEC_MOE_GATHER_ROWS")?, 64),
            moe_grouped_rows: count(cuda_knob("NUVEC_MOE_GROUPED_ROWS")?, 8),
            moe_grouped: on_unless_0(cuda_knob("NUVEC_MOE_GROUPED")?),
            norm_fold: on_unless_0(cuda_knob("NUVEC_NORM_FOLD")?),
            gate_up_silu: on_unless_0(cuda_knob("NUVEC_GATE_UP_SILU")?),
            rope_kv: on_unless_0(cuda_knob("NUVEC_ROPE_KV")?),
            qgemv_variant: cuda_knob("NUVEC_QGEMV_VARIANT")?.map(|v| v.trim().to_string()),
            qgemv_int: on_unless_0(cuda_knob("NUVEC_QGEMV_INT")?),
            producer_parts: match cuda_knob("NUVEC_PRODUCER_PARTS")? {
                Some(v) if v == "0" => Some(Vec::new()),
                Some(v) if v != "1" => Some(v.split(',').map(|p| p.trim().to_string()).collect()),
                _ => None,
            },
            staged_uploads: on_if_1(cuda_knob("NUVEC_STAGED_UPLOADS")?),
            decode_stream: on_unless_0(cuda_knob("NUVEC_DECODE_STREAM")?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_switch_is_the_knob_until_set() {
        let switch = Switch::unset();
        assert!(switch.or(true) && !switch.or(false));
        switch.set(false);
        assert!(!switch.or(true));
        switch.set(true);
        assert!(switch.or(false));
    }

    #[test]
    fn knobs_parse_as_their_readers_did_and_refuse_what_they_would_have_ignored() {
        let with = |pairs: &'static [(&'static str, &'static str)]| {
            Knobs::from_values(move |name| pairs.iter().find(|p| p.0 == name).map(|p| p.1.to_string()))
        };
        let d = Knobs::default();
        assert!(d.pdl && d.paged_flash && !d.staged_uploads && d.producer_parts.is_none());
        assert_eq!(
            (d.matmul, d.paged_flash_min_keys, d.moe_gather_rows, d.qdec_rows),
            (MatmulPrecision::Auto, 96, 64, 64)
        );
        let k = with(&[
            ("NUVEC_PDL", "0"),
            ("NUVEC_CUDA_MATMUL", " BF16 "),
            ("NUVEC_PAGED_FLASH_MIN_KEYS", "64"),
            ("NUVEC_CUDA_ALLOC_CACHE_MB", "2"),
            ("NUVEC_PRODUCER_PARTS", "norm, gate_up"),
            ("NUVEC_STAGED_UPLOADS", "1"),
            ("NUVEC_QIMMA", ""),
        ])
        .unwrap();
        assert!(!k.pdl && k.staged_uploads && k.qimma == QimmaMode::Decoded);
        assert_eq!((k.matmul, k.paged_flash_min_keys, k.alloc_cache_bytes), (MatmulPrecision::Bf16, 64, 2 << 20));
        assert_eq!(k.producer_parts, Some(vec!["norm".to_string(), "gate_up".to_string()]));
        for bad in [&[("NUVEC_PDL", "off")][..], &[("NUVEC_MOE_GATHER_ROWS", "many")], &[("NUVEC_CUDA_MATMUL", "fp16")]]
        {
            let why = with(bad).err().expect("refused").to_string();
            assert!(why.contains(bad[0].0) && why.contains("--help-env"), "{why}");
        }
    }
}
