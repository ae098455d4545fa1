//! The engine server's shared state: the loaded model, its generation thread, prompt
//! cache and counters, the effective defaults, and the drain controls.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use corral_net::gauge::Gauge;

use super::requests::EffectiveDefaults;
use crate::Engine;
use crate::scheduler::admission::KvBudget;
use crate::scheduler::stats::Stats;
use crate::scheduler::worker::Worker;

pub struct App {
    pub engine: Arc<Engine>,
    pub worker: Worker,
    pub cache: Arc<crate::cache::PromptCache>,
    pub stats: Arc<Stats>,
    pub model_id: String,
    pub ctx: usize,
    pub max_queue: usize,
    pub batch: usize,
    /// What the running rows' KV may add up to (`admission`).
    pub kv_budget: KvBudget,
    /// `--memory-budget` in bytes (reported; the KV budget is derived from it).
    pub memory_budget: u64,
    pub max_body_bytes: usize,
    pub defaults: EffectiveDefaults,
    pub created: u64,
    pub default_drain: Duration,
    /// Set once a drain begins: generation requests are refused from then on.
    pub draining: AtomicBool,
    /// Generation requests admitted and not yet answered (a drain waits on it).
    pub work: Arc<Gauge>,
}
