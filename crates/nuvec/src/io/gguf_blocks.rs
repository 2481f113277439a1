//! GGUF's block-quantized types converted to the MLX affine layout they are equivalent to:
//! every simple ggml block is `w = d * q + m` (or `d * (q - offset)`) over 32 values, which is
//! exactly an affine group of 32 with `scale = d` and `bias = m` (or `-offset * d`); the K-quants'
//! sub-blocks are affine groups of 16 or 32 (see `gguf_kquants`).

use half::f16;

use super::gguf::{GgmlType, GgufFile, GgufTensor};
use super::gguf_kquants::{self, QK_K};
use crate::quantize::pack_lsb;
use crate::{Array, Error, Matrix, QuantMode, QuantSpec, Quantized, Result};

fn f16_at(b: &[u8], i: usize) -> f16 {
    f16::from_le_bytes([b[i], b[i + 1]])
}

/// One block decoded: 32 unsigned values, scale and bias.
fn decode_block(kind: GgmlType, b: &[u8], q: &mut [u8; 32]) -> (f32, f32) {
    let nibbles = |qs: &[u8], q: &mut [u8; 32]| {
        for j in 0..16 {
            q[j] = qs[j] & 0xf;
            q[j + 16] = qs[j] >> 4;
        }
    };
    let high_bits = |qh: u32, q: &mut [u8; 32]| {
        for (j, v) in q.iter_mut().enumerate() {
            *v |= (((qh >> j) & 1) as u8) << 4;
        }
    };
    match kind {
        GgmlType::Q8_0 => {
            let d = f16_at(b, 0).to_f32();
            for (v, &x) in q.iter_mut().zip(&b[2..34]) {
                *v = (x as i8 as i16 + 128) as u8;
            }
            (d, -128.0 * d)
        }
        GgmlType::Q4_0 => {
            let d = f16_at(b, 0).to_f32();
            nibbles(&b[2..18], q);
            (d, -8.0 * d)
        }
        GgmlType::Q4_1 => {
            nibbles(&b[4..20], q);
            (f16_at(b, 0).to_f32(), f16_at(b, 2).to_f32())
        }
        GgmlType::Q5_0 => {
            let d = f16_at(b, 0).to_f32();
            nibbles(&b[6..22], q);
            high_bits(u32::from_le_bytes(b[2..6].try_into().expect("4 bytes")), q);
            (d, -16.0 * d)
        }
        GgmlType::Q5_1 => {
            nibbles(&b[8..24], q);
            high_bits(u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")), q);
            (f16_at(b, 0).to_f32(), f16_at(b, 2).to_f32())
        }
        _ => unreachable!("only called for block types"),
    }
}

/// Tensor `tensor` as a `[rows, cols]` matrix in MLX's layout, with its rows reordered by
/// `row_order` when given (row `i` of the result is row `row_order[i]` of the file).
pub fn gguf_matrix(file: &GgufFile, tensor: &GgufTensor, row_order: Option<&[usize]>) -> Result<Matrix> {
    let fail = |m: String| Error::Format {
        path: file.path().display().to_string(),
        message: format!("tensor {}: {m}", tensor.name),
    };
    let (cols, rows) = match tensor.dims[..] {
        [c, r] => (c, r),
        _ => return Err(fail(format!("expected a matrix, got dimensions {:?}", tensor.dims))),
    };
    if let Some(order) = row_order {
        if order.len() != rows || order.iter().any(|&r| r >= rows) {
            return Err(fail("row order does not fit the matrix".into()));
        }
    }
    let source_row = |i: usize| row_order.map_or(i, |o| o[i]);
    let kquant = gguf_kquants::layout(tensor.ggml_type);
    let bits = match tensor.ggml_type {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
            let a = file.float_array(tensor)?;
            return Ok(Matrix::Dense(match row_order {
                None => a,
                Some(_) => permute_rows(&a, rows, source_row)?,
            }));
        }
        GgmlType::Q8_0 => 8,
        GgmlType::Q4_0 | GgmlType::Q4_1 => 4,
        GgmlType::Q5_0 | GgmlType::Q5_1 => 5,
        GgmlType::Q2K | GgmlType::Q3K | GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => {
            kquant.expect("K-quants have a layout").0
        }
        GgmlType::Mxfp4 => return mxfp4_matrix(file, tensor, rows, cols, source_row),
        GgmlType::Other(id) => {
            return Err(Error::Unsupported(format!(
                "{}: tensor {} has ggml type {id}, which nuvec does not convert yet (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4 are)",
                file.path().display(),
                tensor.name
            )))
        }
    };
    let group = kquant.map_or(32, |(_, g)| g);
    let (per, block_bytes) = tensor.ggml_type.block().expect("block types have a size");
    if cols % per != 0 {
        return Err(fail(format!("{cols} columns do not split into blocks of {per}")));
    }
    let data = file.read(tensor)?;
    let (blocks, groups, groups_per_block) = (cols / per, cols / group, per / group);
    let row_bytes = blocks * block_bytes;
    let packed_row = cols * bits / 8;
    let packed_block = per * bits / 8;
    let mut packed = vec![0u8; rows * packed_row];
    // The simple blocks keep their parameters as f16, the type ggml stores `d` (and `m`) in:
    // Q4_1 and Q5_1 exactly so; the offset types' bias (-8d, -16d, -128d) is `d` times a power
    // of two, so exact in f16 too unless it overflows (checked below: then f32). Every
    // weight then reads 2 bytes fewer per group of 32 than with f32 parameters (a Q4_0 matrix
    // 5 bits a weight instead of 6). The K-quants' products `d * sc` need f32 to be exact.
    let simple = kquant.is_none();
    let mut scales = vec![0f32; rows * groups];
    let mut biases = vec![0f32; rows * groups];
    let mut q = [0u8; QK_K];
    for r in 0..rows {
        let src = &data[source_row(r) * row_bytes..(source_row(r) + 1) * row_bytes];
        let dst = &mut packed[r * packed_row..(r + 1) * packed_row];
        for k in 0..blocks {
            let block = &src[k * block_bytes..(k + 1) * block_bytes];
            let at = r * groups + k * groups_per_block;
            let (s, b) = (&mut scales[at..at + groups_per_block], &mut biases[at..at + groups_per_block]);
            if kquant.is_some() {
                gguf_kquants::decode(tensor.ggml_type, block, &mut q, s, b);
            } else {
                let q32: &mut [u8; 32] = (&mut q[..32]).try_into().expect("32 values");
                (s[0], b[0]) = decode_block(tensor.ggml_type, block, q32);
            }
            pack_lsb(&q[..per], bits, &mut dst[k * packed_block..(k + 1) * packed_block]);
        }
    }
    let words: Vec<u32> = packed.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect();
    let packed = Array::from_slice(&words, &[rows, cols * bits / 32])?;
    let f16_params = simple && biases.iter().all(|&b| f16::from_f32(b).is_finite());
    let (scales, biases) = if f16_params {
        let to16 = |v: &[f32]| v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>();
        (Array::from_slice(&to16(&scales), &[rows, groups])?, Array::from_slice(&to16(&biases), &[rows, groups])?)
    } else {
        (Array::from_slice(&scales, &[rows, groups])?, Array::from_slice(&biases, &[rows, groups])?)
    };
    let spec = QuantSpec { mode: QuantMode::Affine, bits, group_size: group };
    Ok(Matrix::Quantized(Quantized::new(packed, scales, biases, spec, cols)?))
}

