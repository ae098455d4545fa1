//! The engine's batch scheduler: admission against the KV budget (`admission`), the
//! generation thread that runs up to `--batch` sequences in one forward pass
//! (`worker`), the pacing of newcomers' prompts beside running streams (`pacing`) and
//! the counters it keeps (`stats`). It speaks engine types (`Sequence`, `Outcome`,
//! `SchedulerError`) and must not know about HTTP or API error shapes: the server
//! maps its errors and renders its events.

pub mod admission;
mod error;
pub mod pacing;
pub mod stats;
pub mod worker;

pub use error::SchedulerError;
