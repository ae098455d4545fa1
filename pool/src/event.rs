//! The words of a slot's state machine (`slot.rs`): the events it is fed — by the
//! driver (`pool.rs`), the engine watcher and the keep-alive timer (`tasks.rs`), a lease
//! (`lease.rs`) — and the effects it asks the driver to perform. Plain values only: no
//! locks, no I/O, so every rule that reads them is tested with them.

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A live engine process, as the machine sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proc {
    pub pid: u32,
    pub socket: PathBuf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// Over the pool's count or memory limit.
    Evict,
    /// Idle longer than `--keep-alive`.
    KeepAlive,
    Shutdown,
    /// The proxy saw it stall or answer garbage.
    Hung,
    /// It did not become ready (or answer its health check) in time.
    LoadTimeout,
    /// A person asked for it (`POST /api/models/{id}/unload`): stopped like an eviction
    /// (drained, its prompt cache saved), from any live state; a crashed or failed
    /// model is reset to stopped (its backoff or cooldown cleared).
    Unload,
    /// No time left (a second signal, or shutdown past its deadline): SIGKILL now, from
    /// any live state, including one already draining; crashed and failed models stop.
    Kill,
}

impl StopReason {
    /// Engines that are hung, never came up, or out of time are not asked to drain.
    pub(crate) fn how(self) -> StopHow {
        match self {
            StopReason::Hung | StopReason::LoadTimeout | StopReason::Kill => StopHow::Kill,
            StopReason::Evict | StopReason::KeepAlive | StopReason::Shutdown | StopReason::Unload => StopHow::Graceful,
        }
    }
}

/// How an engine is stopped (`stop.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopHow {
    /// Drain (save the prompt cache) → SIGTERM → SIGKILL at the deadline.
    Graceful,
    /// SIGKILL now: it is hung or never came up, a drain would only wait.
    Kill,
}

/// How a process ended, reduced to what the rules need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// The most telling stderr line (for error messages).
    pub line: String,
}

impl Exit {
    pub(crate) fn how(&self) -> String {
        match (self.code, self.signal) {
            (Some(c), _) => format!("exit code {c}"),
            (_, Some(s)) => format!("signal {s}"),
            _ => "unknown status".into(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A request needs this model and the pool has room: start an engine.
    Start {
        switch_from: Option<Instant>,
    },
    Spawned {
        generation: u64,
        proc: Proc,
    },
    /// The ready line came and the engine answered its health check.
    Ready {
        generation: u64,
    },
    /// The process is gone, or was never created (spawn failed).
    Exited {
        generation: u64,
        exit: Exit,
    },
    /// `Hung` only applies to the process `pid` names (the one the proxy saw fail).
    Stop {
        why: StopReason,
        pid: Option<u32>,
    },
    /// A request was granted process `generation` (`Admit::Grant`): one more in flight.
    Leased {
        generation: u64,
    },
    /// A lease on process `generation` ended.
    Released {
        generation: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    Spawn,
    Respawn,
    Eviction,
    Crash,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    Spawn {
        generation: u64,
    },
    Stop {
        generation: u64,
        proc: Proc,
        how: StopHow,
    },
    RemoveSocket(PathBuf),
    /// Requests waiting on this slot should look again.
    Wake,
    Count(Counter),
    /// A switch (a start while another model was resident) finished.
    Switched(Duration),
    /// Resident engines may now be over the limits; `keep` this one.
    Evict {
        keep_self: bool,
    },
}
