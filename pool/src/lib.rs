//! corral's model pool: the registry of known models and the lifecycle of one engine
//! child process per model — spawn, readiness, supervision, drain, stop, respawn with
//! backoff, LRU eviction under a count cap and a memory budget. It never links model
//! code: an engine is a process reached over HTTP on a unix socket.

pub mod child;
pub mod gguf_meta;
pub mod policy;
pub mod pool;
pub mod registry;
pub mod spawn;
pub mod state;
pub mod unix_http;

pub use pool::{Lease, Pool, PoolConfig, PoolSnapshot};
