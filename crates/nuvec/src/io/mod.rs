//! Reading (and writing) arrays from files.

mod aligned;
mod gguf;
mod gguf_blocks;
mod gguf_kquants;
mod safetensors;

pub use self::aligned::{align_safetensors, open_for_loading, open_through_cache, ALIGNMENT};
pub use self::gguf::{GgmlType, GgufFile, GgufTensor, GgufValue};
pub use self::gguf_blocks::gguf_matrix;
pub use self::safetensors::{save_safetensors, SafetensorsFile, TensorInfo};
