//! The driver's timing rules under paused tokio time, over a scripted `Procs`: engines
//! that load for a while, exit at start, ignore SIGTERM or hang in their drain. Every
//! assertion on time is exact (the clock only moves when everything waits), so these
//! check the deadlines themselves: keep-alive, the stop path's SIGKILL, backoff, the
//! crash-loop cooldown, the load timeout, and that shutdown stops engines concurrently.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::fake_procs::*;
use crate::stop::DRAIN_SLACK;

#[tokio::test(start_paused = true)]
async fn concurrent_leases_share_one_start() {
    let fake = Fake::new(&[("a", Behave { load: ms(500), ..Default::default() })]);
    let pool = Pool::with_procs(config(&["a"], |_| {}), fake.clone());
    let t0 = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let p = pool.clone();
        set.spawn(async move { p.lease(Some("a")).await.map(|l| l.pid) });
    }
    let pids: Vec<u32> = set.join_all().await.into_iter().map(Result::unwrap).collect();
    assert!(pids.iter().all(|&p| p == pids[0]));
    assert_eq!(t0.elapsed(), ms(500), "every lease waited exactly for the one load");
    assert_eq!(fake.count("start"), 1);
    assert_eq!(pool.counters().spawns.load(Ordering::Relaxed), 1);
}

#[tokio::test(start_paused = true)]
async fn keep_alive_stops_an_idle_engine_at_its_ttl() {
    let fake = Fake::new(&[("a", Behave::default())]);
    let pool = Pool::with_procs(config(&["a"], |c| c.keep_alive = Some(s(30))), fake.clone());
    let lease = pool.lease(Some("a")).await.unwrap();
    tokio::time::sleep(s(5)).await;
    drop(lease);
    tokio::time::sleep(s(29)).await;
    assert_eq!(state(&pool, "a"), "ready", "idle 29 s of 30");
    tokio::time::sleep(s(2)).await;
    settle().await;
    assert_eq!(fake.at("drain a"), Some(s(35)), "stopped 30 s after its last use");
    assert_eq!(fake.at("SIGTERM a"), Some(s(35)));
    assert_eq!(state(&pool, "a"), "stopped");
    assert_eq!(pool.counters().evictions.load(Ordering::Relaxed), 1);
}

#[tokio::test(start_paused = true)]
async fn keep_alive_kills_a_stopped_engine_at_the_stop_deadline() {
    // SIGSTOP-like: the drain never answers and SIGTERM does nothing.
    let stuck = Behave { ignore_term: true, hang_drain: true, ..Default::default() };
    let fake = Fake::new(&[("a", stuck)]);
    let pool = Pool::with_procs(
        config(&["a"], |c| {
            c.keep_alive = Some(s(10));
            c.drain_timeout = s(3);
            c.stop_timeout = s(4);
        }),
        fake.clone(),
    );
    drop(pool.lease(Some("a")).await.unwrap());
    tokio::time::sleep(s(60)).await;
    assert_eq!(fake.at("drain a"), Some(s(10)));
    assert_eq!(fake.at("SIGTERM a"), Some(s(10) + s(3) + DRAIN_SLACK));
    assert_eq!(fake.at("SIGKILL a"), Some(s(10) + s(3) + DRAIN_SLACK + s(4)));
    assert_eq!(state(&pool, "a"), "stopped");
}

