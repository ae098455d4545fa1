//! The background writer: one thread that moves prompt-cache entries to the SSD tier.
//!
//! It writes (a) entries pushed out of RAM by the byte cap (the spill queue, bounded in
//! bytes by `--ssd-spill-queue`: over it the oldest waiting entry is dropped and counted,
//! which costs a later miss, never a wrong answer), (b) entries idle past
//! `--ssd-demote-idle` (which then leave RAM; 0 turns this off), and (c) unless
//! write-behind is off, a debounced write-behind of new entries once the engine has been
//! idle for a moment, so a crashed engine's recent work is on disk.
//!
//! It never starts a file while a request runs and pauses between 1 MiB chunks the moment
//! one arrives. It never polls: it sleeps on a condition variable until a spill is
//! queued, the engine goes idle, or the next idle demotion or write-behind is due.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use super::PromptCache;
use crate::kv::SeqCache;

pub struct Spill {
    pub tokens: Arc<[u32]>,
    pub kv: SeqCache,
}

impl Spill {
    fn bytes(&self) -> u64 {
        self.kv.bytes() as u64
    }
}

/// What the request path and the writer thread share.
pub struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    cap_bytes: u64,
}

struct State {
    queue: VecDeque<Spill>,
    bytes: u64,
    dropped: u64,
    /// A request is queued or running.
    busy: bool,
    last_activity: Instant,
    /// Bumped on every change the writer may care about.
    epoch: u64,
    closed: bool,
}

/// Queue figures for `/admin/stats`.
pub struct QueueStats {
    pub pending: usize,
    pub pending_bytes: u64,
    pub dropped: u64,
}

impl Shared {
    pub fn new(cap_bytes: u64) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                bytes: 0,
                dropped: 0,
                busy: false,
                last_activity: Instant::now(),
                epoch: 0,
                closed: false,
            }),
            changed: Condvar::new(),
            cap_bytes,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn touch(&self, f: impl FnOnce(&mut State)) {
        let mut st = self.lock();
        f(&mut st);
        st.epoch += 1;
        drop(st);
        self.changed.notify_all();
    }

    /// Queue entries pushed out of RAM; over the byte cap the oldest queued ones go.
    pub fn push(&self, spills: impl IntoIterator<Item = Spill>) {
        self.touch(|st| {
            for s in spills {
                st.bytes += s.bytes();
                st.queue.push_back(s);
            }
            while st.bytes > self.cap_bytes {
                let Some(old) = st.queue.pop_front() else { break };
                st.bytes -= old.bytes();
                st.dropped += 1;
                tracing::warn!(tokens = old.tokens.len(), "spill queue over its cap: dropping the oldest entry");
            }
        });
    }

    pub fn set_busy(&self, busy: bool) {
        self.touch(|st| {
            st.busy = busy;
            st.last_activity = Instant::now();
        });
    }

    pub fn is_busy(&self) -> bool {
        self.lock().busy
    }

    pub fn idle_since(&self) -> Instant {
        self.lock().last_activity
    }

    pub fn stats(&self) -> QueueStats {
        let st = self.lock();
        QueueStats { pending: st.queue.len(), pending_bytes: st.bytes, dropped: st.dropped }
    }

    pub fn close(&self) {
        self.touch(|st| st.closed = true);
    }

    /// Block while a request runs (between chunks of a file being written).
    fn wait_idle(&self) {
        let st = self.lock();
        let _st = self.changed.wait_while(st, |st| st.busy && !st.closed).unwrap_or_else(|e| e.into_inner());
    }

    /// The next queued spill, once no request runs; `None` when the queue is empty.
    fn next_spill(&self) -> Option<Spill> {
        let st = self.lock();
        let mut st = self
            .changed
            .wait_while(st, |st| st.busy && !st.closed && !st.queue.is_empty())
            .unwrap_or_else(|e| e.into_inner());
        if st.closed {
            return None;
        }
        let s = st.queue.pop_front()?;
        st.bytes -= s.bytes();
        Some(s)
    }

    /// Sleep until something changes or `until` (if any) passes. Returns false once
    /// closed.
    fn sleep(&self, until: Option<Instant>) -> bool {
        let st = self.lock();
        let seen = st.epoch;
        let keep = |st: &mut State| !st.closed && st.epoch == seen;
        let st = match until {
            Some(t) => {
                let wait = t.saturating_duration_since(Instant::now());
                self.changed.wait_timeout_while(st, wait, keep).unwrap_or_else(|e| e.into_inner()).0
            }
            None => self.changed.wait_while(st, keep).unwrap_or_else(|e| e.into_inner()),
        };
        !st.closed
    }
}

