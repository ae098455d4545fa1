//! What the pool shows: `/engine` (pool and engine states), `/v1/models` (every known
//! model, resident or not) and the sockets `/stats` asks. Read-only views; they never
//! start or call an engine.

use std::path::PathBuf;

use corral_protocol::openai::{ModelCard, ModelList};
use serde::Serialize;

use crate::child::ExitInfo;
use crate::pool::Pool;
use crate::state::EngineState;

#[derive(Clone, Debug, Serialize)]
pub struct PoolView {
    pub cap: usize,
    pub resident: Vec<String>,
    pub memory_budget_bytes: u64,
    pub default: Option<String>,
    /// `--keep-alive` in seconds: an idle ready engine stops this long after its last
    /// use (`null`: engines stay until evicted).
    pub keep_alive_s: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct EngineView {
    pub model: String,
    pub state: &'static str,
    pub pid: Option<u32>,
    pub socket: Option<String>,
    pub restarts: u32,
    pub started_at: Option<u64>,
    pub last_used_at: Option<u64>,
    pub in_flight: usize,
    pub model_bytes: u64,
    /// `cpu` or `cuda:N` once an engine has started.
    pub device: Option<String>,
    pub last_exit: Option<ExitInfo>,
}

/// `GET /engine`.
#[derive(Clone, Debug, Serialize)]
pub struct PoolSnapshot {
    pub pool: PoolView,
    pub engines: Vec<EngineView>,
}

impl Pool {
    pub fn snapshot(&self) -> PoolSnapshot {
        let g = self.shared.lock();
        let cfg = &self.shared.cfg;
        let engines = g
            .models
            .values()
            .filter(|m| !m.retired || m.slot.state().is_resident())
            .map(|m| EngineView {
                model: m.entry.id.to_string(),
                state: m.slot.state().as_str(),
                pid: m.slot.proc().map(|p| p.pid),
                socket: m.slot.proc().map(|p| p.socket.display().to_string()),
                restarts: m.slot.restarts(),
                started_at: m.started_at,
                last_used_at: m.last_used_at,
                in_flight: m.slot.in_flight(),
                model_bytes: m.entry.bytes,
                device: m.device.clone(),
                last_exit: m.last_exit.clone(),
            })
            .collect();
        PoolSnapshot {
            pool: PoolView {
                cap: cfg.cap,
                resident: g
                    .models
                    .values()
                    .filter(|m| m.slot.state().is_resident())
                    .map(|m| m.entry.id.to_string())
                    .collect(),
                memory_budget_bytes: cfg.memory_budget,
                default: g.only().map(|k| k.to_string()),
                keep_alive_s: cfg.keep_alive.map(|d| d.as_secs()),
            },
            engines,
        }
    }

    /// Sockets of ready engines, for fetching their stats.
    pub fn ready_sockets(&self) -> Vec<(String, PathBuf)> {
        let g = self.shared.lock();
        g.models
            .values()
            .filter(|m| m.slot.state() == EngineState::Ready)
            .filter_map(|m| Some((m.entry.id.to_string(), m.slot.proc()?.socket.clone())))
            .collect()
    }

    /// Every known model, resident or not; cards learned from engines that have run.
    pub fn models(&self) -> ModelList {
        let g = self.shared.lock();
        // In the order models were given: the first is the default.
        let data = g
            .order
            .iter()
            .filter_map(|id| g.models.get(id))
            .map(|m| {
                let mut card =
                    m.card.clone().unwrap_or_else(|| ModelCard::new(m.entry.id.to_string(), m.entry.modified));
                card.id = m.entry.id.to_string();
                card.resident = Some(m.slot.state().is_resident());
                card
            })
            .collect();
        ModelList { object: "list".into(), data }
    }
}
