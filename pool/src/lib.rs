//! corral's model pool: the registry of known models and the lifecycle of one engine
//! child process per model — spawn, readiness, supervision, drain, stop, respawn with
//! backoff, LRU eviction under a count cap and a memory budget. It never links model
//! code: an engine is a process reached over HTTP on a unix socket.
//!
//! Layout: `slot.rs` is each engine's state machine as data (pure, tested row by row;
//! its events and effects in `event.rs`, its states, allowed transitions and the one
//! drawing of the diagram in `state.rs`); `pool.rs` drives it (locks, performs effects,
//! leases; `lease.rs`, `tasks.rs` for the engine watcher and keep-alive timer,
//! `manage.rs` for loads and unloads a person asks for, `reload.rs` for a new model
//! list, `counters.rs` for what `/stats` reads); `settings.rs` holds per-model
//! overrides; `stop.rs` is the one stop path;
//! `procs.rs` is the door to processes and sockets (`spawn.rs`, `child.rs`,
//! `unix_http.rs` behind it; `stderr_limit.rs` bounds what an engine's stderr costs); `policy.rs` holds the decisions across models (LRU
//! victims, room to start, backoff); `error.rs` the reasons a lease fails.

pub mod card;
pub mod child;
pub mod counters;
pub mod error;
pub mod event;
pub mod gguf_meta;
pub mod lease;
mod manage;
pub mod policy;
pub mod pool;
pub mod procs;
pub mod registry;
mod reload;
pub mod settings;
pub mod slot;
pub mod spawn;
pub mod state;
pub mod stderr_limit;
pub mod stop;
mod tasks;
pub mod unix_http;
pub mod view;

#[cfg(test)]
mod fake_procs;
#[cfg(test)]
mod pool_model_tests;

pub use error::LeaseError;
pub use pool::{Lease, Pool, PoolConfig};
pub use reload::Changes;
pub use settings::ModelSettings;
pub use view::PoolSnapshot;
