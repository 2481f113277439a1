//! The building blocks model files are made of.

mod attention;
mod gelu_mlp;
mod linear;
mod mlp;
mod moe;
mod norm;
mod rope;

pub use attention::{Attention, AttentionShape};
pub use linear::Linear;
pub use mlp::Mlp;
pub use moe::{FeedForward, MoeShape, SparseMoe};
pub use norm::RmsNorm;
pub use rope::Rope;
// Gemma 4
pub use gelu_mlp::GeluMlp;
