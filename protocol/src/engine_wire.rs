//! What an engine process says to its parent: the ready line on stdout and the
//! unix-socket-only admin responses.

use serde::{Deserialize, Serialize};

/// The one JSON line an engine prints on stdout once the model is loaded and the
/// socket accepts connections.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ReadyEvent {
    pub event: String,
    pub pid: u32,
    pub socket: String,
    pub model: String,
    pub load_ms: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DrainResponse {
    pub drained: bool,
    /// Prompt-cache entries moved to the SSD tier.
    pub demotions: usize,
    /// Requests still running at the deadline that were cut.
    pub cancelled: usize,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RequestTiming {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Averages {
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Memory {
    /// Resident set size of the engine process (0 where unknown).
    pub rss_bytes: u64,
    pub model_file_bytes: u64,
}

/// `GET /admin/stats` on an engine socket.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct EngineStats {
    pub model: String,
    pub pid: u32,
    pub uptime_s: f64,
    pub draining: bool,
    pub requests_total: u64,
    pub requests_failed: u64,
    pub requests_cancelled: u64,
    pub prompt_tokens_total: u64,
    pub generated_tokens_total: u64,
    pub queue_depth: usize,
    pub max_queue: usize,
    pub in_flight: usize,
    pub last: Option<RequestTiming>,
    /// Exponential moving averages (weight 0.2 for the newest request).
    pub avg: Averages,
    pub memory: Memory,
    /// `{entries, bytes, max_bytes, hits, misses, hit_tokens}` (see docs/api.md).
    #[serde(default)]
    pub prompt_cache: serde_json::Value,
    /// `{dir, usable, error, entries, bytes, max_bytes, restores, restore_ms_last, spills,
    /// demotions, failed_spills, rejected_files}`, or null when the SSD tier is off.
    #[serde(default)]
    pub ssd_cache: serde_json::Value,
}
