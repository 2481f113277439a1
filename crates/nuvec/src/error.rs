//! The array layer's one error type.

/// Everything that can go wrong in the array layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or mapped.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A file's content does not follow its format.
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: String,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// Shapes or dtypes that an op cannot combine.
    #[error("{op}: {message}")]
    Shape {
        /// The op.
        op: &'static str,
        /// What did not fit.
        message: String,
    },
    /// A capability that is not built (yet): never a silent fallback.
    #[error("not supported: {0}")]
    Unsupported(String),
    /// A device could not be used.
    #[error("device: {0}")]
    Device(String),
    /// A process group's exchange failed: a rank that left or stopped answering, a launch
    /// that cannot form the group.
    #[error("distributed: {0}")]
    Distributed(String),
    /// A tuning knob's setting that cannot be taken (its name, its value, or when it was given).
    #[error("tuning: {0}")]
    Setting(String),
}

/// Result with the array layer's error.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn shape(op: &'static str, message: impl Into<String>) -> Self {
        Error::Shape { op, message: message.into() }
    }
}
