//! The engine's typed errors. Loading errors carry the path and what was wrong so that
//! `corral run` / `corral engine` can print one clear line; generation errors carry what
//! the request asked for so the server can map them to a 4xx.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read model file {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },

    #[error("{path} is not a GGUF file (no GGUF magic)")]
    NotGguf { path: PathBuf },

    #[error("{path} is not a valid GGUF file: {reason}")]
    BadGguf { path: PathBuf, reason: String },

    #[error("{path} is truncated: tensor {tensor} needs bytes up to {need} but the file has {have}")]
    Truncated { path: PathBuf, tensor: String, need: u64, have: u64 },

    #[error("unsupported model architecture {arch:?} (supported: {})", corral_protocol::ARCHITECTURES.join(", "))]
    UnsupportedArch { arch: String },

    #[error("model metadata {key} is missing or has the wrong type")]
    Metadata { key: String },

    #[error("model tensor {name}: {reason}")]
    Tensor { name: String, reason: String },

    #[error("tokenizer: {0}")]
    Tokenizer(String),

    #[error("chat template: {0}")]
    Template(String),

    #[error("prompt has {prompt} tokens but the context holds {ctx}")]
    ContextExceeded { prompt: usize, ctx: usize },

    #[error("token id {id} is outside the vocabulary ({vocab} tokens)")]
    BadToken { id: u32, vocab: usize },

    #[error("grammar engine: {0}")]
    Grammar(String),

    #[error("tensor op failed: {0}")]
    Candle(String),

    /// Not a `source`: the message already says why, and a chain would say it twice.
    #[error("CUDA unavailable: {0}")]
    CudaUnavailable(crate::backend::cuda::Unavailable),

    #[error("CUDA kernel {program} failed to compile for {arch}:\n{log}")]
    CudaCompile { program: String, arch: String, log: String },

    #[error("CUDA {op}: {reason}")]
    Cuda { op: &'static str, reason: String },
}

/// candle's errors may carry a captured backtrace in their `Display`; keep the message.
pub(crate) fn candle_message(e: &candle_core::Error) -> String {
    e.to_string().lines().next().unwrap_or_default().to_owned()
}

impl From<candle_core::Error> for Error {
    fn from(e: candle_core::Error) -> Self {
        Error::Candle(candle_message(&e))
    }
}

impl From<crate::backend::cuda::Unavailable> for Error {
    fn from(e: crate::backend::cuda::Unavailable) -> Self {
        Self::CudaUnavailable(e)
    }
}
