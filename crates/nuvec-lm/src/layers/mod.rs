//! The building blocks model files are made of.

mod attention;
mod gated_attention;
mod gated_delta;
mod gelu_mlp;
mod linear;
mod mlp;
mod moe;
mod norm;
mod rope;
mod shared_moe;

pub(crate) use attention::decode_together;
pub use attention::{Attention, AttentionShape};
pub use gated_attention::{GatedAttention, GatedAttentionShape};
pub use gated_delta::{GatedDeltaNet, GatedDeltaShape};
pub use linear::Linear;
pub use mlp::Mlp;
pub use moe::{Activation, FeedForward, MoeShape, SparseMoe};
pub use norm::RmsNorm;
pub use rope::Rope;
pub use shared_moe::SharedExpertMoe;
// Gemma 4
pub use gelu_mlp::GeluMlp;
