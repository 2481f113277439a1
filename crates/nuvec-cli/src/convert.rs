//! `nuvec convert`: mlx_lm.convert's flags.

use std::path::PathBuf;

use clap::Parser;
use nuvec::{DType, QuantMode, QuantSpec};
use nuvec_lm::convert::{convert, ConvertOptions};

/// Convert a Hugging Face, MLX or GGUF checkpoint to an MLX-format directory (as mlx_lm.convert).
#[derive(Parser, Debug)]
pub struct Args {
    #[command(flatten)]
    hub: crate::common::HubArgs,
    #[command(flatten)]
    threads: crate::common::ThreadArgs,
    /// The source: a checkpoint directory, a Hugging Face repo id (downloaded when not in the cache), or a .gguf file.
    #[arg(long, visible_alias = "model")]
    hf_path: String,
    /// Where to write the MLX checkpoint (refused if it exists, unless --force). It is written
    /// beside it under a temporary name and renamed into place once it loads back.
    #[arg(long, default_value = "mlx_model")]
    mlx_path: PathBuf,
    /// Quantize the linear and embedding weights. From a GGUF file holding Q2_K, Q3_K or Q6_K
    /// tensors (affine groups of 16, which MLX cannot load): requantize only those, keeping the
    /// others exactly.
    #[arg(short = 'q', long)]
    quantize: bool,
    /// Values per quantization group (default: 64 for affine, 32 for mxfp4/mxfp8, 16 for nvfp4).
    #[arg(long)]
    q_group_size: Option<usize>,
    /// Bits per quantized value (default: 4, or 8 for mxfp8).
    #[arg(long)]
    q_bits: Option<usize>,
    /// Quantization mode: affine, mxfp4, mxfp8 or nvfp4.
    #[arg(long, default_value = "affine")]
    q_mode: String,
    /// dtype of the non-quantized parameters: float16, bfloat16 or float32 (default: config.json's
    /// torch_dtype, else as stored).
    #[arg(long)]
    dtype: Option<String>,
    /// Dequantize a quantized model (a GGUF's K-quants included: exactly llama.cpp's values).
    #[arg(short = 'd', long)]
    dequantize: bool,
    /// Replace --mlx-path if it exists and is a model checkpoint (config.json, weights and
    /// tokenizer files, nothing else); never the working, home or root directory, or one
    /// holding the source.
    #[arg(long)]
    force: bool,
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    args.threads.apply()?;
    let dtype = match args.dtype.as_deref() {
        None => None,
        Some("float16") => Some(DType::F16),
        Some("bfloat16") => Some(DType::BF16),
        Some("float32") => Some(DType::F32),
        Some(other) => return Err(format!("--dtype {other:?} is not one of float16, bfloat16, float32").into()),
    };
    let mode = QuantMode::parse(&args.q_mode).map_err(|e| format!("--q-mode: {e}"))?;
    if !args.quantize && (args.q_bits.is_some() || args.q_group_size.is_some()) {
        return Err("--q-bits and --q-group-size only apply with -q/--quantize".into());
    }
    let (bits, group_size) = mode.defaults();
    let quantize = args.quantize.then(|| QuantSpec {
        mode,
        bits: args.q_bits.unwrap_or(bits),
        group_size: args.q_group_size.unwrap_or(group_size),
    });
    let progress = crate::progress::Bar::on_terminal().map(|bar| bar.convert_callback());
    let options =
        ConvertOptions { quantize, dtype, dequantize: args.dequantize, force: args.force, progress, adapter: None };
    convert(&args.hub.fetch(&args.hf_path)?, &args.mlx_path, &options)?;
    eprintln!("[INFO] Saved to {}", args.mlx_path.display());
    Ok(())
}
