//! The pool's pure decisions, kept apart from processes and sockets so they are tested
//! with plain values: restart backoff, crash-loop detection, whether a cold model may
//! start now, and which idle engines to evict.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// First retry delay after a failed start or crash.
pub const BACKOFF_BASE: Duration = Duration::from_millis(250);
/// Longest retry delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(8);
/// More than this many crashes within `CRASH_WINDOW` is a crash loop.
pub const MAX_CRASHES: usize = 3;
pub const CRASH_WINDOW: Duration = Duration::from_secs(60);
/// How long a `Failed` model refuses requests before trying again.
pub const FAILED_COOLDOWN: Duration = Duration::from_secs(60);
/// An engine that stayed up this long after becoming ready resets its failure count.
pub const HEALTHY_AFTER: Duration = Duration::from_secs(10);

/// Delay before the next start after `failures` consecutive failures (0 = none).
pub fn backoff(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    let factor = 1u32.checked_shl(failures - 1).unwrap_or(u32::MAX);
    BACKOFF_BASE.saturating_mul(factor).min(BACKOFF_MAX)
}

/// Crash history of one model.
#[derive(Clone, Debug, Default)]
pub struct CrashLog {
    times: VecDeque<Instant>,
}

impl CrashLog {
    /// Record a crash at `now`; returns true if this makes a crash loop.
    pub fn record(&mut self, now: Instant) -> bool {
        self.times.push_back(now);
        while self.times.front().is_some_and(|&t| now.duration_since(t) > CRASH_WINDOW) {
            self.times.pop_front();
        }
        self.times.len() > MAX_CRASHES
    }

    pub fn clear(&mut self) {
        self.times.clear();
    }
}

/// An engine as the placement decision sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Resident<K> {
    pub key: K,
    pub starting: bool,
    pub in_flight: usize,
    pub last_used: Instant,
    pub bytes: u64,
    /// Never a victim (`pin = true` in the config file): it holds its place like a busy
    /// engine.
    pub pinned: bool,
}

pub struct Limits {
    pub cap: usize,
    /// 0 = no memory budget.
    pub memory_budget: u64,
}

/// May a model needing `bytes` start now? Idle ready engines do not count: they can be
/// evicted once the new one is ready (spawn overlap). Busy, pinned and starting ones do.
pub fn can_start<K>(residents: &[Resident<K>], bytes: u64, limits: &Limits) -> bool {
    let committed: Vec<&Resident<K>> = residents.iter().filter(|r| r.starting || r.in_flight > 0 || r.pinned).collect();
    if committed.len() >= limits.cap.max(1) {
        return false;
    }
    if limits.memory_budget > 0 {
        let used: u64 = committed.iter().map(|r| r.bytes).sum();
        // A lone model bigger than the budget still gets to run (nothing else fits anyway).
        if !committed.is_empty() && used + bytes > limits.memory_budget {
            return false;
        }
    }
    true
}

