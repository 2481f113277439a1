//! `nuvec fuse`: an mlx-lm adapter's terms added into the model's weights, written as a new MLX
//! checkpoint (mlx_lm.fuse's flags and defaults).

use std::path::PathBuf;

use clap::Parser;
use nuvec_lm::convert::{convert, ConvertOptions};

#[derive(Parser, Debug)]
pub struct Args {
    #[command(flatten)]
    hub: crate::common::HubArgs,
    #[command(flatten)]
    threads: crate::common::ThreadArgs,
    /// The base model: a checkpoint directory or a Hugging Face repo id.
    #[arg(long, default_value = "mlx_model")]
    model: String,
    /// Where to write the fused checkpoint (refused if it exists, unless --force).
    #[arg(long, default_value = "fused_model")]
    save_path: PathBuf,
    /// The adapter folder (adapters.safetensors, adapter_config.json).
    #[arg(long, default_value = "adapters")]
    adapter_path: PathBuf,
    /// Write every weight dense (a quantized model comes out unquantized).
    #[arg(long)]
    de_quantize: bool,
    /// Replace an existing --save-path.
    #[arg(long)]
    force: bool,
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    args.threads.apply()?;
    let options = ConvertOptions {
        dequantize: args.de_quantize,
        force: args.force,
        adapter: Some(args.adapter_path.clone()),
        progress: crate::progress::Bar::on_terminal().map(|bar| bar.convert_callback()),
        ..Default::default()
    };
    convert(&args.hub.fetch(&args.model)?, &args.save_path, &options)?;
    eprintln!("[INFO] Saved the fused model to {}", args.save_path.display());
    Ok(())
}