#[tokio::test(start_paused = true)]
async fn eviction_waits_for_the_new_engine_then_kills_a_stuck_old_one_at_its_deadline() {
    let fake = Fake::new(&[
        ("a", Behave { ignore_term: true, hang_drain: true, ..Default::default() }),
        ("b", Behave { load: s(2), ..Default::default() }),
    ]);
    let pool = Pool::with_procs(config(&["a", "b"], |c| c.stop_timeout = s(1)), fake.clone());
    drop(pool.lease(Some("a")).await.unwrap());
    let b = pool.lease(Some("b")).await.unwrap();
    assert_eq!(fake.at("drain a"), Some(s(2)), "a served until b was ready");
    drop(b);
    tokio::time::sleep(s(60)).await;
    assert_eq!(fake.at("SIGKILL a"), Some(s(2) + s(10) + DRAIN_SLACK + s(1)));
    assert_eq!(state(&pool, "a"), "stopped");
    assert_eq!(state(&pool, "b"), "ready");
    assert_eq!(pool.counters().switches.load(Ordering::Relaxed), 1);
    assert_eq!(pool.counters().last_switch_ms.load(Ordering::Relaxed), 2000);
    let h = pool.counters().switch_seconds();
    assert_eq!((h.count, h.sum), (1, 2.0));
    assert_eq!(h.buckets().find(|(_, n)| *n == 1), Some((2.5, 1)), "in the (1 s, 2.5 s] bucket");
}

#[tokio::test(start_paused = true)]
async fn shutdown_drains_every_engine_at_once() {
    let slow = Behave { drain: s(3), ..Default::default() };
    let fake = Fake::new(&[("a", slow.clone()), ("b", slow.clone()), ("c", slow)]);
    let pool = Pool::with_procs(config(&["a", "b", "c"], |c| c.cap = 3), fake.clone());
    for m in ["a", "b", "c"] {
        drop(pool.lease(Some(m)).await.unwrap());
    }
    let t0 = Instant::now();
    pool.shutdown().await;
    assert_eq!(t0.elapsed(), s(3), "three 3 s drains take 3 s together, not 9");
    for m in ["a", "b", "c"] {
        assert_eq!(fake.at(&format!("drain {m}")), fake.at("drain a"));
        assert_eq!(state(&pool, m), "stopped");
    }
    assert!(matches!(pool.lease(Some("a")).await, Err(LeaseError::ShuttingDown)));
}

#[tokio::test(start_paused = true)]
async fn shutdown_kills_what_outlives_its_bound() {
    let fake = Fake::new(&[("a", Behave { ignore_term: true, hang_drain: true, ..Default::default() })]);
    let pool = Pool::with_procs(config(&["a"], |c| c.stop_timeout = s(2)), fake.clone());
    drop(pool.lease(Some("a")).await.unwrap());
    let t0 = Instant::now();
    pool.shutdown().await;
    assert_eq!(t0.elapsed(), s(10) + DRAIN_SLACK + s(2), "the stop path's own SIGKILL ends it");
    assert_eq!(fake.count("SIGKILL"), 1);
}

#[tokio::test(start_paused = true)]
async fn failed_starts_back_off_then_fail_fast_until_the_cooldown() {
    let fake = Fake::new(&[("a", Behave { exit_at_start: Some(1), ..Default::default() })]);
    let pool = Pool::with_procs(config(&["a"], |_| {}), fake.clone());
    let t0 = Instant::now();
    let mut errors = Vec::new();
    while !matches!(errors.last(), Some(LeaseError::CrashLoop { .. })) {
        errors.push(pool.lease(Some("a")).await.unwrap_err());
        assert!(errors.len() <= 4);
    }
    assert!(matches!(errors[0], LeaseError::StartFailed { .. }));
    assert_eq!(t0.elapsed(), ms(250 + 500 + 1000), "each retry waited out its backoff");
    assert_eq!(fake.count("start"), 4);
    let t1 = Instant::now();
    assert!(matches!(pool.lease(Some("a")).await, Err(LeaseError::CrashLoop { .. })));
    assert_eq!(t1.elapsed(), Duration::ZERO, "a failed model answers at once");
    assert_eq!(fake.count("start"), 4);
    tokio::time::sleep(crate::policy::FAILED_COOLDOWN).await;
    fake.behave.lock().unwrap().insert("a".into(), Behave::default());
    assert!(pool.lease(Some("a")).await.is_ok(), "tried again after the cooldown");
}

