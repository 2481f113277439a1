//! mxfp4, mxfp8 and nvfp4 against MLX 0.32.4's own records (scripts/oracle/more/fp_quant.py):
//! - our dequantization equals `mx.dequantize(..., dtype=float32)` bit for bit (random matrices,
//!   every scale byte over random codes including NaN codes, nvfp4 with a global scale);
//! - our quantizer equals `mx.quantize` bit for bit (from f32 and bf16 values, and on a matrix of
//!   rounding ties and edge values);
//! - the CPU linear (one row at a time and many rows) matches `mx.quantized_matmul` within f32
//!   accumulation error, and the embedding lookup returns the dequantized rows exactly.

use std::path::PathBuf;

use nuvec::fpquant::quantize_fp;
use nuvec::io::SafetensorsFile;
use nuvec::quantize::dequantize;
use nuvec::{backend, Array, Device, Matrix, QuantMode, QuantSpec, Quantized};

const MODES: [QuantMode; 3] = [QuantMode::Mxfp4, QuantMode::Mxfp8, QuantMode::Nvfp4];

/// The records, or a failure saying how to make them (a test that skips proves nothing).
fn records() -> SafetensorsFile {
    let dir = std::env::var_os("NUVEC_FIXTURES").map(PathBuf::from).unwrap_or_else(|| {
        panic!("NUVEC_FIXTURES is not set: run `scripts/test.sh` (it runs scripts/setup-oracle.sh and sets it)")
    });
    let path = dir.join("fp_quant/matrices.safetensors");
    SafetensorsFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}; rerun scripts/setup-oracle.sh", path.display()))
}

fn spec(mode: QuantMode) -> QuantSpec {
    let (bits, group_size) = mode.fixed_shape().unwrap();
    QuantSpec { mode, bits, group_size }
}

fn matrix(file: &SafetensorsFile, prefix: &str, mode: QuantMode, global: Option<f32>) -> Quantized {
    let packed = file.array(&format!("{prefix}.weight")).unwrap();
    let scales = file.array(&format!("{prefix}.scales")).unwrap();
    let cols = packed.dim(1) * 32 / spec(mode).bits;
    Quantized::new_fp(packed, scales, global, spec(mode), cols).unwrap()
}

fn same_bits(ours: &[f32], theirs: &[f32], what: &str) {
    assert_eq!(ours.len(), theirs.len(), "{what}: lengths");
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()), "{what}: value {i}: {a} vs mlx {b}");
    }
}

#[test]
fn dequantize_equals_mlx_bit_for_bit() {
    let file = records();
    for mode in MODES {
        let name = mode.name();
        for prefix in [name.to_string(), format!("{name}.raw")] {
            let ours = dequantize(&matrix(&file, &prefix, mode, None)).unwrap();
            let theirs = file.array(&format!("{prefix}.dequantized")).unwrap().to_f32_vec().unwrap();
            same_bits(&ours, &theirs, &prefix);
        }
    }
    let global = file.array("nvfp4.global.global_scale").unwrap().to_f32_vec().unwrap()[0];
    let ours = dequantize(&matrix(&file, "nvfp4.global", QuantMode::Nvfp4, Some(global))).unwrap();
    let theirs = file.array("nvfp4.global.dequantized").unwrap().to_f32_vec().unwrap();
    same_bits(&ours, &theirs, "nvfp4 with a global scale");
}

#[test]
fn quantize_equals_mlx_bit_for_bit() {
    let file = records();
    for (source, suffix) in [("w", ""), ("w_bf16", ".bf16"), ("edge", ".edge")] {
        let w = file.array(source).unwrap();
        let (rows, cols) = (w.dim(0), w.dim(1));
        let values = w.to_f32_vec().unwrap();
        for mode in MODES {
            let what = format!("{}{suffix}", mode.name());
            let ours = quantize_fp(&values, rows, cols, spec(mode)).unwrap();
            let theirs = matrix(&file, &what, mode, None);
            let (a, b) = (ours.packed.to_vec::<u32>().unwrap(), theirs.packed.to_vec::<u32>().unwrap());
            let bad = a.iter().zip(&b).position(|(x, y)| x != y);
            assert!(
                bad.is_none(),
                "{what}: packed word {bad:?} differs: {:#x} vs mlx {:#x}",
                a[bad.unwrap()],
                b[bad.unwrap()]
            );
            let (a, b) = (ours.scales.to_vec::<u8>().unwrap(), theirs.scales.to_vec::<u8>().unwrap());
            let bad = a.iter().zip(&b).position(|(x, y)| x != y);
            assert!(bad.is_none(), "{what}: scale {bad:?} differs: {} vs mlx {}", a[bad.unwrap()], b[bad.unwrap()]);
        }
    }
}

#[test]
fn linear_and_embed_match_mlx() {
    let file = records();
    let cpu = backend(Device::Cpu);
    let x = file.array("x").unwrap();
    let (m, k) = (x.dim(0), x.dim(1));
    let xs = x.to_f32_vec().unwrap();
    for mode in MODES {
        let name = mode.name();
        let q = matrix(&file, name, mode, None);
        let n = q.rows();
        let dense = dequantize(&q).unwrap();
        let theirs = file.array(&format!("{name}.matmul")).unwrap().to_f32_vec().unwrap();
        let w = Matrix::Quantized(q);
        // Many rows at once (the prefill path), then one row at a time (the decode path).
        let many = cpu.linear(&x, &w).unwrap().to_f32_vec().unwrap();
        let mut single = vec![];
        for r in 0..m {
            let row = Array::from_slice(&xs[r * k..(r + 1) * k], &[1, k]).unwrap();
            single.extend(cpu.linear(&row, &w).unwrap().to_f32_vec().unwrap());
        }
        for (label, ours) in [("many rows", &many), ("one row", &single)] {
            for i in 0..m {
                for j in 0..n {
                    let magnitude: f32 = (0..k).map(|t| (xs[i * k + t] * dense[j * k + t]).abs()).sum();
                    let (a, b) = (ours[i * n + j], theirs[i * n + j]);
                    assert!((a - b).abs() <= 1e-5 * magnitude + 1e-30, "{name} {label} [{i}, {j}]: {a} vs mlx {b}");
                }
            }
        }
        let ids: Vec<u32> = (0..n as u32).rev().collect();
        let rows = cpu.embed(&w, &ids).unwrap().to_f32_vec().unwrap();
        for (i, &id) in ids.iter().enumerate() {
            let id = id as usize;
            same_bits(&rows[i * k..(i + 1) * k], &dense[id * k..(id + 1) * k], &format!("{name} embed row {id}"));
        }
    }
}

#[test]
fn invalid_mode_shapes_are_refused() {
    for (mode, bits, group) in [(QuantMode::Mxfp4, 8, 32), (QuantMode::Mxfp4, 4, 64), (QuantMode::Nvfp4, 4, 32)] {
        let err = QuantSpec { mode, bits, group_size: group }.validate().unwrap_err();
        assert!(err.contains(mode.name()) && err.contains("needs bits"), "{err}");
    }
    let w = vec![f32::NAN; 64];
    let err = quantize_fp(&w, 2, 32, spec(QuantMode::Mxfp4)).unwrap_err().to_string();
    assert!(err.contains("not finite"), "{err}");
}
