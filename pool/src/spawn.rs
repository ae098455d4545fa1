//! Starting engine processes from one long-lived thread.
//!
//! On Linux each engine gets `PR_SET_PDEATHSIG(SIGKILL)`, which fires when the *thread*
//! that forked it exits, so forking from short-lived runtime threads would kill engines
//! at random; one dedicated spawner thread lives as long as the gateway. Each engine
//! also gets its own process group (so stopping it reaches any helpers it forks), an
//! explicit argv, a cleared environment plus an allow-list, and a stdin pipe the
//! gateway holds: EOF on it tells the engine its parent is gone (macOS has no
//! parent-death signal).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;

use tokio::process::{Child, Command};
use tokio::sync::oneshot;

/// Environment variables an engine inherits; everything else is cleared.
pub const ENV_ALLOW: &[&str] =
    &["RUST_LOG", "RUST_BACKTRACE", "CORRAL_THREADS", "CANDLE_NUM_THREADS", "HOME", "TMPDIR", "LANG"];

#[derive(Clone, Debug)]
pub struct SpawnSpec {
    pub program: PathBuf,
    pub args: Vec<OsString>,
}

type Reply = oneshot::Sender<std::io::Result<Child>>;

#[derive(Clone)]
pub struct Spawner {
    tx: std::sync::mpsc::Sender<(SpawnSpec, Reply)>,
}

impl Spawner {
    /// Start the spawner thread; `handle` is the runtime the children are reaped on.
    pub fn new(handle: tokio::runtime::Handle) -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel::<(SpawnSpec, Reply)>();
        std::thread::Builder::new().name("engine-spawner".into()).spawn(move || {
            let _rt = handle.enter();
            for (spec, reply) in rx {
                let _ = reply.send(spawn(&spec));
            }
        })?;
        Ok(Self { tx })
    }

    pub async fn spawn(&self, spec: SpawnSpec) -> std::io::Result<Child> {
        let (reply, rx) = oneshot::channel();
        self.tx.send((spec, reply)).map_err(|_| std::io::Error::other("the spawner thread is gone"))?;
        rx.await.map_err(|_| std::io::Error::other("the spawner thread is gone"))?
    }
}

fn spawn(spec: &SpawnSpec) -> std::io::Result<Child> {
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .env_clear()
        .envs(ENV_ALLOW.iter().filter_map(|k| std::env::var_os(k).map(|v| (*k, v))))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    #[cfg(target_os = "linux")]
    {
        let parent = nix::unistd::getpid();
        // SAFETY: runs in the forked child before exec and only makes async-signal-safe
        // calls (prctl, getppid); no allocation, no locks.
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(std::io::Error::from)?;
                // The parent may have died between fork and prctl: then nobody would ever
                // send the signal, so give up now.
                if nix::unistd::getppid() != parent {
                    return Err(std::io::Error::other("parent exited during spawn"));
                }
                Ok(())
            });
        }
    }
    cmd.spawn()
}