/// An MXFP4 tensor as MLX's mxfp4 mode, exactly: ggml's block is the e8m0 scale byte (ggml halves
/// it and doubles the e2m1 table, the same values) and 16 bytes holding values `j` (low nibble)
/// and `j + 16` (high nibble); MLX packs value `i` at nibble `i` of its row.
fn mxfp4_matrix(
    file: &GgufFile,
    tensor: &GgufTensor,
    rows: usize,
    cols: usize,
    source_row: impl Fn(usize) -> usize,
) -> Result<Matrix> {
    if !cols.is_multiple_of(32) {
        return Err(Error::Format {
            path: file.path().display().to_string(),
            message: format!("tensor {}: {cols} columns do not split into MXFP4 blocks of 32", tensor.name),
        });
    }
    let data = file.read(tensor)?;
    let blocks = cols / 32;
    let row_bytes = blocks * 17;
    let mut packed = vec![0u8; rows * cols / 2];
    let mut scales = vec![0u8; rows * blocks];
    for r in 0..rows {
        let src = &data[source_row(r) * row_bytes..(source_row(r) + 1) * row_bytes];
        for (k, block) in src.chunks_exact(17).enumerate() {
            scales[r * blocks + k] = block[0];
            let qs = &block[1..];
            let dst = &mut packed[(r * blocks + k) * 16..][..16];
            for (i, byte) in dst.iter_mut().enumerate() {
                let value = |v: usize| if v < 16 { qs[v] & 0xf } else { qs[v - 16] >> 4 };
                *byte = value(2 * i) | (value(2 * i + 1) << 4);
            }
        }
    }
    let words: Vec<u32> = packed.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect();
    let packed = Array::from_slice(&words, &[rows, cols / 8])?;
    let scales = Array::from_slice(&scales, &[rows, blocks])?;
    let spec = QuantSpec { mode: QuantMode::Mxfp4, bits: 4, group_size: 32 };
    Ok(Matrix::Quantized(Quantized::new_fp(packed, scales, None, spec, cols)?))
}

