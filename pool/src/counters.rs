//! The pool's counters — engines spawned, respawned, evicted, crashed; model switches
//! and how long each took — as `/stats` and `/metrics` read them. They count what the
//! slots report (`Effect::Count`, `Effect::Switched`); nothing reads them to decide.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use corral_protocol::histogram::Histogram;

use crate::event::Counter;

/// Bucket bounds of a model switch, seconds (a small model on a GPU loads in a fraction
/// of a second; a large one from a cold disk in minutes).
pub const SWITCH_BOUNDS: [f64; 10] = [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

pub struct Counters {
    pub spawns: AtomicU64,
    pub respawns: AtomicU64,
    pub evictions: AtomicU64,
    pub crashes: AtomicU64,
    pub switches: AtomicU64,
    pub last_switch_ms: AtomicU64,
    /// Every switch's duration: from the request that caused it to the new engine ready.
    pub switch_seconds: Mutex<Histogram>,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            spawns: AtomicU64::new(0),
            respawns: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            crashes: AtomicU64::new(0),
            switches: AtomicU64::new(0),
            last_switch_ms: AtomicU64::new(0),
            switch_seconds: Mutex::new(Histogram::new(&SWITCH_BOUNDS)),
        }
    }
}

impl Counters {
    /// The switch durations so far.
    pub fn switch_seconds(&self) -> Histogram {
        self.switch_seconds.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// One more of what a slot counted.
    pub(crate) fn count(&self, c: Counter) {
        let counter = match c {
            Counter::Spawn => &self.spawns,
            Counter::Respawn => &self.respawns,
            Counter::Eviction => &self.evictions,
            Counter::Crash => &self.crashes,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A switch (a start while another model was resident) took `d`.
    pub(crate) fn switched(&self, d: Duration) {
        self.switches.fetch_add(1, Ordering::Relaxed);
        self.last_switch_ms.store(d.as_millis() as u64, Ordering::Relaxed);
        self.switch_seconds.lock().unwrap_or_else(|e| e.into_inner()).observe(d.as_secs_f64());
    }
}
