//! nuvec's array layer: [`Array`], [`DType`], [`Device`], weight matrices in their checkpoint's
//! (quantized) layout, safetensors I/O, and one [`Backend`] per device.
//!
//! It knows nothing about language models; `nuvec-lm` builds those on top.
#![warn(missing_docs)]

mod array;
mod backend;
pub mod backends;
mod buffer;
mod compute_hint;
mod device;
pub mod distributed;
mod dtype;
mod error;
pub mod fpquant;
pub mod io;
mod moe;
mod ops;
mod pending;
mod quant;
pub mod quantize;
pub mod tuning;

pub use array::{Array, Element};
pub use backend::{backend, Backend, GatedDeltaDims, PagedSeq};
pub use compute_hint::{compute_dtype_hint, hint_is_half, with_compute_dtype};
pub use device::Device;
pub use dtype::DType;
pub use error::{Error, Result};
pub use moe::{softmax, ExpertActivation, ExpertIndex, Experts, MoeRouting};
pub use ops::{
    attention, attention_ring, attention_sinks, attention_window, dequantize_paged, gated_delta,
    paged_decode_attention, paged_decode_attention_quantized, quantize_rows_into, rope_qk, rope_qk_write_kv,
    rope_qk_write_paged,
};
pub use pending::PendingRead;
pub use quant::{Matrix, QuantMode, QuantSpec, Quantized};