#[tokio::test(start_paused = true)]
async fn an_engine_that_never_gets_ready_is_killed_at_the_load_timeout() {
    let fake = Fake::new(&[("a", Behave { load: s(3600), ..Default::default() })]);
    let pool = Pool::with_procs(config(&["a"], |c| c.load_timeout = s(5)), fake.clone());
    let err = pool.lease(Some("a")).await.unwrap_err();
    assert!(matches!(err, LeaseError::LoadTimeout { .. }), "{err:?}");
    assert_eq!(fake.at("SIGKILL a"), Some(s(5)));
    settle().await;
    assert_eq!(state(&pool, "a"), "crashed");
}

#[tokio::test(start_paused = true)]
async fn a_hung_engine_is_recycled_and_its_successor_serves() {
    let fake = Fake::new(&[("a", Behave::default())]);
    let pool = Pool::with_procs(config(&["a"], |_| {}), fake.clone());
    let lease = pool.lease(Some("a")).await.unwrap();
    let (model, pid) = (lease.model.clone(), lease.pid);
    pool.recycle(&model, pid + 1);
    assert_eq!(fake.count("SIGKILL"), 0, "another process's failure");
    pool.recycle(&model, pid);
    drop(lease);
    let t0 = Instant::now();
    let next = pool.lease(Some("a")).await.unwrap();
    assert_ne!(next.pid, pid);
    assert_eq!(t0.elapsed(), ms(250), "a recycled engine is a crash: it backs off");
    assert_eq!(pool.snapshot().engines[0].restarts, 1);
}

#[tokio::test(start_paused = true)]
async fn a_retry_never_gets_the_engine_that_refused_it() {
    let fake = Fake::new(&[("a", Behave::default())]);
    let pool = Pool::with_procs(config(&["a"], |_| {}), fake.clone());
    let first = pool.lease(Some("a")).await.unwrap().pid;
    let p = pool.clone();
    let retry = tokio::spawn(async move { p.lease_avoiding(Some("a"), Some(first)).await.map(|l| l.pid) });
    tokio::time::sleep(ms(1500)).await;
    assert!(!retry.is_finished(), "the old engine is still ready but refused the connection");
    fake.exit(first, None, Some(9));
    let second = retry.await.unwrap().unwrap();
    assert_ne!(second, first);
    // An engine that refused but lives on is handed out again after the grace period
    // (the retry then fails on it instead of waiting for a successor).
    let t0 = Instant::now();
    assert_eq!(pool.lease_avoiding(Some("a"), Some(second)).await.unwrap().pid, second);
    assert_eq!(t0.elapsed(), AVOID_GRACE);
}

#[tokio::test(start_paused = true)]
async fn busy_engines_hold_their_slot_until_the_queue_timeout() {
    let fake = Fake::new(&[("a", Behave::default()), ("b", Behave::default())]);
    let pool = Pool::with_procs(config(&["a", "b"], |c| c.load_timeout = s(1)), fake.clone());
    let busy = pool.lease(Some("a")).await.unwrap();
    let t0 = Instant::now();
    assert!(matches!(pool.lease(Some("b")).await, Err(LeaseError::Overloaded)));
    assert_eq!(t0.elapsed(), s(60));
    assert_eq!(fake.count("start b"), 0);
    drop(busy);
    assert!(pool.lease(Some("b")).await.is_ok());
    settle().await;
    assert_eq!(state(&pool, "a"), "stopped", "evicted once b was ready");
}

#[tokio::test(start_paused = true)]
async fn load_starts_a_named_engine_and_evicts_the_idle_one_once_it_is_ready() {
    let fake = Fake::new(&[("a", Behave::default()), ("b", Behave { load: s(2), ..Default::default() })]);
    let pool = Pool::with_procs(config(&["a", "b"], |_| {}), fake.clone());
    pool.load("a").await.unwrap();
    assert_eq!(state(&pool, "a"), "ready");
    let t0 = Instant::now();
    pool.load("b").await.unwrap();
    assert_eq!(t0.elapsed(), s(2), "returns once b is ready");
    assert_eq!(fake.at("drain a"), Some(s(2)), "a served until b was ready");
    settle().await;
    assert_eq!(state(&pool, "a"), "stopped");
    pool.load("b").await.unwrap();
    assert_eq!(fake.count("start b"), 1, "loading a ready model starts nothing");
    let err = pool.load("c").await.unwrap_err();
    assert!(matches!(err, LeaseError::UnknownModel { .. }), "{err:?}");
}

