//! The runtime's one error type.

/// Everything that can go wrong loading a model or generating with it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// From the array layer (I/O, shapes, unsupported ops).
    #[error(transparent)]
    Array(#[from] nuvec::Error),
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A configuration file (config.json, tokenizer_config.json, ...) is wrong.
    #[error("{file}: {message}")]
    Config {
        /// The file.
        file: String,
        /// The field, what is wrong and how to fix it.
        message: String,
    },
    /// A checkpoint's tensors do not fit its configuration.
    #[error("{file}: {message}")]
    Weights {
        /// The file (or checkpoint directory).
        file: String,
        /// The tensor and what is wrong.
        message: String,
    },
    /// The model could not be found.
    #[error("{0}")]
    NotFound(String),
    /// The tokenizer could not be read or used.
    #[error("{file}: {message}")]
    Tokenizer {
        /// The file.
        file: String,
        /// What went wrong.
        message: String,
    },
    /// The chat template failed to parse or render, or ran past its limits.
    #[error("chat template ({origin}): {message}")]
    Template {
        /// Where the template came from (its file, or a GGUF file's metadata key).
        origin: String,
        /// What went wrong.
        message: String,
    },
    /// An option is out of range (names the option and the allowed range).
    #[error("{0}")]
    Invalid(String),
    /// A feature that is not built yet: never a silent fallback.
    #[error("not supported: {0}")]
    Unsupported(String),
}

/// Result with the runtime's error.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Whether this is a device running out of memory (a step that may succeed with fewer
    /// sequences or shorter chunks), as opposed to bad input or a broken model.
    pub fn is_oom(&self) -> bool {
        match self {
            Error::Array(nuvec::Error::Device(message)) => {
                message.contains("OUT_OF_MEMORY") || message.to_lowercase().contains("out of memory")
            }
            _ => false,
        }
    }

    pub(crate) fn config(file: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Config { file: file.into(), message: message.into() }
    }
}
