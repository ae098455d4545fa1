//! Watching one engine process: its ready line on stdout, its log lines on stderr
//! (re-emitted under the engine's span and kept in a tail for crash reports), its
//! exit, and stopping it (drain → SIGTERM to its group → SIGKILL after a deadline).

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use corral_protocol::engine_wire::{EngineEvent, Ready as ReadyEvent};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;

use crate::unix_http;

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

pub enum ProcEvent {
    Ready(ReadyEvent),
    Exited(ExitInfo),
}

pub type Tail = Arc<Mutex<VecDeque<String>>>;

pub struct Watched {
    pub pid: u32,
    /// Held open for the engine's lifetime: EOF on it means "your parent is gone".
    pub stdin: Option<ChildStdin>,
    pub events: mpsc::UnboundedReceiver<ProcEvent>,
    pub tail: Tail,
}

pub fn unix_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Take over `child`: background tasks read its stdout and stderr and wait for its exit.
pub fn watch(mut child: Child, model: &str) -> std::io::Result<Watched> {
    let pid = child.id().ok_or_else(|| std::io::Error::other("the engine exited before it could be watched"))?;
    let stdin = child.stdin.take();
    let (tx, events) = mpsc::unbounded_channel();
    let tail: Tail = Arc::new(Mutex::new(VecDeque::with_capacity(TAIL_LINES)));
    if let Some(out) = child.stdout.take() {
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(EngineEvent::Ready(ev)) = EngineEvent::parse(&line) {
                    let _ = tx.send(ProcEvent::Ready(ev));
                }
            }
        });
    }
    let stderr_done = if let Some(err) = child.stderr.take() {
        let (tail, model) = (tail.clone(), model.to_owned());
        Some(tokio::spawn(async move {
            let mut lines = BufReader::new(err).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                reemit(&model, pid, &line);
                let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                if t.len() == TAIL_LINES {
                    t.pop_front();
                }
                t.push_back(line);
            }
        }))
    } else {
        None
    };
    let tail2 = tail.clone();
    tokio::spawn(async move {
        let status = child.wait().await;
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
        let _ = tx.send(ProcEvent::Exited(ExitInfo { code, signal, at: unix_secs(), stderr_tail }));
    });
    Ok(Watched { pid, stdin, events, tail })
}

/// Log an engine's stderr line under the gateway's subscriber, keeping its level.
fn reemit(model: &str, pid: u32, line: &str) {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
        tracing::warn!(model, pid, line, "engine stderr");
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

/// Ask the engine to drain (so its caches are saved), then SIGTERM its group. The
/// caller watches for the exit and escalates to SIGKILL at its own deadline.
pub async fn drain_then_term(pid: u32, socket: &Path, drain: Duration) {
    let path = format!("/admin/drain?timeout_ms={}", drain.as_millis());
    match unix_http::call(socket, "POST", &path, Bytes::new(), drain + Duration::from_secs(2)).await {
        Ok((200, _)) => {}
        Ok((status, body)) => tracing::warn!(pid, status, body = %String::from_utf8_lossy(&body), "drain refused"),
        Err(e) => tracing::warn!(pid, error = %e, "drain failed"),
    }
    signal_group(pid, Signal::SIGTERM);
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
