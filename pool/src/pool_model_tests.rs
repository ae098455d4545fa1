//! Model-based test of the pool (fault catalogue row 34): random sequences of leases
//! (held for a random time), engine crashes, unloads and clock ticks, over the scripted
//! process table under paused tokio time, then a shutdown. After every sequence:
//!
//! - no state change the transition table forbids happened (the slot's debug assertion
//!   panics inside the pool's tasks; a panic hook catches it there);
//! - no engine was stopped for an eviction or a keep-alive while a lease on it was held
//!   (every drain outside an unload or the shutdown found its engine idle);
//! - every lease request was answered (granted or refused) within a bound, and every
//!   granted lease was released (no engine reports requests in flight at the end);
//! - once nothing is held and the clock has run on, at most `cap` engines are resident;
//! - after the shutdown no process is left and every model is stopped.
//!
//! `CORRAL_POOL_MODEL_RUNS` sets the number of sequences (default 1,000, 40 steps each);
//! a failure names its seed, and `CORRAL_POOL_MODEL_SEED=<seed>` replays that one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use tokio::time::Instant;

use crate::fake_procs::*;
use crate::pool::Pool;

static BAD_TRANSITION: AtomicBool = AtomicBool::new(false);

/// Record a forbidden transition wherever it panics (a task of the pool's own).
fn watch_for_bad_transitions() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.to_string().contains("bad transition") {
                BAD_TRANSITION.store(true, Ordering::SeqCst);
            }
            previous(info);
        }));
    });
}

/// xorshift64*: small, seeded, reproducible.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

const MODELS: [&str; 3] = ["a", "b", "c"];

/// A lease that was held: model, pid, from, until (times since the run began).
type Held = (String, u32, Duration, Duration);

async fn run(seed: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let behave: Vec<(&str, Behave)> = MODELS
        .iter()
        .map(|m| (*m, Behave { load: ms(rng.below(3000)), ignore_term: rng.below(4) == 0, ..Default::default() }))
        .collect();
    let fake = Fake::new(&behave);
    let cap = 1 + rng.below(2) as usize;
    let keep_alive = (rng.below(2) == 0).then(|| s(5 + rng.below(30)));
    let cfg = config(&MODELS, |c| {
        c.cap = cap;
        c.keep_alive = keep_alive;
        c.queue_timeout = s(5);
        c.load_timeout = s(10);
        c.drain_timeout = s(1);
        c.stop_timeout = s(1);
    });
    let pool = Pool::with_procs(cfg, fake.clone());
    let t0 = Instant::now();
    let held: Arc<Mutex<Vec<Held>>> = Arc::default();
    let mut tasks = tokio::task::JoinSet::new();
    let mut unloads: Vec<(&str, Duration)> = Vec::new();
    let why = format!("seed {seed} (cap {cap}, keep-alive {keep_alive:?})");
    for _ in 0..40 {
        match rng.below(10) {
            0..=4 => {
                let (p, held, m) = (pool.clone(), held.clone(), MODELS[rng.below(3) as usize].to_owned());
                let hold = ms(rng.below(4000));
                tasks.spawn(async move {
                    // Every wait in the pool has a deadline: 2 min covers load + queue + backoff.
                    let lease = tokio::time::timeout(s(120), p.lease(Some(&m))).await.map_err(|_| m.clone())?;
                    if let Ok(lease) = lease {
                        let from = t0.elapsed();
                        tokio::time::sleep(hold).await;
                        held.lock().unwrap().push((m, lease.pid, from, t0.elapsed()));
                        drop(lease);
                    }
                    Ok::<(), String>(())
                });
            }
            5 => {
                let mut live: Vec<u32> = fake.live.lock().unwrap().keys().copied().collect();
                live.sort_unstable();
                if let Some(&pid) = live.get(rng.below(live.len() as u64 + 1) as usize) {
                    fake.exit(pid, None, Some(9));
                }
            }
            6 => {
                let (p, m) = (pool.clone(), MODELS[rng.below(3) as usize]);
                unloads.push((m, t0.elapsed()));
                tasks.spawn(async move {
                    let _ = tokio::time::timeout(s(120), p.unload(m)).await.map_err(|_| format!("unload {m}"))?;
                    Ok(())
                });
            }
            _ => tokio::time::sleep(ms(rng.below(5000))).await,
        }
        settle().await;
    }
    while let Some(r) = tasks.join_next().await {
        if let Err(m) = r.expect("a lease task panicked") {
            panic!("{why}: a request for {m} was never answered");
        }
    }
    let quiet_from = t0.elapsed();
    tokio::time::sleep(s(60)).await;
    settle().await;
    let snap = pool.snapshot();
    assert!(snap.engines.iter().all(|e| e.in_flight == 0), "{why}: a lease was never released: {snap:?}");
    assert!(snap.pool.resident.len() <= cap, "{why}: {} resident over cap {cap}", snap.pool.resident.len());
    let shutdown_at = t0.elapsed();
    tokio::time::timeout(s(300), pool.shutdown()).await.unwrap_or_else(|_| panic!("{why}: shutdown hung"));
    settle().await;
    assert!(fake.live.lock().unwrap().is_empty(), "{why}: processes left after shutdown");
    assert!(pool.snapshot().engines.iter().all(|e| e.state == "stopped"), "{why}: {:?}", pool.snapshot());
    // Drains outside unloads and the shutdown are evictions or keep-alives: the process
    // held no lease at that moment (a release at the same instant is not "held").
    let drains = fake.drains.lock().unwrap().clone();
    let held = held.lock().unwrap().clone();
    for (at, model, pid) in &drains {
        // An unload drains its engine once it exists (at most a load timeout later).
        let unloaded = unloads.iter().any(|(m, u)| m == model && *u <= *at && *at <= *u + s(10));
        if *at >= shutdown_at || unloaded {
            continue;
        }
        let busy = held.iter().any(|(_, p, from, until)| p == pid && *from < *at && *at < *until);
        assert!(
            !busy,
            "{why}: {model} (pid {pid}) was drained for an eviction at {at:?} while a lease on it was held\n{:?}\n{held:?}\n{unloads:?}",
            fake.log.lock().unwrap()
        );
    }
    assert!(quiet_from <= shutdown_at);
}

#[tokio::test(start_paused = true)]
async fn random_operation_sequences_keep_the_pool_invariants() {
    watch_for_bad_transitions();
    let runs: u64 = std::env::var("CORRAL_POOL_MODEL_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    // `CORRAL_POOL_MODEL_SEED` replays one sequence.
    let seeds = match std::env::var("CORRAL_POOL_MODEL_SEED").ok().and_then(|v| v.parse().ok()) {
        Some(one) => one..one + 1,
        None => 0..runs,
    };
    for seed in seeds {
        run(seed).await;
        assert!(!BAD_TRANSITION.load(Ordering::SeqCst), "seed {seed}: a forbidden state change happened");
    }
}
