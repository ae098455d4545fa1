//! What an engine process says to its parent: the event line on stdout and the
//! unix-socket-only admin responses (`/admin/drain`, `/admin/stats`), typed on both sides.

use serde::{Deserialize, Serialize};

use crate::histogram::Histogram;

/// A JSON line an engine prints on stdout. Today only `ready`: once the model is loaded
/// and the socket accepts connections. Lines that do not parse as an event are ignored.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EngineEvent {
    Ready(Ready),
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Ready {
    pub pid: u32,
    pub socket: String,
    pub model: String,
    pub load_ms: u64,
    /// What the engine computes on: `cpu` or `cuda:N` (empty from an older engine).
    #[serde(default)]
    pub device: String,
}

impl EngineEvent {
    /// The event on one stdout line, if it is one.
    pub fn parse(line: &str) -> Option<Self> {
        serde_json::from_str(line).ok()
    }

    pub fn to_line(&self) -> String {
        serde_json::to_string(self).expect("engine events always serialize")
    }
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

/// The generation batch (`--batch`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct BatchStats {
    /// Rows allowed at once.
    pub configured: usize,
    /// Rows generating now.
    pub active_rows: usize,
    /// Requests waiting to join.
    pub pending_rows: usize,
    /// The most rows one forward pass has carried.
    pub peak_rows: usize,
    /// Rows that have joined the batch since start.
    pub submitted_rows: u64,
    /// Forward passes, and those that carried more than one row.
    pub steps: u64,
    pub batched_steps: u64,
    /// `serial` (`--batch 1`) or `continuous`.
    pub mode: String,
    /// KV reserved by the running rows, and what they may reserve together.
    pub kv_bytes: u64,
    pub kv_budget_bytes: u64,
    /// Speculative decoding since start.
    pub speculation: SpecStats,
}

/// Speculative decoding's counters (`docs/speculation.md`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct SpecStats {
    /// Finished requests that speculated.
    pub requests: u64,
    /// Draft tokens verified, and those kept.
    pub drafted: u64,
    pub accepted: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Memory {
    /// Resident set size of the engine process (0 where unknown).
    pub rss_bytes: u64,
    pub model_file_bytes: u64,
    /// The engine's memory budget (`--memory-budget`), and what it uses now (its RSS).
    pub budget_bytes: u64,
    pub used_bytes: u64,
}

/// The engine's compute device.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct DeviceStats {
    /// `cpu` or `cuda:N`.
    pub kind: String,
    /// The GPU's name (empty on the CPU).
    pub name: String,
    /// Device memory, total and in use by every process (0 on the CPU).
    pub memory_total_bytes: u64,
    pub memory_used_bytes: u64,
}

/// The RAM tier of the prompt cache.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct PromptCacheStats {
    pub entries: usize,
    pub bytes: u64,
    pub max_bytes: u64,
    /// Requests that reused a prefix, from RAM or disk.
    pub hits: u64,
    /// Requests that reused nothing.
    pub misses: u64,
    pub hit_tokens: u64,
}

/// The SSD tier of the prompt cache.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct SsdCacheStats {
    pub dir: String,
    pub usable: bool,
    /// Why the tier is off, when it is.
    pub error: Option<String>,
    pub entries: usize,
    pub bytes: u64,
    pub max_bytes: u64,
    /// Hits served from disk.
    pub restores: u64,
    pub restore_ms_last: u64,
    /// Files written.
    pub spills: u64,
    /// Entries made durable by eviction, drain, flush or idle demotion.
    pub demotions: u64,
    pub failed_spills: u64,
    pub rejected_files: u64,
    /// Entries pushed out of RAM and waiting for the writer, and their bytes.
    pub pending_spills: usize,
    pub pending_spill_bytes: u64,
    /// Queued spills dropped because the queue was over `--ssd-spill-queue` (each is a
    /// later miss, never a wrong answer).
    pub dropped_spills: u64,
}

/// `GET /admin/stats` on an engine socket.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
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
    /// Context size per request (`--ctx`, alias `--context-length`).
    pub ctx: usize,
    pub batch: BatchStats,
    pub last: Option<RequestTiming>,
    /// Exponential moving averages (weight 0.2 for the newest request).
    pub avg: Averages,
    /// Time to first token of each request since the engine started: from its arrival
    /// at the engine to its first generated token (parsing, queue and prefill).
    pub ttft_seconds: Histogram,
    /// Decode rate of each request that generated two tokens or more.
    pub decode_tokens_per_second: Histogram,
    pub memory: Memory,
    /// What the engine computes on.
    pub device: DeviceStats,
    pub prompt_cache: PromptCacheStats,
    /// `None` when the SSD tier is off.
    pub ssd_cache: Option<SsdCacheStats>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_line_keeps_its_wire_shape() {
        let ev = EngineEvent::Ready(Ready {
            pid: 7,
            socket: "/s".into(),
            model: "m".into(),
            load_ms: 3,
            device: "cpu".into(),
        });
        let line = ev.to_line();
        assert_eq!(line, r#"{"event":"ready","pid":7,"socket":"/s","model":"m","load_ms":3,"device":"cpu"}"#);
        let old = EngineEvent::parse(r#"{"event":"ready","pid":7,"socket":"/s","model":"m","load_ms":3}"#);
        assert!(matches!(old, Some(EngineEvent::Ready(r)) if r.device.is_empty()));
        assert_eq!(EngineEvent::parse(&line), Some(ev));
        assert_eq!(EngineEvent::parse(r#"{"event":"other"}"#), None);
        assert_eq!(EngineEvent::parse("not json"), None);
    }

    #[test]
    fn stats_parse_from_a_partial_object() {
        let s: EngineStats = serde_json::from_str(r#"{"model":"m","requests_total":3}"#).unwrap();
        assert_eq!((s.model.as_str(), s.requests_total, s.ssd_cache), ("m", 3, None));
        let v = serde_json::to_value(EngineStats { ssd_cache: Some(SsdCacheStats::default()), ..Default::default() })
            .unwrap();
        assert_eq!(v["ssd_cache"]["dropped_spills"], 0);
        assert_eq!(v["prompt_cache"]["hits"], 0);
    }
}
