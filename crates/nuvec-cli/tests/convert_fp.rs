//! `nuvec convert --q-mode mxfp4|mxfp8|nvfp4`, as mlx_lm.convert's flags: each mode's default
//! bits and group size, its config entry and tensors exactly as mlx_lm.convert wrote them for
//! the same weights (the oracle's `fp_quant/llama-<mode>` checkpoints), and a clear refusal of a
//! shape the mode does not have.

use std::path::PathBuf;
use std::process::Command;

fn fixtures() -> PathBuf {
    std::env::var_os("NUVEC_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("NUVEC_FIXTURES is not set: run `scripts/test.sh`"))
}

fn nuvec(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_nuvec")).args(args).output().expect("run nuvec")
}

fn json(path: PathBuf) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

#[test]
fn q_mode_converts_as_mlx_lm_convert() {
    let source = fixtures().join("llama-f32");
    for mode in ["mxfp4", "mxfp8", "nvfp4"] {
        let out = std::env::temp_dir().join(format!("nuvec-cli-convert-{mode}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let run = nuvec(&[
            "convert",
            "--hf-path",
            source.to_str().unwrap(),
            "--mlx-path",
            out.to_str().unwrap(),
            "-q",
            "--q-mode",
            mode,
            "--dtype",
            "float32",
        ]);
        assert!(run.status.success(), "{mode}: {}", String::from_utf8_lossy(&run.stderr));
        let reference = fixtures().join(format!("fp_quant/llama-{mode}"));
        assert_eq!(
            json(out.join("config.json"))["quantization"],
            json(reference.join("config.json"))["quantization"],
            "{mode}"
        );
        let theirs = nuvec::io::SafetensorsFile::open(reference.join("model.safetensors")).unwrap();
        let ours_file = nuvec::io::SafetensorsFile::open(out.join("model.safetensors")).unwrap();
        for name in ["lm_head.weight", "lm_head.scales", "model.layers.0.mlp.down_proj.scales"] {
            let (a, b) = (theirs.array(name).unwrap(), ours_file.array(name).unwrap());
            assert_eq!((a.dtype(), a.shape()), (b.dtype(), b.shape()), "{mode} {name}");
            assert_eq!(a.to_f32_vec().unwrap(), b.to_f32_vec().unwrap(), "{mode} {name}");
        }
        std::fs::remove_dir_all(&out).ok();
    }
}

#[test]
fn a_shape_the_mode_lacks_is_refused() {
    let source = fixtures().join("llama-f32");
    let out = std::env::temp_dir().join(format!("nuvec-cli-convert-bad-{}", std::process::id()));
    let run = nuvec(&[
        "convert",
        "--hf-path",
        source.to_str().unwrap(),
        "--mlx-path",
        out.to_str().unwrap(),
        "-q",
        "--q-mode",
        "mxfp4",
        "--q-bits",
        "8",
    ]);
    assert!(!run.status.success());
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains("mxfp4 needs bits = 4 and group_size = 32"), "{err}");
    assert!(!out.exists(), "nothing is written on a refused conversion");
}
