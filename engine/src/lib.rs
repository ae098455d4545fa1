//! corral's engine: everything that touches a model, for exactly one model per process.
//!
//! Owns GGUF loading, the model forward pass (our own architecture code on candle's
//! quantized matmuls), the per-sequence KV cache, tokenizer, chat template, sampling and
//! the generation loop. It must not know about other models, the pool or the gateway:
//! the process boundary is the crash boundary.

pub mod config;
pub mod error;
pub mod gguf;
pub mod kernels;
pub mod kv;
pub mod model;
pub mod tokenizer;

pub use error::{Error, Result};