/// Which idle, ready engines to stop (least recently used first) so the residents fit
/// the limits. Pinned engines are never chosen, nor is `keep` (the engine just started for a waiting request).
/// Engines still starting do not count yet: the engine a switch is waiting for makes
/// the old one go only once it is ready, so the old one serves throughout the load.
pub fn victims<K: PartialEq + Clone>(residents: &[Resident<K>], keep: Option<&K>, limits: &Limits) -> Vec<K> {
    let mut count = residents.iter().filter(|r| !r.starting).count();
    let mut bytes: u64 = residents.iter().filter(|r| !r.starting).map(|r| r.bytes).sum();
    let over = |count: usize, bytes: u64| {
        count > limits.cap.max(1) || (limits.memory_budget > 0 && bytes > limits.memory_budget && count > 1)
    };
    let mut idle: Vec<&Resident<K>> =
        residents.iter().filter(|r| !r.starting && !r.pinned && r.in_flight == 0 && Some(&r.key) != keep).collect();
    idle.sort_by_key(|r| r.last_used);
    let mut out = Vec::new();
    for r in idle {
        if !over(count, bytes) {
            break;
        }
        out.push(r.key.clone());
        count -= 1;
        bytes -= r.bytes;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_ceiling() {
        let ms = |n| backoff(n).as_millis();
        assert_eq!((ms(0), ms(1), ms(2), ms(3), ms(4), ms(5), ms(6)), (0, 250, 500, 1000, 2000, 4000, 8000));
        assert_eq!(ms(7), 8000);
        assert_eq!(ms(100), 8000);
    }

    #[test]
    fn crash_loop_is_more_than_three_in_a_minute() {
        let t0 = Instant::now();
        let mut log = CrashLog::default();
        assert!(!log.record(t0));
        assert!(!log.record(t0 + Duration::from_secs(1)));
        assert!(!log.record(t0 + Duration::from_secs(2)));
        assert!(log.record(t0 + Duration::from_secs(3)));
        let mut slow = CrashLog::default();
        for i in 0..10 {
            assert!(!slow.record(t0 + Duration::from_secs(25 * i)), "crashes spread out are not a loop");
        }
    }

    fn r(key: &'static str, starting: bool, in_flight: usize, age_s: u64, bytes: u64) -> Resident<&'static str> {
        let now = Instant::now() + Duration::from_secs(1000);
        Resident { key, starting, in_flight, last_used: now - Duration::from_secs(age_s), bytes, pinned: false }
    }

    #[test]
    fn pinned_engines_are_never_victims_and_hold_their_place() {
        let limits = Limits { cap: 1, memory_budget: 0 };
        let pinned = Resident { pinned: true, ..r("a", false, 0, 30, 10) };
        let rs = [pinned.clone(), r("b", false, 0, 10, 10), r("c", false, 0, 0, 10)];
        assert_eq!(victims(&rs, Some(&"c"), &limits), vec!["b"], "the oldest, A, is pinned");
        assert!(victims(&rs, None, &limits).contains(&"c"));
        assert!(!victims(&rs, None, &limits).contains(&"a"));
        assert!(!can_start(std::slice::from_ref(&pinned), 10, &limits), "an idle pinned engine is not evictable room");
        assert!(can_start(&[pinned], 10, &Limits { cap: 2, memory_budget: 0 }));
    }

    #[test]
    fn idle_engines_make_room_busy_ones_do_not() {
        let limits = Limits { cap: 1, memory_budget: 0 };
        assert!(can_start::<&str>(&[], 10, &limits));
        assert!(can_start(&[r("a", false, 0, 5, 10)], 10, &limits), "idle A can be evicted after B is ready");
        assert!(!can_start(&[r("a", false, 2, 5, 10)], 10, &limits), "busy A is never evicted");
        assert!(!can_start(&[r("b", true, 0, 0, 10)], 10, &limits), "a start in progress holds the slot");
        let two = Limits { cap: 2, memory_budget: 0 };
        assert!(can_start(&[r("a", false, 1, 5, 10)], 10, &two));
    }

    #[test]
    fn memory_budget_counts_committed_engines() {
        let limits = Limits { cap: 4, memory_budget: 100 };
        assert!(can_start(&[r("a", false, 1, 1, 60)], 40, &limits));
        assert!(!can_start(&[r("a", false, 1, 1, 60)], 50, &limits));
        assert!(can_start::<&str>(&[], 500, &limits), "alone, anything may run");
        assert!(can_start(&[r("a", false, 0, 1, 60)], 50, &limits), "idle A will be evicted");
    }

    #[test]
    fn victims_are_lru_idle_and_never_the_new_one() {
        let limits = Limits { cap: 1, memory_budget: 0 };
        let rs = [r("a", false, 0, 30, 10), r("b", false, 0, 10, 10), r("c", false, 0, 0, 10)];
        assert_eq!(victims(&rs, Some(&"c"), &limits), vec!["a", "b"]);
        let rs = [r("a", false, 1, 30, 10), r("b", false, 0, 10, 10), r("c", false, 0, 0, 10)];
        assert_eq!(victims(&rs, Some(&"c"), &limits), vec!["b"], "busy A stays even if it is the oldest");
        let two = Limits { cap: 2, memory_budget: 0 };
        assert_eq!(victims(&rs, Some(&"c"), &two), vec!["b"]);
        let fits = [r("a", false, 0, 30, 10)];
        assert!(victims(&fits, None, &limits).is_empty());
        let mem = Limits { cap: 5, memory_budget: 25 };
        assert_eq!(victims(&rs, Some(&"c"), &mem), vec!["b"]);
    }

    #[test]
    fn nothing_is_evicted_for_an_engine_still_loading() {
        let limits = Limits { cap: 1, memory_budget: 0 };
        let loading = [r("a", false, 0, 30, 10), r("b", true, 0, 0, 10)];
        assert!(victims(&loading, None, &limits).is_empty(), "A serves until B is ready");
        let ready = [r("a", false, 0, 30, 10), r("b", false, 0, 0, 10)];
        assert_eq!(victims(&ready, Some(&"b"), &limits), vec!["a"]);
        let mem = Limits { cap: 4, memory_budget: 15 };
        assert!(victims(&loading, None, &mem).is_empty());
    }
}
