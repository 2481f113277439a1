//! llama.cpp's K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) as the MLX affine groups they are.
//!
//! A K-quant super-block holds 256 values in sub-blocks, each sub-block with its own scale (and
//! for Q2_K/Q4_K/Q5_K its own min) derived from the super-block's f16 `d` (and `dmin`) times a
//! small integer. Each sub-block is exactly one affine group `w = scale * q + bias`:
//!
//! | type | group | bits | scale | bias | llama.cpp's value |
//! | --- | --- | --- | --- | --- | --- |
//! | Q2_K | 16 | 2 | `d * sc` | `-(dmin * m)` | `d*sc*q - dmin*m` (4-bit sc, m) |
//! | Q3_K | 16 | 3 | `d * sc` | `-4 * scale` | `d*sc*(q - 4)`, q's top bit from `hmask` (6-bit signed sc) |
//! | Q4_K | 32 | 4 | `d * sc` | `-(dmin * m)` | `d*sc*q - dmin*m` (6-bit sc, m) |
//! | Q5_K | 32 | 5 | `d * sc` | `-(dmin * m)` | as Q4_K, q's fifth bit from `qh` |
//! | Q6_K | 16 | 6 | `d * sc` | `-32 * scale` | `d*sc*(q - 32)` (int8 sc) |
//!
//! Scales and biases are computed in f32 as llama.cpp (and gguf-py) compute them and kept in f32:
//! `d * sc` and `dmin * m` are exact there (an 11-bit f16 significand times an integer of at most
//! 8 bits), as are `scale * q` (at most 24 significant bits) and the power-of-two multiples, so
//! `scale * q + bias` rounds once, exactly where llama.cpp's `d*sc*q - dmin*m` rounds: the
//! dequantized values are llama.cpp's, bit for bit (up to the sign of a zero).

use half::f16;

use super::gguf::GgmlType;

/// Values per K-quant super-block.
pub(super) const QK_K: usize = 256;

/// (bits, group size) of the affine layout a K-quant type converts to; `None` for other types.
pub(super) fn layout(kind: GgmlType) -> Option<(usize, usize)> {
    Some(match kind {
        GgmlType::Q2K => (2, 16),
        GgmlType::Q3K => (3, 16),
        GgmlType::Q4K => (4, 32),
        GgmlType::Q5K => (5, 32),
        GgmlType::Q6K => (6, 16),
        _ => return None,
    })
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Scale and min of sub-block `j` (0..8) from Q4_K/Q5_K's 12 packed bytes: sub-blocks 0..4 keep
/// their 6 bits in the low bits of bytes `j` and `j + 4`; sub-blocks 4..8 split theirs between a
/// nibble of byte `j + 4` and the top two bits of bytes `j - 4` and `j`.
fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// One super-block `b` of `kind` decoded: the 256 unsigned values `q` (each below `2^bits`), and
/// per group (8 or 16 of them) its scale and bias.
pub(super) fn decode(kind: GgmlType, b: &[u8], q: &mut [u8; QK_K], scales: &mut [f32], biases: &mut [f32]) {
    match kind {
        GgmlType::Q2K => {
            // scales[16] (low nibble: scale, high: min), qs[64], d, dmin.
            let (sc, qs) = (&b[0..16], &b[16..80]);
            let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
            for (e, v) in q.iter_mut().enumerate() {
                // Each 32 bytes hold 128 values, four 2-bit planes of 32.
                let (h, r) = (e / 128, e % 128);
                *v = (qs[h * 32 + r % 32] >> (2 * (r / 32))) & 3;
            }
            for g in 0..16 {
                scales[g] = d * (sc[g] & 0xf) as f32;
                biases[g] = -(dmin * (sc[g] >> 4) as f32);
            }
        }
        GgmlType::Q3K => {
            // hmask[32], qs[64], scales[12], d.
            let (hmask, qs, sc) = (&b[0..32], &b[32..96], &b[96..108]);
            let d = f16_at(b, 108);
            for (e, v) in q.iter_mut().enumerate() {
                let (h, r) = (e / 128, e % 128);
                let low = (qs[h * 32 + r % 32] >> (2 * (r / 32))) & 3;
                // llama.cpp subtracts 4 where the mask bit is clear: q - 4 with the bit as q's top.
                let high = (hmask[e % 32] >> (e / 32)) & 1;
                *v = low | (high << 2);
            }
            for g in 0..16 {
                let low = (sc[g % 8] >> (4 * (g / 8))) & 0xf;
                let high = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
                let s = d * ((low | (high << 4)) as i32 - 32) as f32;
                scales[g] = s;
                biases[g] = -4.0 * s;
            }
        }
        GgmlType::Q4K | GgmlType::Q5K => {
            // d, dmin, scales[12], (Q5_K: qh[32]), qs[128].
            let (d, dmin, sc) = (f16_at(b, 0), f16_at(b, 2), &b[4..16]);
            let (qh, qs) = if kind == GgmlType::Q5K { (Some(&b[16..48]), &b[48..176]) } else { (None, &b[16..144]) };
            for (e, v) in q.iter_mut().enumerate() {
                // Each 32 bytes hold 64 values: low nibbles first, then high nibbles.
                let (c, r) = (e / 64, e % 64);
                *v = (qs[c * 32 + r % 32] >> (4 * (r / 32))) & 0xf;
                if let Some(qh) = qh {
                    *v |= ((qh[e % 32] >> (e / 32)) & 1) << 4;
                }
            }
            for g in 0..8 {
                let (s, m) = scale_min_k4(g, sc);
                scales[g] = d * s as f32;
                biases[g] = -(dmin * m as f32);
            }
        }
        GgmlType::Q6K => {
            // ql[128], qh[64], scales[16] (int8), d.
            let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
            let d = f16_at(b, 208);
            for (e, v) in q.iter_mut().enumerate() {
                // Per half of 128 values: 64 bytes of nibbles (low, then high) and 32 bytes of
                // 2-bit planes for the top bits.
                let (h, r) = (e / 128, e % 128);
                let low = (ql[h * 64 + r % 64] >> (4 * (r / 64))) & 0xf;
                let high = (qh[h * 32 + r % 32] >> (2 * (r / 32))) & 3;
                *v = low | (high << 4);
            }
            for g in 0..16 {
                let s = d * (sc[g] as i8) as f32;
                scales[g] = s;
                biases[g] = -32.0 * s;
            }
        }
        _ => unreachable!("only called for K-quant types"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_min_unpacking_follows_the_documented_bit_layout() {
        // Sub-block 5's scale: low nibble of byte 9, top bits of byte 1; its min: high nibble of
        // byte 9, top bits of byte 5.
        let mut s = [0u8; 12];
        s[9] = 0xa7;
        s[1] = 0b10_000000;
        s[5] = 0b01_000000;
        assert_eq!(scale_min_k4(5, &s), (0x27, 0x1a));
        assert_eq!(scale_min_k4(1, &s), (0, 0));
    }
}
