//! One model's engine lifecycle as data: a phase that carries exactly the fields that
//! are meaningful in it, and a pure transition function `Slot::on(event, now)` that
//! returns the new phase and the effects the driver (`pool.rs`) must perform — spawn a
//! process, stop one, remove a socket, wake waiting requests, count. No locks, no I/O,
//! no clock: every rule (exit classification, backoff, crash loop, keep-alive) is
//! decided here with plain `Instant`s and tested row by row (`slot_tests.rs`).
//!
//! The states, the allowed transitions and the one drawing of the diagram are in
//! `state.rs`; `on` is checked against that table on every step.

use std::time::{Duration, Instant};

use crate::error::LeaseError;
use crate::event::{Counter, Effect, Event, Exit, Proc, StopHow, StopReason};
use crate::policy::{self, CrashLog};
use crate::state::{EngineState, can_transition};

#[derive(Clone, Debug, PartialEq)]
pub enum Phase {
    /// No process.
    Stopped,
    /// Spawning (no `proc` yet) or loading.
    Starting {
        generation: u64,
        proc: Option<Proc>,
        switch_from: Option<Instant>,
    },
    Ready {
        generation: u64,
        proc: Proc,
        since: Instant,
    },
    /// Being stopped; `proc` is `None` when shutdown came before the spawn finished.
    Draining {
        generation: u64,
        proc: Option<Proc>,
        why: StopReason,
        ready_since: Option<Instant>,
    },
    /// Died unexpectedly; starts again on demand from `retry_at`. `start_error` answers
    /// the requests that waited on the start that failed.
    Crashed {
        retry_at: Instant,
        start_error: Option<(u64, LeaseError)>,
    },
    /// Refuses requests until `until`.
    Failed {
        until: Instant,
        error: LeaseError,
    },
}

/// What a request waiting for this model should do now.
#[derive(Clone, Debug, PartialEq)]
pub enum Admit {
    Grant {
        generation: u64,
        proc: Proc,
    },
    Refuse(LeaseError),
    /// Wait for a change (a start or stop in progress), or until `until` (a backoff).
    Wait {
        until: Option<Instant>,
        starting: Option<u64>,
    },
    /// Nothing runs and nothing stops a start: start one (if the pool has room).
    Start,
}

/// Every field is private: `on` is the only writer.
#[derive(Clone, Debug)]
pub struct Slot {
    model: String,
    phase: Phase,
    generation: u64,
    in_flight: usize,
    last_used: Instant,
    restarts: u32,
    /// Consecutive failures (reset by an engine that stayed up `HEALTHY_AFTER`).
    failures: u32,
    crashes: CrashLog,
}

impl Slot {
    pub fn new(model: &str, now: Instant) -> Self {
        Self {
            model: model.to_owned(),
            phase: Phase::Stopped,
            generation: 0,
            in_flight: 0,
            last_used: now,
            restarts: 0,
            failures: 0,
            crashes: CrashLog::default(),
        }
    }

    pub fn state(&self) -> EngineState {
        self.phase.state()
    }

    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// Leases held on the live process.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The last lease granted or given back (or the engine becoming ready).
    pub fn last_used(&self) -> Instant {
        self.last_used
    }

    /// Starts after a crash, over the slot's life.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    /// The live process, if any.
    pub fn proc(&self) -> Option<&Proc> {
        match &self.phase {
            Phase::Starting { proc, .. } | Phase::Draining { proc, .. } => proc.as_ref(),
            Phase::Ready { proc, .. } => Some(proc),
            _ => None,
        }
    }

    /// The generation of the live (or starting) process.
    pub fn live_generation(&self) -> Option<u64> {
        match &self.phase {
            Phase::Starting { generation, .. }
            | Phase::Ready { generation, .. }
            | Phase::Draining { generation, .. } => Some(*generation),
            _ => None,
        }
    }

    pub fn admit(&self, now: Instant, waited_on: Option<u64>) -> Admit {
        match &self.phase {
            Phase::Ready { generation, proc, .. } => Admit::Grant { generation: *generation, proc: proc.clone() },
            Phase::Failed { until, error } if *until > now => Admit::Refuse(error.clone()),
            Phase::Starting { generation, .. } => Admit::Wait { until: None, starting: Some(*generation) },
            Phase::Draining { .. } => Admit::Wait { until: None, starting: None },
            Phase::Crashed { start_error: Some((g, e)), .. } if waited_on == Some(*g) => Admit::Refuse(e.clone()),
            Phase::Crashed { retry_at, .. } if *retry_at > now => {
                Admit::Wait { until: Some(*retry_at), starting: None }
            }
            Phase::Stopped | Phase::Crashed { .. } | Phase::Failed { .. } => Admit::Start,
        }
    }

