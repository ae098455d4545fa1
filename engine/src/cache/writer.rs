//! The background writer: one thread that moves prompt-cache entries to the SSD tier.
//!
//! It writes (a) entries pushed out of RAM by the byte cap, (b) entries idle past the
//! demote time (which then leave RAM), and (c) a debounced write-behind of new entries
//! once the engine has been idle for a moment, so a crashed engine's recent work is on
//! disk. It never starts a file while a request runs and pauses between 1 MiB chunks
//! the moment one arrives, so an active decode never shares the machine with it.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::PromptCache;
use crate::kv::SeqCache;

pub struct Spill {
    pub tokens: Arc<[u32]>,
    pub kv: SeqCache,
}

const TICK: Duration = Duration::from_millis(200);

pub fn start(cache: &Arc<PromptCache>) {
    let (tx, rx) = mpsc::channel();
    *cache.spill_tx.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
    let weak = Arc::downgrade(cache);
    let spawned = std::thread::Builder::new().name("cache-writer".into()).spawn(move || run(weak, rx));
    if let Err(e) = spawned {
        tracing::error!(error = %e, "could not start the prompt-cache writer; entries stay in RAM only");
    }
}

fn wait_idle(cache: &PromptCache) {
    while cache.is_busy() {
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn run(weak: Weak<PromptCache>, rx: mpsc::Receiver<Spill>) {
    let mut pending: Vec<Spill> = Vec::new();
    loop {
        match rx.recv_timeout(TICK) {
            Ok(s) => pending.push(s),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        pending.extend(rx.try_iter());
        let Some(cache) = weak.upgrade() else { return };
        let Some(ssd) = cache.ssd() else { return };
        let mut pause = || wait_idle(&cache);
        for s in pending.drain(..) {
            wait_idle(&cache);
            if ssd.write(&s.tokens, &s.kv, &mut pause) {
                ssd.counters.demotions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        if cache.is_busy() {
            continue;
        }
        let idle_since = Instant::now().checked_sub(cache.cfg.demote_idle);
        if let Some(before) = idle_since {
            let idle = cache.ram().take_idle(before);
            for e in idle {
                wait_idle(&cache);
                if e.durable || ssd.write(&e.tokens, &e.kv, &mut pause) {
                    ssd.counters.demotions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        if cache.idle_for() >= cache.cfg.write_behind_after {
            let todo = cache.ram().not_durable();
            for (id, tokens, kv) in todo {
                if cache.is_busy() {
                    break;
                }
                if ssd.write(&tokens, &kv, &mut pause) {
                    cache.ram().mark_durable(id);
                }
            }
        }
    }
}
