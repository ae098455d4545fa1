//! corral's engine: everything that touches a model, for exactly one model per process.
//!
//! Owns GGUF loading, the model forward pass (our own architecture code on candle's
//! quantized matmuls), the per-sequence KV cache, tokenizer, chat template, sampling and
//! the generation loop. It must not know about other models, the pool or the gateway:
//! the process boundary is the crash boundary.

pub mod backend;
pub mod builtin_templates;
pub mod cache;
pub mod chat;
pub mod checkpoint;
pub mod config;
mod config_hybrid;
pub mod detok;
pub mod engine;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod grammar;
pub mod harmony;
pub mod heap;
pub mod kernels;
pub mod kv;
pub mod model;
pub mod reasoning;
pub mod recurrent;
pub mod sampler;
pub mod scheduler;
pub mod sequence;
pub mod server;
pub mod speculate;
pub mod stop;
pub mod threads;
pub mod tokenizer;
pub mod tools;

pub use engine::Engine;
pub use error::{Error, Result};
