//! Decode attention of many sequences over one paged cache on a CUDA device: one split-key
//! launch over every sequence (attention.cu's `paged_attention_split_f32`, reading the blocks
//! through each sequence's table, in the store's f32, f16 or bf16; the query heads of a KV group
//! in one block when the step has sequences enough to fill the GPU so) and one merge, instead of
//! gathers, transposes and two launches per sequence. On the tensor cores, keys several
//! sequences share (the same blocks: [`shared_prefixes`]) are read once per group of them.

use cudarc::driver::LaunchConfig;

use super::shared_prefix::{shared_prefixes, SharedPrefixes, PX_KEYS, PX_TILE, PX_WARPS};
use super::{split_rows_aligned, to_i32, CudaBackend, ATTS_MAX_DIM, ATTS_TARGET_BLOCKS, ATTS_THREADS, DT_BF16, DT_F16};
use crate::backend::{
    check_paged, check_paged_quantized, paged_decode_attention_composed, paged_decode_attention_quantized_composed,
    PagedSeq,
};
use crate::backends::cuda::knobs::Knobs;
use crate::backends::cuda::{Derived, DeviceBuffer, State};
use crate::{Array, DType, Error, Quantized, Result};

impl CudaBackend {
    /// [`crate::Backend::paged_decode_attention`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn paged_attention(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        seqs: &[PagedSeq<'_>],
        block_size: usize,
        scale: f32,
        sinks: Option<&[f32]>,
    ) -> Result<Array> {
        let op = "paged_decode_attention";
        let (n, hq, hkv, d, _) = check_paged(q, k, v, seqs, block_size, sinks)?;
        let qp = self.f32_ptr(op, "q", q)?;
        let (kp, vp, kv_dt) = self.kv_ptrs(op, k, v)?;
        if !split_rows_aligned(d, qp, kp, vp, kv_dt) || d > ATTS_MAX_DIM || n > 65535 {
            return paged_decode_attention_composed(self, q, k, v, seqs, block_size, scale, sinks);
        }
        // The grid's shape follows the sequences' lengths, which no graph replay patches.
        self.st()?.not_capturing("paged decode attention")?;
        // Each sequence's splits as a decode of it alone takes them (`attention_split` for one
        // query), so its partials and result are that decode's; unless the step has sequences
        // enough to fill the GPU without splitting them so finely (`batch_splits`).
        let want = ATTS_TARGET_BLOCKS.div_ceil(hq).max(1);
        let step = self.step_tables(op, seqs, block_size)?;
        let sp = match sinks {
            Some(s) => self.sinks_table(s)?,
            None => 0,
        };
        let out = self.output(&[n, hq * d], DType::F32, false)?;

        let (tp, lp) = (step.tables.ptr(), step.lens.ptr());
        let (stridei, hqi, hkvi, di) = (to_i32(op, "table", step.stride)?, hq as i32, hkv as i32, d as i32);
        let (bsi, wanti) = (to_i32(op, "block size", block_size)?, to_i32(op, "splits", want)?);
        let gh = heads_per_block(n, hq, hkv, d, want);
        // A step of several sequences on the tensor cores where it can: one warp per KV head of
        // a sequence and split (one chunk of keys for all, at least `NUVEC_PAGED_FLASH_MIN_KEYS`), the
        // group's query heads the rows of its MMAs. `NUVEC_ATTS_BATCH_BLOCKS=0` keeps every
        // sequence's solo splits, so the f32 kernel. There, keys that sequences share (the same
        // blocks) are read once for each group of them, and each sequence's own keys after them
        // (not in a sliding-window layer, whose sequences start where their windows do).
        let knobs = &self.st()?.knobs;
        let flash = n >= 2 && knobs.atts_batch_blocks > 0 && self.paged_flash_takes(qp, kv_dt, hq, hkv, d)?;
        let shared = if flash && step.starts.is_none() {
            let tables: Vec<&[u32]> = seqs.iter().map(|s| s.table).collect();
            let lens: Vec<usize> = seqs.iter().map(|s| s.len).collect();
            shared_prefixes(&tables, &lens, block_size, knobs.paged_prefix_min_keys)
        } else {
            SharedPrefixes::default()
        };
        // Where each sequence's own keys start: after its shared keys, or where its window does.
        let starts: Vec<usize> = match step.starts {
            Some(_) => seqs.iter().map(|s| s.first).collect(),
            None => shared.starts(n),
        };
        let own = || seqs.iter().zip(&starts).map(|(s, &start)| s.len - start);
        let keys_of = KeyCounts { total: own().sum(), longest: own().max().unwrap_or(0) };
        let (keys, mut splits) = if flash {
            flash_chunk(keys_of, hkv, knobs.atts_batch_blocks, knobs.paged_flash_min_keys)
        } else {
            batch_splits(n, keys_of, hq / gh, want, knobs.atts_batch_blocks).unwrap_or((0, want))
        };
        // The shared keys' partials take the last `prefix_slots` of each member's row of
        // partials, after the most its own keys take.
        let tiles = shared.tiles(hq / hkv);
        let tile_count = tiles.len() / PX_TILE;
        let (prefix_keys, prefix_slots) = if tile_count > 0 {
            let pkeys = prefix_chunk(knobs, shared.tile_keys(hq / hkv), hkv);
            let most_own = |grouped: bool| {
                let own = seqs.iter().zip(&starts).filter(|(_, &st)| (st > 0) == grouped);
                own.map(|(s, &st)| (s.len - st).div_ceil(keys)).max().unwrap_or(0)
            };
            let slots = shared.longest().div_ceil(pkeys);
            splits = (most_own(true) + slots).max(most_own(false));
            (pkeys, slots)
        } else {
            (0, 0)
        };
        let part = DeviceBuffer::alloc(self.st()?, n * hq * splits * (d + 2) * 4)?;
        let pp = part.ptr();
        let (keysi, splitsi) = (to_i32(op, "keys per split", keys)?, to_i32(op, "splits", splits)?);
        if flash {
            let cfg = LaunchConfig {
                grid_dim: (hkv as u32, n as u32, splits as u32),
                block_dim: (32, 1, 1),
                shared_mem_bytes: paged_flash_smem_bytes(d, PAGED_FLASH_KEYS) as u32,
            };
            let shared_starts = if tile_count > 0 {
                let starts = starts.iter().map(|&s| to_i32(op, "shared keys", s)).collect::<Result<Vec<i32>>>()?;
                Some(self.upload(&starts)?)
            } else {
                None
            };
            let sp0 = shared_starts.as_ref().map_or(step.starts_ptr(), DeviceBuffer::ptr);
            let pslots = prefix_slots as i32;
            // [store type][head size]: bf16 or f16, 64 or 128 (`paged_flash_takes`).
            let (half, dim) = (usize::from(kv_dt == DT_F16), usize::from(d == 128));
            let name = PAGED_FLASH_DECODE[half][dim];
            launch!(self.st()?, op, name, cfg; pp, qp, kp, vp, tp, stridei, lp, hqi, hkvi, bsi, scale, keysi, sp0, pslots);
            if tile_count > 0 {
                let tiles = self.upload(&tiles)?;
                let cfg = LaunchConfig {
                    grid_dim: (hkv as u32, tile_count as u32, prefix_slots as u32),
                    block_dim: (PX_WARPS as u32 * 32, 1, 1),
                    shared_mem_bytes: paged_flash_smem_bytes(d, PX_KEYS) as u32,
                };
                let name = PAGED_PREFIX_FLASH[half][dim];
                let (ti, pki) = (tiles.ptr(), to_i32(op, "shared keys per split", prefix_keys)?);
                launch!(self.st()?, op, name, cfg; pp, qp, kp, vp, tp, stridei, ti, hqi, hkvi, bsi, scale, pki, splitsi);
            }
        } else {
            let cfg = LaunchConfig {
                grid_dim: ((hq / gh) as u32, n as u32, splits as u32),
                block_dim: (ATTS_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let ghi = gh as i32;
            let stp = step.starts_ptr();
            launch!(self.st()?, op, "paged_attention_split_f32", cfg;
                pp, qp, kp, vp, tp, stridei, lp, stp, hqi, hkvi, di, bsi, scale, wanti, keysi, kv_dt, ghi);
        }
        self.merge_partials(op, &out, pp, (n, hq, d, splits), sp)?;
        Ok(out)
    }

    /// The merge of a paged decode's partials `pp` (`splits` per sequence and head) into `out
    /// [n, Hq * D]`, `sp` the sinks' device table (0 for none).
    fn merge_partials(
        &self,
        op: &'static str,
        out: &Array,
        pp: u64,
        dims: (usize, usize, usize, usize),
        sp: u64,
    ) -> Result<()> {
        let (n, hq, d, splits) = dims;
        let o = out.cuda_ptr()?;
        let (hqi, di, splitsi) = (hq as i32, d as i32, to_i32(op, "splits", splits)?);
        let cfg = LaunchConfig { grid_dim: (hq as u32, n as u32, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        // The rows as the output projection's bf16 input too, where it could read them so (the
        // merge's warps hold whole 32-value chunks when D is a multiple of 32).
        let tiles = if d.is_multiple_of(32) { self.bf16_tiles_for(n, hq * d)? } else { None };
        let (no_parts, tp) = (0u64, tiles.as_ref().map_or(0, DeviceBuffer::ptr));
        launch!(self.st()?, op, "attention_merge_f32", cfg; o, pp, hqi, di, splitsi, sp, no_parts, tp);
        if let Some(tiles) = tiles {
            out.set_derived(Derived::Bf16Tiles { k: hq * d }, tiles);
        }
        Ok(())
    }

    /// [`crate::Backend::paged_decode_attention_quantized`]: attention.cu's
    /// `paged_attention_split_quant_f32` reading 4- and 8-bit codes in place, with the f32 store's
    /// splits (so each sequence's result is its attention over its positions dequantized, bit
    /// for bit, while the step keeps each sequence's solo splits), then the merge. Other widths,
    /// and head sizes the split kernel does not take, go through the composed default.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn paged_attention_quantized(
        &self,
        q: &Array,
        k: &Quantized,
        v: &Quantized,
        seqs: &[PagedSeq<'_>],
        block_size: usize,
        scale: f32,
        sinks: Option<&[f32]>,
    ) -> Result<Array> {
        let op = "paged_decode_attention_quantized";
        let (n, hq, hkv, d, _) = check_paged_quantized(q, k, v, seqs, block_size, sinks)?;
        let qp = self.f32_ptr(op, "q", q)?;
        let bits = k.spec.bits;
        if !(bits == 4 || bits == 8) || !d.is_multiple_of(4) || !qp.is_multiple_of(16) || d > ATTS_MAX_DIM || n > 65535
        {
            return paged_decode_attention_quantized_composed(self, q, k, v, seqs, block_size, scale, sinks);
        }
        self.st()?.not_capturing("paged decode attention")?;
        let mut ptrs = [0u64; 6];
        for (slot, (part, name)) in ptrs.iter_mut().zip([
            (&k.packed, "key words"),
            (&k.scales, "key scales"),
            (&k.biases, "key biases"),
            (&v.packed, "value words"),
            (&v.scales, "value scales"),
            (&v.biases, "value biases"),
        ]) {
            *slot = self.ptr(op, name, part)?;
        }
        let [kw, ks, kb, vw, vs, vb] = ptrs;
        let want = ATTS_TARGET_BLOCKS.div_ceil(hq).max(1);
        let step = self.step_tables(op, seqs, block_size)?;
        let sp = match sinks {
            Some(s) => self.sinks_table(s)?,
            None => 0,
        };
        let gh = heads_per_block(n, hq, hkv, d, want);
        let knobs = &self.st()?.knobs;
        let keys_of = KeyCounts {
            total: seqs.iter().map(PagedSeq::attended).sum(),
            longest: seqs.iter().map(PagedSeq::attended).max().unwrap_or(0),
        };
        let (keys, splits) = batch_splits(n, keys_of, hq / gh, want, knobs.atts_batch_blocks).unwrap_or((0, want));
        let part = DeviceBuffer::alloc(self.st()?, n * hq * splits * (d + 2) * 4)?;
        let pp = part.ptr();
        let out = self.output(&[n, hq * d], DType::F32, false)?;
        let cfg = LaunchConfig {
            grid_dim: ((hq / gh) as u32, n as u32, splits as u32),
            block_dim: (ATTS_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (tp, lp, stp) = (step.tables.ptr(), step.lens.ptr(), step.starts_ptr());
        let stridei = to_i32(op, "table", step.stride)?;
        let (hqi, hkvi, di, bsi) = (hq as i32, hkv as i32, d as i32, to_i32(op, "block size", block_size)?);
        let (wanti, keysi, bitsi, gsi, ghi) = (
            to_i32(op, "splits", want)?,
            to_i32(op, "keys per split", keys)?,
            bits as i32,
            k.spec.group_size as i32,
            gh as i32,
        );
        launch!(self.st()?, op, "paged_attention_split_quant_f32", cfg;
            pp, qp, kw, ks, kb, vw, vs, vb, tp, stridei, lp, stp, hqi, hkvi, di, bsi, scale, wanti, keysi, bitsi, gsi, ghi);
        self.merge_partials(op, &out, pp, (n, hq, d, splits), sp)?;
        Ok(out)
    }

    /// A step's block tables on the device: one row of `stride` block ids per sequence, the
    /// blocks its attended positions use (a sliding window's from the block it starts in, so
    /// positions count from that block's first), with its length and the first position it
    /// attends in the same count (the starts only when a sequence has a window).
    fn step_tables(&self, op: &'static str, seqs: &[PagedSeq<'_>], block_size: usize) -> Result<StepTables> {
        let stride = seqs.iter().map(|s| s.used_blocks(block_size).len()).max().unwrap_or(1);
        let mut tables = vec![0i32; seqs.len() * stride];
        let (mut lens, mut starts) = (Vec::with_capacity(seqs.len()), Vec::with_capacity(seqs.len()));
        for (row, s) in tables.chunks_exact_mut(stride).zip(seqs) {
            for (t, &b) in row.iter_mut().zip(s.used_blocks(block_size)) {
                *t = to_i32(op, "block id", b as usize)?;
            }
            let base = s.first / block_size * block_size;
            lens.push(to_i32(op, "sequence length", s.len - base)?);
            starts.push((s.first - base) as i32);
        }
        let windowed = seqs.iter().any(|s| s.first > 0);
        Ok(StepTables {
            tables: self.upload_shared(&tables)?,
            stride,
            lens: self.upload_shared(&lens)?,
            starts: if windowed { Some(self.upload_shared(&starts)?) } else { None },
        })
    }
}

impl CudaBackend {
    /// Whether a step of many sequences runs its paged decode on the tensor cores
    /// (flash_attention.cu `paged_flash_decode_{bf16,f16}_d*`): a bf16 or f16 store (a GGUF
    /// model's caches: f16 MMAs over the keys and values as stored), head sizes 64 and 128, up
    /// to 16 query heads per KV head, attention on the bf16 path by the matmul precision (as the
    /// prefill's flash kernels), sm_80+ (`NUVEC_FLASH_ATTENTION=0` or `NUVEC_PAGED_FLASH=0` off).
    fn paged_flash_takes(&self, qp: u64, kv_dt: i32, hq: usize, hkv: usize, d: usize) -> Result<bool> {
        let st = self.st()?;
        Ok(st.knobs.paged_flash
            && st.flash
            && (kv_dt == DT_BF16 || kv_dt == DT_F16)
            && (d == 64 || d == 128)
            && hq / hkv <= 16
            && qp.is_multiple_of(8)
            && st.matmul_precision().bf16_attention(crate::hint_is_half()))
    }
}

/// [`CudaBackend::step_tables`]: a step's tables, lengths and (with a sliding window) first
/// positions, on the device.
struct StepTables {
    tables: std::sync::Arc<DeviceBuffer>,
    stride: usize,
    lens: std::sync::Arc<DeviceBuffer>,
    starts: Option<std::sync::Arc<DeviceBuffer>>,
}

impl StepTables {
    /// The starts' device address, 0 (every sequence from its first position) without them.
    fn starts_ptr(&self) -> u64 {
        self.starts.as_ref().map_or(0, |s| s.ptr())
    }
}

/// The tensor-core paged decode kernels by store type (bf16, f16) and head size (64, 128).
const PAGED_FLASH_DECODE: [[&str; 2]; 2] = [
    ["paged_flash_decode_bf16_d64", "paged_flash_decode_bf16_d128"],
    ["paged_flash_decode_f16_d64", "paged_flash_decode_f16_d128"],
];
/// The shared-keys kernels, the same way.
const PAGED_PREFIX_FLASH: [[&str; 2]; 2] = [
    ["paged_prefix_flash_bf16_d64", "paged_prefix_flash_bf16_d128"],
    ["paged_prefix_flash_f16_d64", "paged_prefix_flash_f16_d128"],
];

/// Keys per tile of the tensor-core paged decode (flash_attention.cu `PF_KEYS`).
const PAGED_FLASH_KEYS: usize = 16;

/// Dynamic shared memory of the tensor-core paged decode kernels: K and V tiles of `keys` keys
/// (rows of D + 8 bf16), double-buffered.
fn paged_flash_smem_bytes(d: usize, keys: usize) -> usize {
    4 * keys * (d + 8) * 2
}

/// Keys per split of the shared-keys kernel for tiles reading `tile_keys` shared keys in all:
/// about `NUVEC_ATTS_BATCH_BLOCKS / PX_WARPS` blocks of four warps over the `hkv` heads, in whole tiles of
/// `PX_KEYS`, and at least `PREFIX_SPLIT_KEYS` (each split writes a partial per member head).
fn prefix_chunk(knobs: &Knobs, tile_keys: usize, hkv: usize) -> usize {
    let target = (knobs.atts_batch_blocks / PX_WARPS).max(1);
    (tile_keys * hkv).div_ceil(target).next_multiple_of(PX_KEYS).max(PREFIX_SPLIT_KEYS)
}
const PREFIX_SPLIT_KEYS: usize = 256;

/// A step's sequence lengths as the split rules need them: their sum and the longest.
#[derive(Clone, Copy)]
struct KeyCounts {
    total: usize,
    longest: usize,
}

/// The keys per split and the splits of a step's paged decode launch where its `n` sequences,
/// split as each is alone (`solo` splits each, `per_split` blocks per split and sequence), would
/// launch more than `target` blocks: one chunk of keys for all sequences (a multiple of 32), so
/// that the launch has about `target` blocks of one size; `None` to keep the solo splits (then
/// each sequence's result is its decode's alone, bit for bit; with a common chunk the splits
/// differ and the result matches to rounding).
fn batch_splits(n: usize, keys: KeyCounts, per_split: usize, solo: usize, target: usize) -> Option<(usize, usize)> {
    if target == 0 || n * per_split * solo <= target {
        return None;
    }
    Some(common_chunk(keys, per_split, target))
}

/// One chunk of keys (a multiple of 32) so that a launch of `per_split` blocks per sequence and
/// split has about `target` blocks, and the splits the longest sequence takes.
fn common_chunk(keys: KeyCounts, per_split: usize, target: usize) -> (usize, usize) {
    let chunk = (keys.total * per_split).div_ceil(target.max(1)).next_multiple_of(32).max(32);
    (chunk, keys.longest.div_ceil(chunk).max(1))
}

/// The tensor-core paged decode's chunk of keys and splits: `common_chunk`'s for `per_split`
/// warps per sequence and split, but at least `min_keys` keys a split.
fn flash_chunk(keys: KeyCounts, per_split: usize, target: usize, min_keys: usize) -> (usize, usize) {
    let chunk = common_chunk(keys, per_split, target).0.max(min_keys);
    (chunk, keys.longest.div_ceil(chunk).max(1))
}

/// Query heads per block of the paged decode kernel: several heads of one KV group (up to 4, head
/// sizes up to 128) load each key and value row once for all of them, where a block per head
/// reads every row once per head; one head per block when grouping would leave fewer blocks than
/// a decode alone launches (a step of few sequences wants the parallelism more). Each head's
/// result is the same bit for bit either way.
fn heads_per_block(n: usize, hq: usize, hkv: usize, d: usize, want: usize) -> usize {
    let group = hq / hkv;
    let gh = [4, 3, 2].into_iter().find(|g| group.is_multiple_of(*g)).unwrap_or(1);
    if d <= 128 && gh > 1 && n * (hq / gh) * want >= ATTS_TARGET_BLOCKS {
        gh
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::{batch_splits, flash_chunk, heads_per_block, KeyCounts};
    use crate::backends::cuda::knobs::Knobs;

    /// `batch_splits` for sequences of `lens` positions.
    fn splits_of(lens: &[usize], per_split: usize, solo: usize, target: usize) -> Option<(usize, usize)> {
        let keys = KeyCounts { total: lens.iter().sum(), longest: lens.iter().copied().max().unwrap_or(0) };
        batch_splits(lens.len(), keys, per_split, solo, target)
    }

    #[test]
    fn many_sequences_share_one_chunk_of_keys() {
        // 64 sequences of 550 positions, 8 blocks per split (Llama-3 8B, 4 heads per block).
        let lens = vec![550; 64];
        let (keys, splits) = splits_of(&lens, 8, 16, 2048).unwrap();
        assert_eq!((keys, splits), (160, 4));
        assert!(lens.len() * 8 * splits <= 2048 + 64 * 8);
        // Few sequences keep their solo splits (bit for bit their own decode).
        assert_eq!(splits_of(&[1, 16, 33, 200, 700], 2, 64, 2048), None);
        assert_eq!(splits_of(&[550; 8], 8, 16, 2048), None);
        assert_eq!(splits_of(&lens, 8, 16, 0), None, "0 turns it off");
        // A long sequence among short ones takes more splits of the same size.
        let (keys, splits) = splits_of(&[2100, 1, 17, 300].repeat(16), 8, 16, 2048).unwrap();
        assert_eq!(keys % 32, 0);
        assert_eq!(splits, 2100usize.div_ceil(keys));
    }

    #[test]
    fn the_tensor_core_decode_takes_whole_chunks_of_keys_for_few_sequences() {
        let keys =
            |lens: &[usize]| KeyCounts { total: lens.iter().sum(), longest: lens.iter().copied().max().unwrap() };
        // Llama-3 8B (8 KV heads, a warp per KV head and split): 8 sequences of 550 positions
        // would take chunks of 32 keys (1 088 warps); they take 96 (6 splits, 384 warps).
        assert_eq!(flash_chunk(keys(&[550; 8]), 8, 2048, Knobs::default().paged_flash_min_keys), (96, 6));
        // Many sequences already take more than the least.
        assert_eq!(flash_chunk(keys(&[550; 64]), 8, 2048, Knobs::default().paged_flash_min_keys), (160, 4));
        // Two sequences, one short: the longest sets the splits, the short one's past its end are
        // empty.
        assert_eq!(flash_chunk(keys(&[3, 700]), 8, 2048, 96), (96, 8));
        assert_eq!(flash_chunk(keys(&[1, 1]), 8, 2048, 96), (96, 1));
    }

    #[test]
    fn many_sequences_group_the_heads_of_a_kv_head() {
        // Llama-3 8B: 32 query heads over 8 KV heads, 16 splits per sequence.
        assert_eq!(heads_per_block(64, 32, 8, 128, 16), 4);
        assert_eq!(heads_per_block(1, 32, 8, 128, 16), 1, "one sequence keeps a block per head");
        assert_eq!(heads_per_block(64, 9, 3, 64, 57), 3);
        assert_eq!(heads_per_block(64, 32, 32, 128, 16), 1, "no grouped KV heads");
        assert_eq!(heads_per_block(64, 32, 8, 256, 16), 1, "head sizes over 128");
        assert_eq!(heads_per_block(64, 64, 8, 64, 8), 4, "gpt-oss: 8 heads per group, 4 per block");
    }
}
