//! The one way an engine is stopped — eviction, keep-alive, a hung engine, shutdown:
//!
//! drain (`/admin/drain`: finish or cut requests, write the prompt cache to the SSD tier;
//! bounded) → SIGTERM to the process group → await the exit event (no polling) → SIGKILL
//! to the group at the deadline → await the reaped exit (bounded). The socket file is
//! removed by the driver when the exit event arrives (`Effect::RemoveSocket`).
//!
//! An engine that ignores SIGTERM, or is stopped (SIGSTOP) and cannot even answer the
//! drain, is therefore gone `drain + DRAIN_SLACK + term_grace` after the stop began, and
//! its group with it.

use std::time::Duration;

use nix::sys::signal::Signal;

use crate::child::ExitInfo;
use crate::event::{Proc, StopHow};
use crate::procs::{ExitWatch, Procs, wait_exit};

/// Time on top of the drain deadline for the engine to write its prompt cache.
pub const DRAIN_SLACK: Duration = Duration::from_secs(2);
/// After SIGKILL the kernel ends the process at once; this only bounds the wait for the
/// reaper to report it.
pub const KILL_GRACE: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StopPolicy {
    /// Drain deadline for in-flight requests (`None`: no drain, signal at once).
    pub drain: Option<Duration>,
    /// SIGTERM → SIGKILL.
    pub term_grace: Duration,
}

impl StopPolicy {
    pub fn new(how: StopHow, drain: Duration, term_grace: Duration) -> Self {
        match how {
            StopHow::Graceful => Self { drain: Some(drain), term_grace },
            StopHow::Kill => Self { drain: None, term_grace: Duration::ZERO },
        }
    }

    /// The longest a stop can take.
    pub fn bound(&self) -> Duration {
        self.drain.map_or(Duration::ZERO, |d| d + DRAIN_SLACK) + self.term_grace + KILL_GRACE
    }
}

/// Stop `proc`; returns its exit (`None` only if even SIGKILL was not reported in time).
pub async fn stop_engine(
    procs: &dyn Procs,
    proc: &Proc,
    mut exited: ExitWatch,
    policy: StopPolicy,
) -> Option<ExitInfo> {
    if let Some(drain) = policy.drain {
        let bounded = tokio::time::timeout(drain + DRAIN_SLACK, procs.drain(proc.socket.clone(), drain));
        tokio::select! {
            r = bounded => if r.is_err() {
                tracing::warn!(pid = proc.pid, "engine did not finish its drain in time");
            },
            info = wait_exit(&mut exited) => return Some(info),
        }
    }
    if policy.term_grace > Duration::ZERO {
        procs.signal(proc.pid, Signal::SIGTERM);
        if let Ok(info) = tokio::time::timeout(policy.term_grace, wait_exit(&mut exited)).await {
            return Some(info);
        }
        tracing::warn!(
            pid = proc.pid,
            grace_ms = policy.term_grace.as_millis() as u64,
            "engine ignored SIGTERM; killing its group"
        );
    }
    procs.signal(proc.pid, Signal::SIGKILL);
    match tokio::time::timeout(KILL_GRACE, wait_exit(&mut exited)).await {
        Ok(info) => Some(info),
        Err(_) => {
            tracing::error!(pid = proc.pid, "no exit reported after SIGKILL");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use corral_protocol::ModelId;
    use corral_protocol::launch::{EngineLaunch, EngineOptions};

    use super::*;
    use crate::procs::RealProcs;

    /// A real process group that ignores SIGTERM (a shell and its child): the stop path
    /// kills the whole group at the deadline and reports the reaped exit.
    #[tokio::test]
    async fn an_engine_ignoring_sigterm_loses_its_whole_group_at_the_deadline() {
        let dir = std::env::temp_dir().join(format!("corral-stop-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("engine.sh");
        let child_file = dir.join("child");
        std::fs::write(
            &script,
            format!("#!/bin/sh\ntrap '' TERM\nsleep 1000 &\necho $! > {}\nwait\n", child_file.display()),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let procs = RealProcs::new(script).unwrap();
        let launch = EngineLaunch {
            model: "/nonexistent.gguf".into(),
            id: ModelId::new("t").unwrap(),
            socket: dir.join("absent.sock"),
            options: EngineOptions::default(),
        };
        let started = procs.start(launch).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let grandchild = loop {
            if let Some(pid) = std::fs::read_to_string(&child_file).ok().and_then(|s| s.trim().parse::<i32>().ok()) {
                break pid;
            }
            assert!(Instant::now() < deadline, "the script did not start");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let proc = Proc { pid: started.pid, socket: dir.join("absent.sock") };
        let policy = StopPolicy { drain: Some(Duration::from_millis(100)), term_grace: Duration::from_millis(300) };
        let t0 = Instant::now();
        let info = stop_engine(&procs, &proc, started.exited, policy).await.expect("an exit");
        assert_eq!(info.signal, Some(9), "{info:?}");
        assert!(t0.elapsed() >= Duration::from_millis(300), "SIGTERM was given its grace");
        assert!(t0.elapsed() < Duration::from_secs(5), "took {:?}", t0.elapsed());
        // The grandchild was in the group: gone too (a zombie at most, reaped by init).
        let gone = Instant::now() + Duration::from_secs(5);
        while nix::sys::signal::kill(nix::unistd::Pid::from_raw(grandchild), None).is_ok()
            && !std::fs::read_to_string(format!("/proc/{grandchild}/stat")).is_ok_and(|s| s.contains(") Z"))
        {
            assert!(Instant::now() < gone, "the group's other process survived");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(started.hold);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
