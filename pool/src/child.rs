//! Watching one engine process: its ready line on stdout, its log lines on stderr
//! (re-emitted under the engine's span and kept in a tail for crash reports), and its
//! exit, published once it has been reaped (its process group is killed then, so no
//! helper it forked outlives it). Stopping is `stop.rs`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use corral_protocol::engine_wire::EngineEvent;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin};
use tokio::sync::{oneshot, watch};

use crate::stderr_limit::{self, LogBudget, Verdict, read_bounded_line};

/// Stderr lines kept for crash reports.
pub const TAIL_LINES: usize = 50;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ExitInfo {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Unix seconds.
    pub at: u64,
    pub stderr_tail: Vec<String>,
}

pub type Tail = Arc<Mutex<VecDeque<String>>>;

pub struct Watched {
    pub pid: u32,
    /// Held open for the engine's lifetime: EOF on it means "your parent is gone".
    pub stdin: Option<ChildStdin>,
    /// Fires on the ready line, with the device the engine computes on.
    pub ready: oneshot::Receiver<String>,
    /// `Some` once the process has exited and been reaped.
    pub exited: watch::Receiver<Option<ExitInfo>>,
    pub tail: Tail,
}

pub fn unix_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Take over `child`: background tasks read its stdout and stderr and wait for its exit.
pub fn watch(mut child: Child, model: &str) -> std::io::Result<Watched> {
    let pid = child.id().ok_or_else(|| std::io::Error::other("the engine exited before it could be watched"))?;
    let stdin = child.stdin.take();
    let (ready_tx, ready) = oneshot::channel();
    let (exit_tx, exited) = watch::channel(None);
    let tail: Tail = Arc::new(Mutex::new(VecDeque::with_capacity(TAIL_LINES)));
    if let Some(out) = child.stdout.take() {
        tokio::spawn(async move {
            let mut ready_tx = Some(ready_tx);
            let mut lines = BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(EngineEvent::Ready(ev)) = EngineEvent::parse(&line)
                    && let Some(tx) = ready_tx.take()
                {
                    tracing::debug!(pid = ev.pid, load_ms = ev.load_ms, "engine ready line");
                    let _ = tx.send(ev.device);
                }
            }
        });
    }
    let stderr_done = if let Some(err) = child.stderr.take() {
        let (tail, model) = (tail.clone(), model.to_owned());
        Some(tokio::spawn(async move {
            // Bounded per line and rate-limited (`stderr_limit.rs`): a flooding engine
            // costs the gateway neither memory nor its pace. The tail sees every line.
            let mut err = BufReader::new(err);
            let mut budget = LogBudget::new(stderr_limit::PER_SEC, stderr_limit::BURST, Instant::now());
            while let Some((line, cut)) = read_bounded_line(&mut err, stderr_limit::MAX_LINE_BYTES).await {
                if let Verdict::Emit { dropped } = budget.admit(Instant::now()) {
                    if dropped > 0 {
                        tracing::warn!(model = %model, pid, dropped, "engine stderr lines left out of the log (rate limit)");
                    }
                    reemit(&model, pid, &line, cut);
                }
                let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                if t.len() == TAIL_LINES {
                    t.pop_front();
                }
                t.push_back(line);
            }
            if budget.pending() > 0 {
                tracing::warn!(model = %model, pid, dropped = budget.pending(), "engine stderr lines left out of the log (rate limit)");
            }
        }))
    } else {
        None
    };
    let tail2 = tail.clone();
    tokio::spawn(async move {
        let status = child.wait().await;
        // Whatever the engine left in its process group (helpers it forked) goes with it,
        // however it ended. The group id is the reaped leader's pid: reused only if a new
        // process took that pid and made itself a group leader in this instant.
        signal_group(pid, Signal::SIGKILL);
        // Let the stderr reader take the last lines (the crash message) before reporting.
        if let Some(h) = stderr_done {
            let _ = tokio::time::timeout(Duration::from_millis(200), h).await;
        }
        let (code, signal) = match &status {
            Ok(s) => {
                use std::os::unix::process::ExitStatusExt;
                (s.code(), s.signal())
            }
            Err(_) => (None, None),
        };
        let stderr_tail = tail2.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect();
        let _ = exit_tx.send(Some(ExitInfo { code, signal, at: unix_secs(), stderr_tail }));
    });
    Ok(Watched { pid, stdin, ready, exited, tail })
}

/// Log an engine's stderr line under the gateway's subscriber, keeping its level
/// (`cut`: only the line's first `MAX_LINE_BYTES` are here).
fn reemit(model: &str, pid: u32, line: &str, cut: bool) {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
        tracing::warn!(model, pid, line, cut, "engine stderr");
        return;
    };
    let msg = v.get("message").and_then(|m| m.as_str()).unwrap_or(line);
    match v.get("level").and_then(|l| l.as_str()).unwrap_or("INFO") {
        "ERROR" => tracing::error!(model, pid, engine = %line, "{msg}"),
        "WARN" => tracing::warn!(model, pid, engine = %line, "{msg}"),
        "INFO" => tracing::info!(model, pid, "{msg}"),
        _ => tracing::debug!(model, pid, engine = %line, "{msg}"),
    }
}

/// The most telling line of a stderr tail: an explicit error line if there is one,
/// else the last line (its `message` if it is a JSON log line).
pub fn last_error_line(tail: &[String]) -> Option<String> {
    let pick = tail.iter().rev().find(|l| l.contains("error")).or_else(|| tail.last())?;
    match serde_json::from_str::<serde_json::Value>(pick) {
        Ok(v) => v
            .get("error")
            .or_else(|| v.get("message"))
            .and_then(|m| m.as_str())
            .map(str::to_owned)
            .or_else(|| Some(pick.clone())),
        Err(_) => Some(pick.clone()),
    }
}

/// Signal an engine's whole process group (ignoring "no such process").
pub fn signal_group(pid: u32, sig: Signal) {
    if let Err(e) = killpg(Pid::from_raw(pid as i32), sig)
        && e != nix::errno::Errno::ESRCH
    {
        tracing::warn!(pid, signal = ?sig, error = %e, "signalling engine group failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_error_line() {
        let tail = vec![
            r#"{"level":"INFO","message":"loading"}"#.to_owned(),
            "corral engine: error: bad.gguf is not a GGUF file".to_owned(),
            r#"{"level":"INFO","message":"bye"}"#.to_owned(),
        ];
        assert_eq!(last_error_line(&tail).unwrap(), "corral engine: error: bad.gguf is not a GGUF file");
        let json = vec![r#"{"level":"ERROR","error":"boom","message":"engine failed"}"#.to_owned()];
        assert_eq!(last_error_line(&json).unwrap(), "boom");
        assert_eq!(last_error_line(&[]), None);
    }
}
