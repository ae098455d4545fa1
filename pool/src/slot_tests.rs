//! The slot machine row by row: every (phase, event) pair that does something, the ones
//! that must do nothing, the exit classification and the timing rules — with plain
//! `Instant`s, no processes, no runtime.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::*;
use crate::policy::{FAILED_COOLDOWN, HEALTHY_AFTER};

fn proc(pid: u32) -> Proc {
    Proc { pid, socket: PathBuf::from(format!("/run/e-{pid}.sock")) }
}

fn exit(code: Option<i32>, signal: Option<i32>) -> Exit {
    Exit { code, signal, line: "last words".into() }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A slot in `Starting` with its process spawned (generation 1, pid 10).
fn starting(t0: Instant) -> Slot {
    let mut s = Slot::new("m", t0);
    s.on(Event::Start { switch_from: None }, t0);
    s.on(Event::Spawned { generation: 1, proc: proc(10) }, t0);
    s
}

fn ready(t0: Instant) -> Slot {
    let mut s = starting(t0);
    s.on(Event::Ready { generation: 1 }, t0);
    s
}

fn stop(why: StopReason) -> Event {
    Event::Stop { why, pid: None }
}

fn crashed_at(s: &Slot) -> Instant {
    match &s.phase {
        Phase::Crashed { retry_at, .. } => *retry_at,
        p => panic!("not crashed: {p:?}"),
    }
}

// --- Stopped ---

#[test]
fn stopped_start_spawns_generation_one() {
    let t0 = Instant::now();
    let mut s = Slot::new("m", t0);
    let fx = s.on(Event::Start { switch_from: Some(t0) }, t0);
    assert_eq!(fx, vec![Effect::Spawn { generation: 1 }, Effect::Count(Counter::Spawn)]);
    assert_eq!(s.phase, Phase::Starting { generation: 1, proc: None, switch_from: Some(t0) });
    assert_eq!(s.admit(t0, None), Admit::Wait { until: None, starting: Some(1) });
}

#[test]
fn stopped_ignores_process_events_and_shutdown() {
    let t0 = Instant::now();
    let mut s = Slot::new("m", t0);
    assert!(s.on(Event::Spawned { generation: 1, proc: proc(1) }, t0).is_empty());
    assert!(s.on(Event::Ready { generation: 1 }, t0).is_empty());
    assert!(s.on(Event::Exited { generation: 1, exit: exit(Some(0), None) }, t0).is_empty());
    assert!(s.on(stop(StopReason::Shutdown), t0).is_empty());
    assert_eq!(s.phase, Phase::Stopped);
    assert_eq!(s.admit(t0, None), Admit::Start);
}

// --- Starting ---

#[test]
fn starting_records_its_process_once_and_never_starts_twice() {
    let t0 = Instant::now();
    let mut s = Slot::new("m", t0);
    s.on(Event::Start { switch_from: None }, t0);
    assert!(s.on(Event::Start { switch_from: None }, t0).is_empty(), "single flight");
    assert!(s.on(Event::Spawned { generation: 7, proc: proc(1) }, t0).is_empty(), "stale generation");
    assert_eq!(s.proc(), None);
    assert!(s.on(Event::Spawned { generation: 1, proc: proc(10) }, t0).is_empty());
    assert_eq!(s.proc(), Some(&proc(10)));
}

#[test]
fn starting_ready_serves_wakes_waiters_evicts_others_and_times_the_switch() {
    let t0 = Instant::now();
    let mut s = Slot::new("m", t0);
    s.on(Event::Start { switch_from: Some(t0) }, t0);
    s.on(Event::Spawned { generation: 1, proc: proc(10) }, t0);
    assert!(s.on(Event::Ready { generation: 2 }, t0).is_empty(), "stale generation");
    let fx = s.on(Event::Ready { generation: 1 }, t0 + ms(400));
    assert_eq!(fx, vec![Effect::Wake, Effect::Evict { keep_self: true }, Effect::Switched(ms(400))]);
    assert_eq!(s.admit(t0, None), Admit::Grant { generation: 1, proc: proc(10) });
}

#[test]
fn starting_ignores_evictions_keep_alive_and_hangs() {
    let t0 = Instant::now();
    let mut s = starting(t0);
    for why in [StopReason::Evict, StopReason::KeepAlive, StopReason::Hung] {
        assert!(s.on(Event::Stop { why, pid: Some(10) }, t0).is_empty(), "{why:?}");
    }
    assert_eq!(s.state(), EngineState::Starting);
}

#[test]
fn starting_load_timeout_kills_and_answers_the_waiters() {
    let t0 = Instant::now();
    let mut s = starting(t0);
    let fx = s.on(stop(StopReason::LoadTimeout), t0 + ms(100));
    assert_eq!(fx, vec![Effect::Stop { generation: 1, proc: proc(10), how: StopHow::Kill }]);
    assert_eq!(s.state(), EngineState::Draining);
    let fx = s.on(Event::Exited { generation: 1, exit: exit(None, Some(9)) }, t0 + ms(110));
    assert_eq!(fx[0], Effect::RemoveSocket(proc(10).socket));
    assert!(fx.contains(&Effect::Count(Counter::Crash)));
    assert_eq!(s.admit(t0 + ms(110), Some(1)), Admit::Refuse(LeaseError::LoadTimeout { model: "m".into() }));
}

#[test]
fn starting_shutdown_before_the_spawn_stops_the_process_once_it_exists() {
    let t0 = Instant::now();
    let mut s = Slot::new("m", t0);
    s.on(Event::Start { switch_from: None }, t0);
    assert!(s.on(stop(StopReason::Shutdown), t0).is_empty(), "nothing to stop yet");
    assert_eq!(s.state(), EngineState::Draining);
    let fx = s.on(Event::Spawned { generation: 1, proc: proc(10) }, t0);
    assert_eq!(fx, vec![Effect::Stop { generation: 1, proc: proc(10), how: StopHow::Graceful }]);
    let fx = s.on(Event::Exited { generation: 1, exit: exit(Some(0), None) }, t0);
    assert_eq!(fx, vec![Effect::RemoveSocket(proc(10).socket), Effect::Wake]);
    assert_eq!(s.phase, Phase::Stopped);
}

#[test]
fn starting_shutdown_after_the_spawn_stops_gracefully() {
    let t0 = Instant::now();
    let mut s = starting(t0);
    let fx = s.on(stop(StopReason::Shutdown), t0);
    assert_eq!(fx, vec![Effect::Stop { generation: 1, proc: proc(10), how: StopHow::Graceful }]);
}

#[test]
fn starting_exit_is_a_failed_start_with_backoff() {
    let t0 = Instant::now();
    let mut s = starting(t0);
    let fx = s.on(Event::Exited { generation: 1, exit: exit(Some(3), None) }, t0);
    assert_eq!(fx, vec![Effect::RemoveSocket(proc(10).socket), Effect::Wake, Effect::Count(Counter::Crash)]);
    assert_eq!(crashed_at(&s), t0 + ms(250));
    let err = LeaseError::StartFailed { model: "m".into(), how: "exit code 3".into(), line: "last words".into() };
    assert_eq!(s.admit(t0, Some(1)), Admit::Refuse(err), "requests that waited on the start get its error");
    assert_eq!(s.admit(t0, None), Admit::Wait { until: Some(t0 + ms(250)), starting: None });
    assert_eq!(s.admit(t0 + ms(250), None), Admit::Start);
}

#[test]
fn spawn_failure_is_an_exit_without_a_process() {
    let t0 = Instant::now();
    let mut s = Slot::new("m", t0);
    s.on(Event::Start { switch_from: None }, t0);
    let fx = s.on(Event::Exited { generation: 1, exit: exit(None, None) }, t0);
    assert_eq!(fx, vec![Effect::Wake, Effect::Count(Counter::Crash)], "no socket to remove");
    assert_eq!(s.state(), EngineState::Crashed);
}

#[test]
fn config_exit_codes_fail_at_once_without_retry() {
    for code in [78, 2] {
        let t0 = Instant::now();
        let mut s = starting(t0);
        s.on(Event::Exited { generation: 1, exit: exit(Some(code), None) }, t0);
        let err = LeaseError::Config { model: "m".into(), line: "last words".into() };
        assert_eq!(s.phase, Phase::Failed { until: t0 + FAILED_COOLDOWN, error: err.clone() });
        assert_eq!(s.admit(t0 + ms(59_000), None), Admit::Refuse(err));
        assert!(s.on(Event::Start { switch_from: None }, t0 + ms(59_000)).is_empty(), "no start in the cooldown");
    }
}

// --- Ready ---

#[test]
fn ready_leases_and_releases() {
    let t0 = Instant::now();
    let mut s = ready(t0);
    let g = s.live_generation().unwrap();
    assert!(s.on(Event::Leased { generation: g }, t0 + ms(5)).is_empty());
    assert_eq!((s.in_flight(), s.last_used()), (1, t0 + ms(5)));
    assert_eq!(s.keep_alive_due(ms(1000)), None, "busy engines never expire");
    let fx = s.on(Event::Released { generation: g }, t0 + ms(9));
    assert_eq!(fx, vec![Effect::Wake, Effect::Evict { keep_self: false }]);
    assert_eq!(s.keep_alive_due(ms(1000)), Some(t0 + ms(1009)));
    assert!(s.on(Event::Start { switch_from: None }, t0).is_empty());
}

#[test]
fn a_lease_on_a_process_that_exited_does_not_count_against_its_successor() {
    let t0 = Instant::now();
    let mut s = ready(t0);
    let old = s.live_generation().unwrap();
    s.on(Event::Leased { generation: old }, t0);
    // The process dies with the lease still held (a client still reading its cut stream).
    s.on(Event::Exited { generation: old, exit: exit(None, Some(9)) }, t0 + ms(1));
    assert_eq!(s.in_flight(), 0);
    s.on(Event::Start { switch_from: None }, t0 + ms(1000));
    let new = s.live_generation().unwrap();
    s.on(Event::Spawned { generation: new, proc: proc(2) }, t0 + ms(1000));
    s.on(Event::Ready { generation: new }, t0 + ms(2000));
    s.on(Event::Leased { generation: new }, t0 + ms(2000));
    // The old lease ends now: the new engine is still busy.
    assert_eq!(s.on(Event::Released { generation: old }, t0 + ms(3000)), vec![Effect::Wake]);
    assert_eq!(s.in_flight(), 1);
    assert_eq!(s.keep_alive_due(ms(1)), None);
    s.on(Event::Released { generation: new }, t0 + ms(4000));
    assert_eq!(s.in_flight(), 0);
}

#[test]
fn a_lease_is_counted_only_on_the_ready_process() {
    let t0 = Instant::now();
    let mut s = starting(t0);
    assert!(s.on(Event::Leased { generation: 1 }, t0).is_empty());
    assert_eq!(s.in_flight(), 0, "not ready: nothing to lease");
    let mut r = ready(t0);
    r.on(Event::Leased { generation: 7 }, t0 + ms(1));
    assert_eq!((r.in_flight(), r.last_used()), (0, t0), "another generation");
    assert_eq!(r.state(), EngineState::Ready, "leases never change the phase");
}

#[test]
fn ready_evict_and_keep_alive_drain_gracefully_and_count() {
    for why in [StopReason::Evict, StopReason::KeepAlive] {
        let t0 = Instant::now();
        let mut s = ready(t0);
        let fx = s.on(stop(why), t0);
        assert_eq!(
            fx,
            vec![
                Effect::Stop { generation: 1, proc: proc(10), how: StopHow::Graceful },
                Effect::Count(Counter::Eviction)
            ]
        );
        assert_eq!(s.admit(t0, None), Admit::Wait { until: None, starting: None }, "{why:?}");
    }
}

#[test]
fn ready_shutdown_drains_without_counting_an_eviction() {
    let t0 = Instant::now();
    let mut s = ready(t0);
    assert_eq!(
        s.on(stop(StopReason::Shutdown), t0),
        vec![Effect::Stop { generation: 1, proc: proc(10), how: StopHow::Graceful }]
    );
}

#[test]
fn ready_hung_is_killed_only_for_the_process_the_proxy_saw() {
    let t0 = Instant::now();
    let mut s = ready(t0);
    assert!(s.on(Event::Stop { why: StopReason::Hung, pid: Some(99) }, t0).is_empty(), "an older engine's pid");
    assert!(s.on(stop(StopReason::LoadTimeout), t0).is_empty(), "a ready engine did load");
    let fx = s.on(Event::Stop { why: StopReason::Hung, pid: Some(10) }, t0);
    assert_eq!(fx, vec![Effect::Stop { generation: 1, proc: proc(10), how: StopHow::Kill }]);
    // Its exit is a crash (counted, backoff), not a clean stop.
    let fx = s.on(Event::Exited { generation: 1, exit: exit(None, Some(9)) }, t0);
    assert!(fx.contains(&Effect::Count(Counter::Crash)));
    assert_eq!(crashed_at(&s), t0 + ms(250));
    assert_eq!(s.admit(t0 + ms(250), Some(1)), Admit::Start, "no start error: it had started");
}

#[test]
fn ready_exit_is_a_crash_with_backoff_and_no_start_error() {
    let t0 = Instant::now();
    let mut s = ready(t0);
    s.on(Event::Leased { generation: 1 }, t0);
    s.on(Event::Exited { generation: 1, exit: exit(None, Some(9)) }, t0 + ms(10));
    assert_eq!(s.in_flight(), 0);
    assert_eq!(s.phase, Phase::Crashed { retry_at: t0 + ms(260), start_error: None });
}

#[test]
fn ready_config_exit_fails() {
    let t0 = Instant::now();
    let mut s = ready(t0);
    s.on(Event::Exited { generation: 1, exit: exit(Some(78), None) }, t0);
    assert_eq!(s.state(), EngineState::Failed);
}

// --- Draining ---

#[test]
fn draining_exit_after_a_requested_stop_is_clean() {
    for e in [exit(Some(0), None), exit(None, Some(15)), exit(None, Some(9))] {
        let t0 = Instant::now();
        let mut s = ready(t0);
        s.on(stop(StopReason::Evict), t0);
        assert!(s.on(stop(StopReason::Shutdown), t0).is_empty(), "already stopping");
        assert!(s.on(Event::Start { switch_from: None }, t0).is_empty());
        let fx = s.on(Event::Exited { generation: 1, exit: e.clone() }, t0);
        assert_eq!(fx, vec![Effect::RemoveSocket(proc(10).socket), Effect::Wake], "{e:?}");
        assert_eq!(s.phase, Phase::Stopped);
    }
}

#[test]
fn draining_exit_with_an_error_code_is_shown_as_a_crash_without_backoff() {
    let t0 = Instant::now();
    let mut s = ready(t0);
    s.on(stop(StopReason::KeepAlive), t0);
    let fx = s.on(Event::Exited { generation: 1, exit: exit(Some(1), None) }, t0);
    assert!(!fx.contains(&Effect::Count(Counter::Crash)));
    assert_eq!(s.phase, Phase::Crashed { retry_at: t0, start_error: None });
}

// --- Crashed and Failed ---

#[test]
fn crashed_respawns_after_the_backoff_and_counts_a_restart() {
    let t0 = Instant::now();
    let mut s = ready(t0);
    s.on(Event::Exited { generation: 1, exit: exit(Some(1), None) }, t0);
    assert!(s.on(Event::Start { switch_from: None }, t0 + ms(249)).is_empty(), "inside the backoff");
    let fx = s.on(Event::Start { switch_from: None }, t0 + ms(250));
    assert_eq!(fx, vec![Effect::Spawn { generation: 2 }, Effect::Count(Counter::Respawn)]);
    assert_eq!(s.restarts, 1);
    assert!(s.on(Event::Exited { generation: 1, exit: exit(Some(1), None) }, t0).is_empty(), "the old process");
}

#[test]
fn crashed_and_failed_stop_at_shutdown() {
    let t0 = Instant::now();
    let mut s = ready(t0);
    s.on(Event::Exited { generation: 1, exit: exit(Some(1), None) }, t0);
    assert_eq!(s.on(stop(StopReason::Shutdown), t0), vec![Effect::Wake]);
    assert_eq!(s.phase, Phase::Stopped);
    let mut f = starting(t0);
    f.on(Event::Exited { generation: 1, exit: exit(Some(78), None) }, t0);
    assert_eq!(f.on(stop(StopReason::Shutdown), t0), vec![Effect::Wake]);
    assert_eq!(f.phase, Phase::Stopped);
}

#[test]
fn failed_starts_again_after_the_cooldown() {
    let t0 = Instant::now();
    let mut s = starting(t0);
    s.on(Event::Exited { generation: 1, exit: exit(Some(78), None) }, t0);
    assert_eq!(s.admit(t0 + FAILED_COOLDOWN, None), Admit::Start);
    let fx = s.on(Event::Start { switch_from: None }, t0 + FAILED_COOLDOWN);
    assert_eq!(fx, vec![Effect::Spawn { generation: 2 }, Effect::Count(Counter::Spawn)]);
}

// --- Timing rules ---

#[test]
fn failed_starts_back_off_250_500_1000_then_the_fourth_is_a_crash_loop() {
    let t0 = Instant::now();
    let mut s = Slot::new("m", t0);
    let mut now = t0;
    let mut waits = Vec::new();
    for generation in 1..=4 {
        assert!(!s.on(Event::Start { switch_from: None }, now).is_empty(), "start {generation}");
        s.on(Event::Exited { generation, exit: exit(Some(1), None) }, now);
        if let Phase::Crashed { retry_at, .. } = s.phase {
            waits.push(retry_at - now);
            now = retry_at;
        }
    }
    assert_eq!(waits, vec![ms(250), ms(500), ms(1000)]);
    let err = LeaseError::CrashLoop { model: "m".into(), how: "exit code 1".into(), line: "last words".into() };
    assert_eq!(s.phase, Phase::Failed { until: now + FAILED_COOLDOWN, error: err.clone() });
    assert_eq!(s.admit(now + FAILED_COOLDOWN - ms(1), None), Admit::Refuse(err));
    assert_eq!(s.admit(now + FAILED_COOLDOWN, None), Admit::Start);
}

#[test]
fn crashes_spread_over_minutes_never_loop_and_a_healthy_run_resets_the_backoff() {
    let t0 = Instant::now();
    let mut s = Slot::new("m", t0);
    let mut now = t0;
    for generation in 1..=6 {
        s.on(Event::Start { switch_from: None }, now);
        s.on(Event::Spawned { generation, proc: proc(generation as u32) }, now);
        s.on(Event::Ready { generation }, now);
        // Up long enough to count as healthy, then it dies.
        now += HEALTHY_AFTER + ms(20_000);
        s.on(Event::Exited { generation, exit: exit(None, Some(11)) }, now);
        assert_eq!(crashed_at(&s), now + ms(250), "crash {generation} starts the backoff over");
        now += ms(250);
    }
}

// --- Unload (a person's request) ---

#[test]
fn unload_of_a_ready_engine_drains_it_without_counting_an_eviction_and_its_exit_is_clean() {
    let t0 = Instant::now();
    let mut s = ready(t0);
    assert_eq!(
        s.on(stop(StopReason::Unload), t0),
        vec![Effect::Stop { generation: 1, proc: proc(10), how: StopHow::Graceful }]
    );
    assert_eq!(s.state(), EngineState::Draining);
    assert!(s.on(stop(StopReason::Unload), t0).is_empty(), "already stopping");
    let fx = s.on(Event::Exited { generation: 1, exit: exit(None, Some(15)) }, t0);
    assert_eq!(fx, vec![Effect::RemoveSocket(proc(10).socket), Effect::Wake]);
    assert_eq!(s.phase, Phase::Stopped);
    assert_eq!(s.admit(t0, None), Admit::Start, "a later request starts it again");
}

#[test]
fn unload_of_a_starting_engine_stops_it_gracefully_once_it_exists() {
    let t0 = Instant::now();
    let mut s = starting(t0);
    assert_eq!(
        s.on(stop(StopReason::Unload), t0),
        vec![Effect::Stop { generation: 1, proc: proc(10), how: StopHow::Graceful }]
    );
    let mut early = Slot::new("m", t0);
    early.on(Event::Start { switch_from: None }, t0);
    assert!(early.on(stop(StopReason::Unload), t0).is_empty(), "nothing to stop yet");
    let fx = early.on(Event::Spawned { generation: 1, proc: proc(10) }, t0);
    assert_eq!(fx, vec![Effect::Stop { generation: 1, proc: proc(10), how: StopHow::Graceful }]);
}

#[test]
fn unload_resets_crashed_and_failed_models_to_stopped_and_ignores_stopped_ones() {
    let t0 = Instant::now();
    let mut s = ready(t0);
    s.on(Event::Exited { generation: 1, exit: exit(None, Some(9)) }, t0);
    assert_eq!(s.on(stop(StopReason::Unload), t0), vec![Effect::Wake]);
    assert_eq!(s.admit(t0, None), Admit::Start, "no backoff left to wait");
    let mut f = starting(t0);
    f.on(Event::Exited { generation: 1, exit: exit(Some(78), None) }, t0);
    assert_eq!(f.on(stop(StopReason::Unload), t0), vec![Effect::Wake]);
    assert_eq!(f.admit(t0, None), Admit::Start, "the cooldown is cleared");
    let mut idle = Slot::new("m", t0);
    assert!(idle.on(stop(StopReason::Unload), t0).is_empty());
    assert_eq!(idle.phase, Phase::Stopped);
}

// --- Kill (a second signal, or shutdown past its deadline) ---

#[test]
fn kill_of_a_ready_or_starting_engine_skips_the_drain_and_its_exit_is_clean() {
    let t0 = Instant::now();
    for mut s in [ready(t0), starting(t0)] {
        let fx = s.on(stop(StopReason::Kill), t0);
        assert_eq!(fx, vec![Effect::Stop { generation: 1, proc: proc(10), how: StopHow::Kill }]);
        assert_eq!(s.state(), EngineState::Draining);
        let fx = s.on(Event::Exited { generation: 1, exit: exit(None, Some(9)) }, t0);
        assert_eq!(fx, vec![Effect::RemoveSocket(proc(10).socket), Effect::Wake], "no crash counted");
        assert_eq!(s.phase, Phase::Stopped);
    }
}

#[test]
fn kill_of_a_draining_engine_kills_what_the_drain_waits_on() {
    let t0 = Instant::now();
    for why in [StopReason::Shutdown, StopReason::Hung, StopReason::Evict] {
        let mut s = ready(t0);
        s.on(Event::Stop { why, pid: Some(10) }, t0);
        let fx = s.on(stop(StopReason::Kill), t0 + ms(5));
        assert_eq!(fx, vec![Effect::Stop { generation: 1, proc: proc(10), how: StopHow::Kill }], "{why:?}");
        assert_eq!(s.state(), EngineState::Draining);
        s.on(Event::Exited { generation: 1, exit: exit(None, Some(9)) }, t0 + ms(6));
        assert_eq!(s.phase, Phase::Stopped, "asked for: {why:?}");
    }
}

#[test]
fn kill_before_the_spawn_kills_the_process_once_it_exists() {
    let t0 = Instant::now();
    let mut s = Slot::new("m", t0);
    s.on(Event::Start { switch_from: None }, t0);
    assert!(s.on(stop(StopReason::Shutdown), t0).is_empty());
    assert!(s.on(stop(StopReason::Kill), t0).is_empty(), "nothing to kill yet");
    let fx = s.on(Event::Spawned { generation: 1, proc: proc(10) }, t0);
    assert_eq!(fx, vec![Effect::Stop { generation: 1, proc: proc(10), how: StopHow::Kill }]);
}

#[test]
fn kill_stops_crashed_and_failed_models_and_ignores_stopped_ones() {
    let t0 = Instant::now();
    let mut s = ready(t0);
    s.on(Event::Exited { generation: 1, exit: exit(None, Some(9)) }, t0);
    assert_eq!(s.on(stop(StopReason::Kill), t0), vec![Effect::Wake]);
    assert_eq!(s.phase, Phase::Stopped);
    let mut f = starting(t0);
    f.on(Event::Exited { generation: 1, exit: exit(Some(78), None) }, t0);
    assert_eq!(f.on(stop(StopReason::Kill), t0), vec![Effect::Wake]);
    let mut idle = Slot::new("m", t0);
    assert!(idle.on(stop(StopReason::Kill), t0).is_empty());
    assert_eq!(idle.phase, Phase::Stopped);
}