#[tokio::test(start_paused = true)]
async fn unload_drains_the_engine_and_returns_once_it_is_gone() {
    let fake = Fake::new(&[("a", Behave { drain: s(1), ..Default::default() })]);
    // One model: a request for an unknown id would go to it, an unload never does.
    let pool = Pool::with_procs(config(&["a"], |_| {}), fake.clone());
    assert!(matches!(pool.unload("b").await, Err(LeaseError::UnknownModel { .. })));
    assert_eq!(pool.unload("a").await.unwrap(), EngineState::Stopped, "nothing runs: nothing to do");
    pool.load("a").await.unwrap();
    let t0 = Instant::now();
    assert_eq!(pool.unload("a").await.unwrap(), EngineState::Stopped);
    assert_eq!(t0.elapsed(), s(1), "the drain, then SIGTERM");
    assert_eq!(fake.at("SIGTERM a"), Some(s(1)));
    assert_eq!(pool.counters().evictions.load(Ordering::Relaxed), 0, "not an eviction");
    assert!(pool.lease(Some("a")).await.is_ok(), "a request starts it again");
    assert_eq!(fake.count("start a"), 2);
}

#[tokio::test(start_paused = true)]
async fn unload_clears_a_crash_loop_so_a_load_tries_again_at_once() {
    let fake = Fake::new(&[("a", Behave { exit_at_start: Some(1), ..Default::default() })]);
    let pool = Pool::with_procs(config(&["a"], |_| {}), fake.clone());
    while !matches!(pool.lease(Some("a")).await, Err(LeaseError::CrashLoop { .. })) {}
    assert_eq!(state(&pool, "a"), "failed");
    assert_eq!(pool.unload("a").await.unwrap(), EngineState::Stopped);
    fake.behave.lock().unwrap().insert("a".into(), Behave::default());
    let t0 = Instant::now();
    pool.load("a").await.unwrap();
    assert_eq!(t0.elapsed(), Duration::ZERO, "no cooldown left");
}

#[tokio::test(start_paused = true)]
async fn reconfigure_adds_and_drops_models_and_drains_a_dropped_engine() {
    let fake = Fake::new(&[("a", Behave::default()), ("b", Behave::default()), ("c", Behave::default())]);
    let pool = Pool::with_procs(config(&["a", "b"], |c| c.cap = 2), fake.clone());
    let lease = pool.lease(Some("a")).await.unwrap();
    let new = config(&["b", "c"], |_| {}).models;
    let mut settings = std::collections::BTreeMap::new();
    let alias = crate::ModelSettings { aliases: vec!["fast".into()], ..Default::default() };
    settings.insert(ModelId::new("c").unwrap(), alias);
    let changes = pool.reconfigure(new, settings, EngineOptions::default());
    assert_eq!((changes.added, changes.removed), (vec!["c".to_owned()], vec!["a".to_owned()]));
    assert!(pool.route(Some("a")).is_err(), "a dropped model is no longer routed");
    assert_eq!(pool.route(Some("fast")).unwrap().as_str(), "c", "aliases route");
    assert_eq!(pool.models().data.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), ["b", "c"]);
    drop(lease);
    tokio::time::sleep(s(1)).await;
    settle().await;
    // The one stop path: the engine drains (finishing what it serves), then SIGTERM.
    let (drain, term) = (fake.at("drain a"), fake.at("SIGTERM a"));
    assert!(drain.is_some() && drain <= term, "{drain:?} {term:?}");
    assert!(pool.snapshot().engines.iter().all(|e| e.model != "a"), "the stopped model is forgotten");
}