    /// When keep-alive should stop this engine (idle and ready only).
    pub fn keep_alive_due(&self, ttl: Duration) -> Option<Instant> {
        matches!(self.phase, Phase::Ready { .. } if self.in_flight == 0).then(|| self.last_used + ttl)
    }

    /// A lease is only ever granted on the ready process (`admit`, under the driver's
    /// lock); one on any other generation changes nothing.
    fn leased(&mut self, generation: u64, now: Instant) -> Vec<Effect> {
        if matches!(self.phase, Phase::Ready { generation: g, .. } if g == generation) {
            self.in_flight += 1;
            self.last_used = now;
        }
        vec![]
    }

    /// A lease on a process that has since exited was already cleared with it
    /// (`in_flight` restarts at 0 with each process): counting it against its successor
    /// would make a busy engine look idle, and so evictable or past its keep-alive
    /// mid-request.
    fn released(&mut self, generation: u64, now: Instant) -> Vec<Effect> {
        if self.live_generation() != Some(generation) {
            return vec![Effect::Wake];
        }
        self.in_flight = self.in_flight.saturating_sub(1);
        self.last_used = now;
        vec![Effect::Wake, Effect::Evict { keep_self: false }]
    }

    /// The transition function: apply `ev` at `now`, return what the driver must do.
    pub fn on(&mut self, ev: Event, now: Instant) -> Vec<Effect> {
        let before = self.state();
        let effects = self.step(ev, now);
        let after = self.state();
        debug_assert!(before == after || can_transition(before, after), "bad transition {before:?} -> {after:?}");
        effects
    }

    fn step(&mut self, ev: Event, now: Instant) -> Vec<Effect> {
        use Effect::*;
        match ev {
            // Leases change the count, never the phase.
            Event::Leased { generation } => return self.leased(generation, now),
            Event::Released { generation } => return self.released(generation, now),
            // Running, starting, stopping, or too early (backoff, cooldown): no start.
            Event::Start { .. } if self.admit(now, None) != Admit::Start => return vec![],
            _ => {}
        }
        let phase = std::mem::replace(&mut self.phase, Phase::Stopped);
        let (phase, effects) = match (phase, ev) {
            (old @ (Phase::Stopped | Phase::Crashed { .. } | Phase::Failed { .. }), Event::Start { switch_from }) => {
                let counter = if matches!(old, Phase::Crashed { .. }) {
                    self.restarts += 1;
                    Counter::Respawn
                } else {
                    Counter::Spawn
                };
                self.generation += 1;
                self.in_flight = 0;
                let generation = self.generation;
                (Phase::Starting { generation, proc: None, switch_from }, vec![Spawn { generation }, Count(counter)])
            }
            (Phase::Starting { generation, proc: None, switch_from }, Event::Spawned { generation: g, proc })
                if g == generation =>
            {
                (Phase::Starting { generation, proc: Some(proc), switch_from }, vec![])
            }
            (Phase::Draining { generation, proc: None, why, ready_since }, Event::Spawned { generation: g, proc })
                if g == generation =>
            {
                // Stopped before the process existed: stop it now that it does.
                let stop = Stop { generation, proc: proc.clone(), how: why.how() };
                (Phase::Draining { generation, proc: Some(proc), why, ready_since }, vec![stop])
            }
            (Phase::Starting { generation, proc: Some(proc), switch_from }, Event::Ready { generation: g })
                if g == generation =>
            {
                let mut fx = vec![Wake, Evict { keep_self: true }];
                if let Some(t) = switch_from {
                    fx.push(Switched(now.saturating_duration_since(t)));
                }
                // Ready counts as a use: an engine restarted for a model last used long
                // ago is neither past its keep-alive nor the least recently used before
                // the requests that waited for it have taken it.
                self.last_used = self.last_used.max(now);
                (Phase::Ready { generation, proc, since: now }, fx)
            }
            (Phase::Ready { generation, proc, since }, Event::Stop { why, pid })
                if why != StopReason::LoadTimeout && (why != StopReason::Hung || pid == Some(proc.pid)) =>
            {
                let mut fx = vec![Stop { generation, proc: proc.clone(), how: why.how() }];
                if matches!(why, StopReason::Evict | StopReason::KeepAlive) {
                    fx.push(Count(Counter::Eviction));
                }
                (Phase::Draining { generation, proc: Some(proc), why, ready_since: Some(since) }, fx)
            }
            (Phase::Starting { generation, proc, .. }, Event::Stop { why, .. })
                if matches!(
                    why,
                    StopReason::Shutdown | StopReason::LoadTimeout | StopReason::Unload | StopReason::Kill
                ) =>
            {
                let fx = proc.iter().map(|p| Stop { generation, proc: p.clone(), how: why.how() }).collect();
                (Phase::Draining { generation, proc, why, ready_since: None }, fx)
            }
            // Out of time while already stopping: kill what the drain is waiting on. The
            // exit then reads as asked for, whatever the first reason was.
            (Phase::Draining { generation, proc, ready_since, .. }, Event::Stop { why: StopReason::Kill, .. }) => {
                let fx = proc.iter().map(|p| Stop { generation, proc: p.clone(), how: StopHow::Kill }).collect();
                (Phase::Draining { generation, proc, why: StopReason::Kill, ready_since }, fx)
            }
            (
                Phase::Crashed { .. } | Phase::Failed { .. },
                Event::Stop { why: StopReason::Shutdown | StopReason::Unload | StopReason::Kill, .. },
            ) => (Phase::Stopped, vec![Wake]),
            (old, Event::Exited { generation: g, exit }) if old.generation() == Some(g) => {
                let socket = old.proc().map(|p| p.socket.clone());
                let (phase, mut fx) = self.exited(old, g, exit, now);
                if let Some(socket) = socket {
                    fx.insert(0, RemoveSocket(socket));
                }
                (phase, fx)
            }
            // Anything else (a stale generation, a stop of an engine already stopping,
            // an eviction of one still loading) changes nothing.
            (old, _) => (old, vec![]),
        };
        self.phase = phase;
        effects
    }

