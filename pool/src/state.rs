//! Engine lifecycle states and the only transitions allowed between them.
//!
//! The one drawing of the engine state diagram (the docs point here): each arrow is a
//! row of `TRANSITIONS`, labelled with the events of `event.rs` that take it. Which
//! event takes which arrow, and with what effects, is decided in `slot.rs`; this table
//! is the guard it is checked against.
//!
//! ```text
//!  Stopped ──Start──▶ Starting ──Ready──▶ Ready
//!                       │   │               │   │
//!                       │   └──Stop──┐  ┌───┘   │  Stop from Ready: evict, keep-alive, shutdown, hung, unload, kill;
//!                       │            ▼  ▼       │  from Starting: shutdown, load timeout, unload, kill
//!                       │          Draining ────┼──Exited as asked (0 or our signal)──▶ Stopped
//!                       │            │          │  (Stop(kill) while Draining: killed now, still Draining)
//!                Exited │            │ Exited   │ Exited
//!                       │            │ (killed: hung or load timeout; or an error code)
//!                       ▼            ▼          ▼
//!                    Crashed (backoff)  /  Failed (cooldown)
//!                       ├──Start, once allowed──▶ Starting
//!                       └──Stop(shutdown, unload, kill)──▶ Stopped
//! ```
//! Crashed waits out a backoff (250 ms doubling to 8 s, reset by a run of 10 s); Failed
//! (exit 78 or 2, a configuration error, or more than 3 crashes in 60 s) refuses
//! requests for a 60 s cooldown (`policy.rs`). Leases (`Leased`, `Released`) change an
//! engine's count of requests in flight, never its state. Events from an older
//! generation (a process that was already replaced) change nothing.

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineState {
    /// No process (never started, evicted, or shut down cleanly).
    Stopped,
    /// Process spawned, model loading, not yet answering.
    Starting,
    /// Serving requests.
    Ready,
    /// Being stopped: drained first, or killed (hung, no time left).
    Draining,
    /// The process died unexpectedly; the next request respawns it (after backoff).
    Crashed,
    /// Crash loop or configuration error: requests get 503 until a cooldown passes.
    Failed,
}

use EngineState::*;

/// Every allowed (from, to) pair.
pub const TRANSITIONS: &[(EngineState, EngineState)] = &[
    (Stopped, Starting),
    (Starting, Ready),
    (Starting, Crashed),
    (Starting, Failed),
    (Starting, Draining),
    (Ready, Draining),
    (Ready, Crashed),
    (Ready, Failed),
    (Draining, Stopped),
    (Draining, Crashed),
    (Draining, Failed),
    (Crashed, Starting),
    (Crashed, Stopped),
    (Failed, Starting),
    (Failed, Stopped),
];

pub fn can_transition(from: EngineState, to: EngineState) -> bool {
    TRANSITIONS.contains(&(from, to))
}

impl EngineState {
    /// Whether a process exists (counts against the pool cap).
    pub fn is_resident(self) -> bool {
        matches!(self, Starting | Ready | Draining)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Stopped => "stopped",
            Starting => "starting",
            Ready => "ready",
            Draining => "draining",
            Crashed => "crashed",
            Failed => "failed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [EngineState; 6] = [Stopped, Starting, Ready, Draining, Crashed, Failed];

    /// One assertion per row of the table, and every pair not in it is refused.
    #[test]
    fn transition_table_row_by_row() {
        let expect = |from, to, ok: bool| assert_eq!(can_transition(from, to), ok, "{from:?} -> {to:?}");
        expect(Stopped, Starting, true); // first request or preload
        expect(Starting, Ready, true); // ready line + health probe
        expect(Starting, Crashed, true); // died while loading
        expect(Starting, Failed, true); // exit 78: configuration error
        expect(Starting, Draining, true); // shutdown, load timeout, unload or kill during load
        expect(Ready, Draining, true); // eviction, keep-alive, shutdown, hung, unload, kill
        expect(Ready, Crashed, true); // died while serving
        expect(Ready, Failed, true); // exit 78 after ready (config reloaded badly)
        expect(Draining, Stopped, true); // clean stop
        expect(Draining, Crashed, true); // died with a non-clean status while stopping, or was hung
        expect(Draining, Failed, true); // a hung engine's kill is the 4th crash in 60 s
        expect(Crashed, Starting, true); // respawn on demand after backoff
        expect(Crashed, Stopped, true); // shutdown, unload or kill of a dead engine
        expect(Failed, Starting, true); // cooldown passed
        expect(Failed, Stopped, true); // shutdown, unload or kill
        let allowed: Vec<_> =
            ALL.iter().flat_map(|&a| ALL.iter().map(move |&b| (a, b))).filter(|&(a, b)| can_transition(a, b)).collect();
        assert_eq!(allowed.len(), TRANSITIONS.len());
        for s in ALL {
            assert!(!can_transition(s, s), "{s:?} -> itself");
        }
        assert!(!can_transition(Stopped, Ready), "must load first");
        assert!(!can_transition(Failed, Ready));
        assert!(!can_transition(Draining, Ready), "a draining engine never serves again");
        assert!(!can_transition(Crashed, Failed), "a crash loop is decided when the process exits");
    }

    #[test]
    fn residency() {
        assert!(Starting.is_resident() && Ready.is_resident() && Draining.is_resident());
        assert!(!Stopped.is_resident() && !Crashed.is_resident() && !Failed.is_resident());
    }
}
