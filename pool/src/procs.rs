//! The pool's only door to the operating system: start an engine process, probe it,
//! ask it to drain, signal it. The driver (`pool.rs`) and the stop path (`stop.rs`) go
//! through this trait, so their timing rules are tested with a scripted stand-in under
//! paused tokio time (`pool_tests.rs`); `RealProcs` is the real thing: the spawner
//! thread, the child watcher and HTTP over the engine's unix socket.

use std::any::Any;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use corral_protocol::launch::EngineLaunch;
use corral_protocol::openai::{ModelCard, ModelList};
use nix::sys::signal::Signal;
use tokio::sync::{oneshot, watch};

use crate::child::{self, ExitInfo, Tail};
use crate::spawn::{SpawnSpec, Spawner};
use crate::unix_http;

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Holds `Some` once the process has exited and been reaped.
pub type ExitWatch = watch::Receiver<Option<ExitInfo>>;

/// A process that exists.
pub struct Started {
    pub pid: u32,
    /// Fires when the engine prints its ready line.
    pub ready: oneshot::Receiver<String>,
    pub exited: ExitWatch,
    /// The last stderr lines (for crash reports).
    pub tail: Tail,
    /// Kept while the engine should live (its stdin: EOF tells it the parent is gone).
    pub hold: Box<dyn Any + Send>,
}

pub trait Procs: Send + Sync + 'static {
    fn start(&self, launch: EngineLaunch) -> BoxFuture<std::io::Result<Started>>;
    /// Confirm an engine that announced itself answers `/health`, and read its model card.
    fn probe(&self, socket: PathBuf, timeout: Duration) -> BoxFuture<Result<Option<ModelCard>, String>>;
    /// `POST /admin/drain`: finish requests (up to `timeout`), save the prompt cache.
    fn drain(&self, socket: PathBuf, timeout: Duration) -> BoxFuture<()>;
    /// Signal the engine's whole process group.
    fn signal(&self, pid: u32, sig: Signal);
}

/// Wait for the exit of a watched process (a closed watch counts as an unknown exit).
pub async fn wait_exit(exited: &mut ExitWatch) -> ExitInfo {
    match exited.wait_for(Option::is_some).await {
        Ok(v) => v.clone().expect("waited for Some"),
        Err(_) => ExitInfo { code: None, signal: None, at: child::unix_secs(), stderr_tail: vec![] },
    }
}

pub struct RealProcs {
    spawner: Spawner,
    program: PathBuf,
}

impl RealProcs {
    /// Must run inside a tokio runtime (children are reaped on it).
    pub fn new(program: PathBuf) -> std::io::Result<Self> {
        Ok(Self { spawner: Spawner::new(tokio::runtime::Handle::current())?, program })
    }
}

impl Procs for RealProcs {
    fn start(&self, launch: EngineLaunch) -> BoxFuture<std::io::Result<Started>> {
        let spec = SpawnSpec { program: self.program.clone(), args: launch.to_argv() };
        let spawner = self.spawner.clone();
        let model = launch.id.to_string();
        Box::pin(async move {
            let w = child::watch(spawner.spawn(spec).await?, &model)?;
            Ok(Started { pid: w.pid, ready: w.ready, exited: w.exited, tail: w.tail, hold: Box::new(w.stdin) })
        })
    }

    fn probe(&self, socket: PathBuf, timeout: Duration) -> BoxFuture<Result<Option<ModelCard>, String>> {
        Box::pin(async move {
            match unix_http::call(&socket, "GET", "/health", Bytes::new(), timeout).await {
                Ok((200, _)) => {}
                Ok((status, _)) => return Err(format!("/health answered {status}")),
                Err(e) => return Err(e.to_string()),
            }
            Ok(match unix_http::call(&socket, "GET", "/v1/models", Bytes::new(), timeout).await {
                Ok((200, body)) => {
                    serde_json::from_slice::<ModelList>(&body).ok().and_then(|l| l.data.into_iter().next())
                }
                _ => None,
            })
        })
    }

    fn drain(&self, socket: PathBuf, timeout: Duration) -> BoxFuture<()> {
        Box::pin(async move {
            let path = format!("/admin/drain?timeout_ms={}", timeout.as_millis());
            // The engine answers once its requests are done (or cut at `timeout`) and its
            // cache is on disk. The caller bounds the whole call (`stop.rs`); this bound
            // only keeps a forgotten call from lingering.
            let bound = timeout + Duration::from_secs(60);
            match unix_http::call(&socket, "POST", &path, Bytes::new(), bound).await {
                Ok((200, _)) => {}
                Ok((status, body)) => {
                    tracing::warn!(status, body = %String::from_utf8_lossy(&body), "drain refused")
                }
                Err(e) => tracing::warn!(error = %e, "drain failed"),
            }
        })
    }

    fn signal(&self, pid: u32, sig: Signal) {
        child::signal_group(pid, sig);
    }
}
