//! corral's side of the Hugging Face Hub: the shared model cache and downloads into it.
//!
//! The cache is the one `huggingface_hub`, `hf download` and llama.cpp use
//! (`layout.rs`), so a file any of them fetched is found here (`scan.rs`) and what corral
//! fetches is found by them. `pull.rs` downloads one GGUF file: the file is chosen from
//! the repository's listing (`choose.rs`), fetched through the hub's HTTP API (`api.rs`)
//! into a partial file that a later run resumes (`download.rs`, decisions in
//! `transfer.rs`), checked against its SHA-256 and published without ever leaving a
//! half-written file under a final name (`store.rs`). Names that reach URLs and paths
//! are validated once (`repo.rs`); the token is found as `huggingface_hub` finds it
//! (`token.rs`).
//!
//! It knows nothing of corral's model ids, engines or servers: the binary turns what
//! `scan` finds into registry entries.

pub mod api;
pub mod choose;
pub mod download;
pub mod error;
pub mod layout;
pub mod pull;
pub mod repo;
pub mod scan;
pub mod store;
pub mod token;
pub mod transfer;

pub use download::{NoProgress, Progress};
pub use error::HubError;
pub use pull::{PullRequest, Pulled, pull};

/// Where the hub is when `HF_ENDPOINT` does not say.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
