//! Wire types shared by every corral process: model ids, public API shapes, error kinds
//! and their rendering, the bounds on one request's work (`bounds`) and on a connection
//! (`http_limits`), and the contract between the pool and its engine processes (command
//! line, exit codes, event line, admin shapes).
//!
//! This crate owns *shapes*, never behaviour: no I/O, no tokio, no model code. Both the
//! engine and the gateway depend on it, so a string that crosses a process boundary is
//! defined here exactly once.

pub mod anthropic;
pub mod bounds;
pub mod engine_wire;
pub mod error;
pub mod histogram;
pub mod http_limits;
pub mod launch;
mod model_id;
pub mod openai;
pub mod responses;

pub use error::{ApiError, ApiShape, ErrorKind, Rendered};

/// The GGUF architectures (`general.architecture`) corral's engine runs: the one list the
/// engine's loader, `/v1/models` cards, `corral fit` and `pull`'s preflight agree on.
pub const ARCHITECTURES: [&str; 10] =
    ["llama", "gemma3", "qwen2", "qwen3", "qwen3moe", "mistral3", "phi3", "gpt-oss", "qwen35", "qwen35moe"];

/// The built-in chat template the engine gives a file of `arch` that carries none, where
/// the architecture alone decides it (the engine's `builtin_templates::choose`; a test
/// there keeps the two equal). `llama` is not here: its format follows the vocabulary's
/// special tokens, which only the engine reads.
pub fn builtin_template(arch: &str) -> Option<&'static str> {
    match arch {
        "gemma3" => Some("gemma"),
        "qwen2" | "qwen3" | "qwen3moe" | "qwen35" | "qwen35moe" => Some("chatml"),
        "mistral3" => Some("mistral-v7-tekken"),
        "phi3" => Some("phi3"),
        "gpt-oss" => Some("harmony"),
        _ => None,
    }
}
pub use model_id::{MAX_MODEL_ID_LEN, ModelId, ModelIdError};
