//! The bodies of corral's fuzz targets, one plain function per target taking one input
//! (`pub fn <target>(data: &[u8])`), on stable Rust. Two things call them: the libFuzzer
//! targets in `targets/` (nightly, cargo-fuzz; one `fuzz_target!` line each, run by
//! `scripts/test/fuzz`) and the seed replay in `tests/seeds.rs`, an ordinary test that
//! runs every committed seed (`corpus/<target>/`) through its target. A body panics on a
//! finding; it must not keep state between inputs that changes what an input does.
//! See docs/reliability.md, "Fuzzing".

mod cache_file;
mod chat_template;
mod gguf_header;
mod model_id;
mod request;
mod scratch;
mod tool_calls;

pub use cache_file::{cache_file, cache_file_hybrid};
pub use chat_template::chat_template;
pub use gguf_header::gguf_header;
pub use model_id::model_id;
pub use request::{anthropic_request, openai_request, responses_request};
pub use tool_calls::tool_calls;