    /// Classify an exit: a stop we asked for, a configuration error, a crash (backoff),
    /// or a crash loop.
    fn exited(&mut self, old: Phase, generation: u64, exit: Exit, now: Instant) -> (Phase, Vec<Effect>) {
        use Effect::*;
        self.in_flight = 0;
        let model = self.model.clone();
        let ready_since = match &old {
            Phase::Ready { since, .. } => Some(*since),
            Phase::Draining { ready_since, .. } => *ready_since,
            _ => None,
        };
        let requested = match &old {
            Phase::Draining { why, .. } => Some(*why),
            _ => None,
        };
        if let Some(
            StopReason::Evict | StopReason::KeepAlive | StopReason::Shutdown | StopReason::Unload | StopReason::Kill,
        ) = requested
        {
            // We asked it to stop. Exit 0 or our signal is clean; anything else is shown
            // as a crash but needs no backoff (nobody waits on this engine).
            if exit.code == Some(0) || exit.signal.is_some() {
                return (Phase::Stopped, vec![Wake]);
            }
            return (Phase::Crashed { retry_at: now, start_error: None }, vec![Wake]);
        }
        let fx = vec![Wake, Count(Counter::Crash)];
        if exit.code.is_some_and(corral_protocol::launch::is_config_exit) {
            let error = LeaseError::Config { model, line: exit.line };
            return (Phase::Failed { until: now + policy::FAILED_COOLDOWN, error }, fx);
        }
        let (how, start_error) = match (requested, ready_since) {
            (Some(StopReason::LoadTimeout), _) => {
                ("no ready answer in time".to_owned(), Some(LeaseError::LoadTimeout { model: model.clone() }))
            }
            (_, None) => {
                let e = LeaseError::StartFailed { model: model.clone(), how: exit.how(), line: exit.line.clone() };
                (exit.how(), Some(e))
            }
            (_, Some(_)) => (exit.how(), None),
        };
        match self.crash(now, ready_since) {
            Some(retry_at) => (Phase::Crashed { retry_at, start_error: start_error.map(|e| (generation, e)) }, fx),
            None => {
                let error = LeaseError::CrashLoop { model, how, line: exit.line };
                (Phase::Failed { until: now + policy::FAILED_COOLDOWN, error }, fx)
            }
        }
    }

    /// Record a crash; returns when the next start may happen, or `None` for a crash loop.
    fn crash(&mut self, now: Instant, ready_since: Option<Instant>) -> Option<Instant> {
        if ready_since.is_some_and(|t| now.saturating_duration_since(t) >= policy::HEALTHY_AFTER) {
            self.failures = 0;
        }
        self.failures += 1;
        if self.crashes.record(now) { None } else { Some(now + policy::backoff(self.failures)) }
    }
}

impl Phase {
    pub fn state(&self) -> EngineState {
        match self {
            Phase::Stopped => EngineState::Stopped,
            Phase::Starting { .. } => EngineState::Starting,
            Phase::Ready { .. } => EngineState::Ready,
            Phase::Draining { .. } => EngineState::Draining,
            Phase::Crashed { .. } => EngineState::Crashed,
            Phase::Failed { .. } => EngineState::Failed,
        }
    }

    fn generation(&self) -> Option<u64> {
        match self {
            Phase::Starting { generation, .. }
            | Phase::Ready { generation, .. }
            | Phase::Draining { generation, .. } => Some(*generation),
            _ => None,
        }
    }

    fn proc(&self) -> Option<&Proc> {
        match self {
            Phase::Starting { proc, .. } | Phase::Draining { proc, .. } => proc.as_ref(),
            Phase::Ready { proc, .. } => Some(proc),
            _ => None,
        }
    }
}

#[cfg(test)]
#[path = "slot_tests.rs"]
mod tests;
