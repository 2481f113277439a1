//! The building blocks model files are made of.

mod attention;
mod linear;
mod mlp;
mod moe;
mod norm;
mod rope;

pub use attention::{Attention, AttentionShape};
pub use linear::Linear;
pub use mlp::Mlp;
pub use moe::{Activation, FeedForward, MoeShape, Routing, SparseMoe};
pub use norm::RmsNorm;
pub use rope::Rope;