pub fn start(cache: &Arc<PromptCache>) {
    let weak = Arc::downgrade(cache);
    let shared = cache.writer.clone();
    let spawned = std::thread::Builder::new().name("cache-writer".into()).spawn(move || run(weak, shared));
    if let Err(e) = spawned {
        tracing::error!(error = %e, "could not start the prompt-cache writer; entries stay in RAM only");
    }
}

fn run(weak: Weak<PromptCache>, shared: Arc<Shared>) {
    loop {
        let Some(cache) = weak.upgrade() else { return };
        let Some(ssd) = cache.ssd() else { return };
        let mut pause = || shared.wait_idle();
        if let Some(s) = shared.next_spill() {
            if ssd.write(&s.tokens, &s.kv, &mut pause) {
                ssd.counters.demotions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            continue;
        }
        let now = Instant::now();
        let (busy, idle_since) = (shared.is_busy(), shared.idle_since());
        let demote_due = cache.cfg.demote_idle.and_then(|t| Some(cache.ram().oldest_use()? + t));
        // Strictly after: an entry used exactly `t` ago is not yet idle (`take_idle` is strict).
        let demote_now = demote_due.is_some_and(|d| d < now);
        let write_behind_due = (cache.cfg.write_behind && cache.ram().any_not_durable())
            .then(|| idle_since + cache.cfg.write_behind_after);
        if !busy
            && demote_now
            && let Some(t) = cache.cfg.demote_idle
        {
            let before = now.checked_sub(t).unwrap_or(now);
            let idle = cache.ram().take_idle(before);
            for e in idle {
                shared.wait_idle();
                if e.durable || ssd.write(&e.tokens, &e.kv, &mut pause) {
                    ssd.counters.demotions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            continue;
        }
        if !busy && write_behind_due.is_some_and(|d| d <= now) {
            let todo = cache.ram().not_durable();
            for (id, tokens, kv) in todo {
                if shared.is_busy() {
                    break;
                }
                if ssd.write(&tokens, &kv, &mut pause) {
                    cache.ram().mark_durable(id);
                }
            }
            // Entries a failing disk could not take stay not-durable; do not spin on them.
            if cache.ram().any_not_durable() && !shared.sleep(Some(Instant::now() + Duration::from_secs(5))) {
                return;
            }
            continue;
        }
        // Nothing due now: sleep until the earliest due time or a change.
        let next = if busy { None } else { [demote_due, write_behind_due].into_iter().flatten().min() };
        drop(cache);
        if !shared.sleep(next) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvShape;

    fn spill(n: usize) -> Spill {
        let shape = KvShape { n_layers: 1, kv_dim: 2 };
        let kv = SeqCache::from_runs::<()>(shape, n, |_, _, _, dst| {
            dst.fill(half::f16::ONE);
            Ok(())
        })
        .unwrap();
        Spill { tokens: (0..n as u32).collect::<Vec<_>>().into(), kv }
    }

    #[test]
    fn the_queue_is_bounded_in_bytes_dropping_the_oldest() {
        let one = spill(1).bytes();
        let q = Shared::new(2 * one);
        q.push([spill(1), spill(1)]);
        assert_eq!((q.stats().pending, q.stats().dropped), (2, 0));
        q.push([spill(1)]);
        let s = q.stats();
        assert_eq!((s.pending, s.pending_bytes, s.dropped), (2, 2 * one, 1));
        let off = Shared::new(0);
        off.push([spill(1)]);
        assert_eq!((off.stats().pending, off.stats().dropped), (0, 1), "a zero cap queues nothing");
    }

    #[test]
    fn spills_wait_while_a_request_runs_and_sleep_wakes_on_change() {
        let q = Shared::new(u64::MAX);
        q.set_busy(true);
        q.push([spill(1)]);
        let q2 = q.clone();
        let t = std::thread::spawn(move || q2.next_spill().is_some());
        std::thread::sleep(Duration::from_millis(50));
        assert!(!t.is_finished(), "no disk work while busy");
        q.set_busy(false);
        assert!(t.join().unwrap());
        assert!(q.next_spill().is_none());
        let q2 = q.clone();
        let t0 = Instant::now();
        let t = std::thread::spawn(move || q2.sleep(Some(Instant::now() + Duration::from_secs(60))));
        std::thread::sleep(Duration::from_millis(20));
        q.close();
        assert!(!t.join().unwrap(), "closed");
        assert!(t0.elapsed() < Duration::from_secs(30), "woken by the change, not the timeout");
    }
}