fn permute_rows(a: &Array, rows: usize, source_row: impl Fn(usize) -> usize) -> Result<Array> {
    let row_bytes = a.nbytes() / rows.max(1);
    let src = a.raw_bytes();
    let mut out = Vec::with_capacity(src.len());
    for r in 0..rows {
        out.extend_from_slice(&src[source_row(r) * row_bytes..(source_row(r) + 1) * row_bytes]);
    }
    Array::from_bytes(crate::buffer::Bytes::copy_of(&out), a.shape().to_vec(), a.dtype())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_lsb_matches_mlx_nibble_order() {
        let values: Vec<u8> = (0..32).map(|i| (i % 16) as u8).collect();
        let mut out = vec![0u8; 16];
        pack_lsb(&values, 4, &mut out);
        assert_eq!(out[0], 0x10);
        assert_eq!(out[1], 0x32);
    }

    /// A GGUF file of one `[rows, 32]` tensor of ggml type `id` whose blocks are `blocks`
    /// (one per row), written where the test says and opened.
    fn one_tensor_file(id: u32, rows: usize, blocks: &[u8], tag: &str) -> GgufFile {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.push(b'w');
        b.extend(2u32.to_le_bytes());
        b.extend(32u64.to_le_bytes());
        b.extend((rows as u64).to_le_bytes());
        b.extend(id.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.resize(b.len().div_ceil(32) * 32, 0);
        b.extend(blocks);
        let path = std::env::temp_dir().join(format!("nuvec-gguf-blocks-{}-{tag}.gguf", std::process::id()));
        std::fs::write(&path, &b).unwrap();
        let file = GgufFile::open(&path).unwrap();
        std::fs::remove_file(&path).ok();
        file
    }

    /// A block of type Q4_0 (`q8` false) or Q8_0 with scale `d` and codes `code(j)`.
    fn offset_block(q8: bool, d: f32, code: impl Fn(usize) -> u8) -> Vec<u8> {
        let mut b = f16::from_f32(d).to_le_bytes().to_vec();
        if q8 {
            b.extend((0..32).map(|j| (code(j) as i16 - 128) as i8 as u8));
        } else {
            b.extend((0..16).map(|j| code(j) | code(j + 16) << 4));
        }
        b
    }

    #[test]
    fn offset_types_keep_f16_parameters_unless_the_bias_overflows() {
        for (q8, id, offset, top) in [(false, 2u32, 8.0f32, 15u8), (true, 8, 128.0, 255)] {
            let code = |r: usize, j: usize| ((r * 7 + j * 5) % (top as usize + 1)) as u8;
            // A subnormal, a small and an ordinary scale; then a scale whose bias leaves f16.
            let ds = [3.0e-7f32, 0.0123, -1.75, 60000.0 / offset * 2.0];
            for (fits, rows) in [(true, 3usize), (false, 4)] {
                let blocks: Vec<u8> = (0..rows).flat_map(|r| offset_block(q8, ds[r], |j| code(r, j))).collect();
                let file = one_tensor_file(id, rows, &blocks, &format!("{id}-{rows}"));
                let Matrix::Quantized(m) = gguf_matrix(&file, &file.tensors()[0], None).unwrap() else {
                    panic!("a block type gives a quantized matrix")
                };
                let dtype = if fits { crate::DType::F16 } else { crate::DType::F32 };
                assert_eq!((m.scales.dtype(), m.biases.dtype()), (dtype, dtype), "type {id}, {rows} rows");
                // Every weight is ggml's d * (q - offset), exactly.
                let values = crate::quantize::dequantize(&m).unwrap();
                for r in 0..rows {
                    let d = f16::from_f32(ds[r]).to_f32();
                    for j in 0..32 {
                        assert_eq!(
                            values[r * 32 + j],
                            d * (code(r, j) as f32 - offset),
                            "type {id}, row {r}, value {j}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn q8_0_block_is_exact_affine() {
        let mut block = vec![0u8; 34];
        block[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        for (i, b) in block[2..].iter_mut().enumerate() {
            *b = (i as i8 - 16) as u8;
        }
        let mut q = [0u8; 32];
        let (s, b) = decode_block(GgmlType::Q8_0, &block, &mut q);
        for (i, &v) in q.iter().enumerate() {
            assert_eq!(s * v as f32 + b, 0.5 * (i as f32 - 16.0));
        }
    }
}
