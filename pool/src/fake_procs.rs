//! A scripted process table for the pool's tests (`pool_tests.rs`,
//! `pool_model_tests.rs`): engines that load for a while, exit at start, ignore SIGTERM
//! or hang in their drain, under paused tokio time. `log` records what the pool did to
//! them and when.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corral_protocol::ModelId;
use corral_protocol::launch::{EngineLaunch, EngineOptions};
use corral_protocol::openai::ModelCard;
use nix::sys::signal::Signal;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::child::ExitInfo;
use crate::pool::{Pool, PoolConfig};
use crate::procs::{BoxFuture, Procs, Started};
use crate::registry::ModelEntry;

#[derive(Clone, Default)]
pub struct Behave {
    pub load: Duration,
    pub exit_at_start: Option<i32>,
    pub ignore_term: bool,
    pub drain: Duration,
    pub hang_drain: bool,
}

pub struct Live {
    pub model: String,
    pub socket: PathBuf,
    pub exit: watch::Sender<Option<ExitInfo>>,
    pub ignore_term: bool,
}

/// A scripted process table. `log` records what the pool did and when.
pub struct Fake {
    pub t0: Instant,
    pub behave: Mutex<HashMap<String, Behave>>,
    pub next_pid: AtomicU32,
    pub live: Mutex<HashMap<u32, Live>>,
    pub log: Mutex<Vec<(Duration, String)>>,
    /// Every drain: when, of which model's process.
    pub drains: Mutex<Vec<(Duration, String, u32)>>,
}

impl Fake {
    pub fn new(behave: &[(&str, Behave)]) -> Arc<Self> {
        Arc::new(Self {
            t0: Instant::now(),
            behave: Mutex::new(behave.iter().map(|(k, b)| (k.to_string(), b.clone())).collect()),
            next_pid: AtomicU32::new(100),
            live: Mutex::new(HashMap::new()),
            log: Mutex::new(Vec::new()),
            drains: Mutex::new(Vec::new()),
        })
    }

    pub fn note(&self, what: String) {
        self.log.lock().unwrap().push((self.t0.elapsed(), what));
    }

    /// When `what` happened (the first time).
    pub fn at(&self, what: &str) -> Option<Duration> {
        self.log.lock().unwrap().iter().find(|(_, w)| w == what).map(|(t, _)| *t)
    }

    pub fn count(&self, prefix: &str) -> usize {
        self.log.lock().unwrap().iter().filter(|(_, w)| w.starts_with(prefix)).count()
    }

    pub fn exit(&self, pid: u32, code: Option<i32>, signal: Option<i32>) {
        if let Some(l) = self.live.lock().unwrap().remove(&pid) {
            self.note(format!("exit {} {pid}", l.model));
            let _ = l.exit.send(Some(ExitInfo { code, signal, at: 0, stderr_tail: vec!["bye".into()] }));
        }
    }
}

impl Procs for Fake {
    fn start(&self, launch: EngineLaunch) -> BoxFuture<std::io::Result<Started>> {
        let model = launch.id.to_string();
        let b = self.behave.lock().unwrap().get(&model).cloned().unwrap_or_default();
        let pid = self.next_pid.fetch_add(1, Ordering::Relaxed);
        self.note(format!("start {model} {pid}"));
        let (ready_tx, ready) = oneshot::channel();
        let (exit, exited) = watch::channel(None);
        let code = b.exit_at_start;
        let early = exit.clone();
        let live = Live { model: model.clone(), socket: launch.socket.clone(), exit, ignore_term: b.ignore_term };
        self.live.lock().unwrap().insert(pid, live);
        tokio::spawn(async move {
            tokio::time::sleep(b.load).await;
            match code {
                Some(c) => {
                    let _ = early.send(Some(ExitInfo { code: Some(c), signal: None, at: 0, stderr_tail: vec![] }));
                }
                None => {
                    let _ = ready_tx.send("cpu".into());
                }
            }
        });
        Box::pin(async move { Ok(Started { pid, ready, exited, tail: Default::default(), hold: Box::new(()) }) })
    }

    fn probe(&self, _socket: PathBuf, _timeout: Duration) -> BoxFuture<Result<Option<ModelCard>, String>> {
        Box::pin(async { Ok(None) })
    }

    fn drain(&self, socket: PathBuf, _timeout: Duration) -> BoxFuture<()> {
        let found =
            self.live.lock().unwrap().iter().find(|(_, l)| l.socket == socket).map(|(pid, l)| (*pid, l.model.clone()));
        let model = found.as_ref().map(|(_, m)| m.clone());
        let b = model.as_ref().and_then(|m| self.behave.lock().unwrap().get(m).cloned()).unwrap_or_default();
        if let Some((pid, m)) = &found {
            self.drains.lock().unwrap().push((self.t0.elapsed(), m.clone(), *pid));
        }
        self.note(format!("drain {}", model.unwrap_or_default()));
        Box::pin(async move {
            if b.hang_drain {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(b.drain).await;
        })
    }

    fn signal(&self, pid: u32, sig: Signal) {
        let (model, ignore) = match self.live.lock().unwrap().get(&pid) {
            Some(l) => (l.model.clone(), l.ignore_term),
            None => return,
        };
        self.note(format!("{sig:?} {model}"));
        if sig == Signal::SIGKILL || !ignore {
            self.exit(pid, None, Some(sig as i32));
        }
    }
}

pub fn config(models: &[&str], f: impl FnOnce(&mut PoolConfig)) -> PoolConfig {
    let mut cfg = PoolConfig {
        models: models
            .iter()
            .map(|m| ModelEntry {
                id: ModelId::new(*m).unwrap(),
                path: format!("/m/{m}.gguf").into(),
                bytes: 100,
                modified: 0,
            })
            .collect(),
        cap: 1,
        memory_budget: 0,
        runtime_dir: std::env::temp_dir().join("corral-pool-tests-absent"),
        engine_program: "/bin/false".into(),
        engine_options: EngineOptions::default(),
        settings: Default::default(),
        load_timeout: Duration::from_secs(120),
        queue_timeout: Duration::from_secs(60),
        drain_timeout: Duration::from_secs(10),
        stop_timeout: Duration::from_secs(10),
        keep_alive: None,
    };
    f(&mut cfg);
    cfg
}

pub fn s(n: u64) -> Duration {
    Duration::from_secs(n)
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn state(pool: &Pool, model: &str) -> &'static str {
    pool.snapshot().engines.iter().find(|e| e.model == model).unwrap().state
}

/// Let spawned tasks run until everything waits on the clock again.
pub async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}
