//! The pool: which engines run, and getting a request to a ready one.
//!
//! `lease` routes a model name to a slot, starts the engine on demand (exactly one
//! start however many requests arrive at once; the others wait on the same start),
//! respects the count cap and memory budget by evicting least-recently-used idle
//! engines *after* the new one is ready (spawn overlap), and never evicts an engine
//! with requests in flight. A `Lease` counts one request in flight until dropped.
//!
//! All state sits behind one mutex that is never held across an await; state changes
//! wake waiters through one `Notify`. Process work (spawn, watch, stop) runs in tasks.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use corral_protocol::openai::{ModelCard, ModelList};
use corral_protocol::{ApiError, ErrorKind, ModelId};
use nix::sys::signal::Signal;
use serde::Serialize;
use tokio::sync::Notify;

use crate::child::{self, ExitInfo, ProcEvent, Tail};
use crate::policy::{self, CrashLog, Limits, Resident};
use crate::registry::ModelEntry;
use crate::spawn::{SpawnSpec, Spawner};
use crate::state::{EngineState, can_transition};
use crate::unix_http;

#[derive(Clone, Debug)]
pub struct PoolConfig {
    pub models: Vec<ModelEntry>,
    pub cap: usize,
    /// Bytes; 0 = no budget.
    pub memory_budget: u64,
    /// Private directory for engine sockets.
    pub runtime_dir: PathBuf,
    /// The engine executable (normally this binary) and the arguments every engine gets
    /// after `--model/--id/--socket` (context size, sampling defaults, ...).
    pub engine_program: PathBuf,
    pub engine_args: Vec<OsString>,
    /// Longest wait for an engine to become ready.
    pub load_timeout: Duration,
    /// Longest wait for room in the pool (all engines busy).
    pub queue_timeout: Duration,
    /// Drain deadline when evicting or shutting down.
    pub drain_timeout: Duration,
    /// SIGTERM → SIGKILL deadline.
    pub stop_timeout: Duration,
    /// Stop engines idle this long (`None`: keep them).
    pub keep_alive: Option<Duration>,
}

#[derive(Default)]
pub struct Counters {
    pub spawns: AtomicU64,
    pub respawns: AtomicU64,
    pub evictions: AtomicU64,
    pub crashes: AtomicU64,
    pub switches: AtomicU64,
    pub last_switch_ms: AtomicU64,
}

struct Proc {
    pid: u32,
    socket: PathBuf,
    // Held so the engine's stdin stays open while we live.
    _stdin: Option<tokio::process::ChildStdin>,
}

struct Slot {
    entry: ModelEntry,
    state: EngineState,
    generation: u64,
    proc: Option<Proc>,
    tail: Option<Tail>,
    in_flight: usize,
    last_used: Instant,
    last_used_at: Option<u64>,
    started_at: Option<u64>,
    ready_at: Option<Instant>,
    restarts: u32,
    failures: u32,
    crashes: CrashLog,
    next_start: Option<Instant>,
    failed_until: Option<Instant>,
    failed_error: Option<ApiError>,
    /// Generation whose start failed, and why (for requests that waited on it).
    failed_start: Option<(u64, ApiError)>,
    stopping: bool,
    last_exit: Option<ExitInfo>,
    card: Option<ModelCard>,
    /// When a request that had to switch models started waiting.
    switch_started: Option<Instant>,
}

impl Slot {
    fn set(&mut self, to: EngineState) {
        if !can_transition(self.state, to) {
            tracing::error!(model = %self.entry.id, from = ?self.state, to = ?to, "refused state transition");
            debug_assert!(false, "bad transition {:?} -> {:?}", self.state, to);
            return;
        }
        tracing::info!(model = %self.entry.id, from = self.state.as_str(), to = to.as_str(), "engine state");
        self.state = to;
    }

    /// Model file plus a KV-cache estimate (a quarter of the weights: generous for the
    /// small models a desktop runs, and the pool does not read model files).
    fn bytes(&self) -> u64 {
        self.entry.bytes + self.entry.bytes / 4
    }
}

struct Inner {
    slots: BTreeMap<ModelId, Slot>,
    shutting_down: bool,
}

struct Shared {
    cfg: PoolConfig,
    inner: Mutex<Inner>,
    changed: Notify,
    spawner: Spawner,
    counters: Counters,
}

#[derive(Clone)]
pub struct Pool {
    shared: Arc<Shared>,
}

/// One request's claim on a ready engine.
pub struct Lease {
    shared: Arc<Shared>,
    pub model: ModelId,
    pub socket: PathBuf,
    pub pid: u32,
    released: bool,
}

impl Lease {
    /// Give the slot back early (the proxy does this before retrying a connect).
    pub fn release(mut self) {
        self.release_inner();
    }

    fn release_inner(&mut self) {
        if std::mem::replace(&mut self.released, true) {
            return;
        }
        let over = {
            let mut g = lock(&self.shared.inner);
            if let Some(s) = g.slots.get_mut(&self.model) {
                s.in_flight = s.in_flight.saturating_sub(1);
                s.last_used = Instant::now();
                s.last_used_at = Some(child::unix_secs());
            }
            self.shared.changed.notify_waiters();
            g.shutting_down
        };
        if !over {
            // An engine that just became idle may now be evictable.
            let shared = self.shared.clone();
            tokio::spawn(async move { enforce(&shared, None) });
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.release_inner();
    }
}

fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pool {
    /// Build the pool; engines start on demand. Must run inside a tokio runtime.
    pub fn new(cfg: PoolConfig) -> std::io::Result<Self> {
        let spawner = Spawner::new(tokio::runtime::Handle::current())?;
        let now = Instant::now();
        let slots = cfg
            .models
            .iter()
            .map(|e| {
                let slot = Slot {
                    entry: e.clone(),
                    state: EngineState::Stopped,
                    generation: 0,
                    proc: None,
                    tail: None,
                    in_flight: 0,
                    last_used: now,
                    last_used_at: None,
                    started_at: None,
                    ready_at: None,
                    restarts: 0,
                    failures: 0,
                    crashes: CrashLog::default(),
                    next_start: None,
                    failed_until: None,
                    failed_error: None,
                    failed_start: None,
                    stopping: false,
                    last_exit: None,
                    card: None,
                    switch_started: None,
                };
                (e.id.clone(), slot)
            })
            .collect();
        let shared = Arc::new(Shared {
            cfg,
            inner: Mutex::new(Inner { slots, shutting_down: false }),
            changed: Notify::new(),
            spawner,
            counters: Counters::default(),
        });
        if let Some(ttl) = shared.cfg.keep_alive {
            let s = shared.clone();
            tokio::spawn(async move { keep_alive_loop(s, ttl).await });
        }
        Ok(Self { shared })
    }

    pub fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    pub fn config(&self) -> &PoolConfig {
        &self.shared.cfg
    }

    /// The model a request without `model` (or with an unknown one) goes to: the only
    /// model, when exactly one is configured.
    pub fn default_model(&self) -> Option<ModelId> {
        let g = lock(&self.shared.inner);
        (g.slots.len() == 1).then(|| g.slots.keys().next().cloned()).flatten()
    }

    pub fn route(&self, requested: Option<&str>) -> Result<ModelId, ApiError> {
        let g = lock(&self.shared.inner);
        if let Some(name) = requested
            && let Some(id) = g.slots.keys().find(|k| k.as_str() == name)
        {
            return Ok(id.clone());
        }
        if g.slots.len() == 1 {
            return Ok(g.slots.keys().next().cloned().expect("one slot"));
        }
        let known: Vec<&str> = g.slots.keys().map(ModelId::as_str).collect();
        let msg = match requested {
            Some(name) => format!("model {name:?} not found; available: {}", known.join(", ")),
            None => format!("the request names no model; available: {}", known.join(", ")),
        };
        Err(ApiError::new(ErrorKind::ModelNotFound, msg).with_param("model"))
    }

    /// Start a model's engine now (`--preload`); returns once it is ready.
    pub async fn preload(&self, model: &str) -> Result<(), ApiError> {
        self.lease(Some(model)).await.map(drop)
    }

    /// Claim a ready engine for `requested`, starting one if needed.
    pub async fn lease(&self, requested: Option<&str>) -> Result<Lease, ApiError> {
        let id = self.route(requested)?;
        let cfg = &self.shared.cfg;
        let started = Instant::now();
        let deadline = started + cfg.queue_timeout.max(cfg.load_timeout);
        let mut waited_on: Option<u64> = None;
        loop {
            let notified = self.shared.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let mut sleep_until = None;
            {
                let mut g = lock(&self.shared.inner);
                if g.shutting_down {
                    return Err(ApiError::new(ErrorKind::ShuttingDown, "the server is shutting down"));
                }
                let now = Instant::now();
                let others_resident = g.slots.iter().any(|(k, s)| *k != id && s.state.is_resident());
                let slot = g.slots.get_mut(&id).expect("routed ids exist");
                match slot.state {
                    EngineState::Ready => {
                        let proc = slot.proc.as_ref().expect("a ready engine has a process");
                        slot.in_flight += 1;
                        slot.last_used = now;
                        slot.last_used_at = Some(child::unix_secs());
                        return Ok(Lease {
                            shared: self.shared.clone(),
                            model: id,
                            socket: proc.socket.clone(),
                            pid: proc.pid,
                            released: false,
                        });
                    }
                    EngineState::Failed if slot.failed_until.is_some_and(|t| t > now) => {
                        return Err(slot
                            .failed_error
                            .clone()
                            .unwrap_or_else(|| ApiError::new(ErrorKind::EngineCrashLoop, "engine failed")));
                    }
                    EngineState::Starting => waited_on = Some(slot.generation),
                    EngineState::Draining => {}
                    EngineState::Stopped | EngineState::Crashed | EngineState::Failed => {
                        if let (Some(g0), Some((g1, err))) = (waited_on, &slot.failed_start)
                            && g0 == *g1
                        {
                            return Err(err.clone());
                        }
                        match slot.next_start.filter(|&t| t > now) {
                            Some(t) => sleep_until = Some(t),
                            None => {
                                let bytes = slot.bytes();
                                if can_start_now(&g, &id, bytes, cfg) {
                                    let gen_ =
                                        begin_start(&self.shared, &mut g, &id, others_resident.then_some(started));
                                    waited_on = Some(gen_);
                                }
                            }
                        }
                    }
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(match waited_on {
                    Some(_) => {
                        ApiError::new(ErrorKind::EngineTimeout, "the model's engine did not become ready in time")
                    }
                    None => ApiError::new(ErrorKind::Overloaded, "every engine slot is busy; retry shortly"),
                });
            }
            let until = sleep_until.map_or(deadline, |t| t.min(deadline));
            let _ = tokio::time::timeout(until - now, notified).await;
        }
    }

    /// Stop admitting leases and stop every engine (drain, SIGTERM, SIGKILL at the
    /// deadline). Returns when all engine processes are gone.
    pub async fn shutdown(&self) {
        let stops: Vec<(u32, PathBuf)> = {
            let mut g = lock(&self.shared.inner);
            g.shutting_down = true;
            self.shared.changed.notify_waiters();
            g.slots
                .values_mut()
                .filter_map(|s| {
                    let p = s.proc.as_ref()?;
                    let out = (p.pid, p.socket.clone());
                    s.stopping = true;
                    if matches!(s.state, EngineState::Starting | EngineState::Ready) {
                        s.set(EngineState::Draining);
                    }
                    Some(out)
                })
                .collect()
        };
        let cfg = &self.shared.cfg;
        let drains = stops.iter().map(|(pid, sock)| child::drain_then_term(*pid, sock, cfg.drain_timeout));
        let _ = tokio::time::timeout(cfg.drain_timeout + Duration::from_secs(3), join_all(drains)).await;
        let deadline = Instant::now() + cfg.stop_timeout;
        while Instant::now() < deadline && self.any_process() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.kill_all();
        let end = Instant::now() + Duration::from_secs(2);
        while Instant::now() < end && self.any_process() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Kill a hung or broken engine (the proxy saw it stall or answer garbage); it is
    /// respawned on the next request like any crash.
    pub fn recycle(&self, model: &ModelId, pid: u32) {
        let g = lock(&self.shared.inner);
        if g.slots.get(model).and_then(|s| s.proc.as_ref()).is_some_and(|p| p.pid == pid) {
            tracing::warn!(model = %model, pid, "recycling an unresponsive engine");
            child::signal_group(pid, Signal::SIGKILL);
        }
    }

    /// SIGKILL every engine group at once (second signal, or after the stop deadline).
    pub fn kill_all(&self) {
        let g = lock(&self.shared.inner);
        for s in g.slots.values() {
            if let Some(p) = &s.proc {
                child::signal_group(p.pid, Signal::SIGKILL);
                let _ = std::fs::remove_file(&p.socket);
            }
        }
    }

    fn any_process(&self) -> bool {
        lock(&self.shared.inner).slots.values().any(|s| s.proc.is_some())
    }

    pub fn snapshot(&self) -> PoolSnapshot {
        let g = lock(&self.shared.inner);
        let cfg = &self.shared.cfg;
        let engines = g
            .slots
            .values()
            .map(|s| EngineView {
                model: s.entry.id.to_string(),
                state: s.state.as_str(),
                pid: s.proc.as_ref().map(|p| p.pid),
                socket: s.proc.as_ref().map(|p| p.socket.display().to_string()),
                restarts: s.restarts,
                started_at: s.started_at,
                last_used_at: s.last_used_at,
                in_flight: s.in_flight,
                model_bytes: s.entry.bytes,
                last_exit: s.last_exit.clone(),
            })
            .collect();
        PoolSnapshot {
            pool: PoolView {
                cap: cfg.cap,
                resident: g.slots.values().filter(|s| s.state.is_resident()).map(|s| s.entry.id.to_string()).collect(),
                memory_budget_bytes: cfg.memory_budget,
                default: (g.slots.len() == 1).then(|| g.slots.keys().next().map(|k| k.to_string())).flatten(),
            },
            engines,
        }
    }

    /// Sockets of ready engines, for fetching their stats.
    pub fn ready_sockets(&self) -> Vec<(String, PathBuf)> {
        let g = lock(&self.shared.inner);
        g.slots
            .values()
            .filter(|s| s.state == EngineState::Ready)
            .filter_map(|s| Some((s.entry.id.to_string(), s.proc.as_ref()?.socket.clone())))
            .collect()
    }

    /// Every known model, resident or not; cards learned from engines that have run.
    pub fn models(&self) -> ModelList {
        let g = lock(&self.shared.inner);
        let data = g
            .slots
            .values()
            .map(|s| {
                let mut card = s.card.clone().unwrap_or_else(|| ModelCard {
                    id: s.entry.id.to_string(),
                    object: "model".into(),
                    created: s.entry.modified,
                    owned_by: "corral".into(),
                    context_window: None,
                    capabilities: None,
                    gen_defaults: None,
                    resident: None,
                    arch: None,
                    chat_template: None,
                });
                card.id = s.entry.id.to_string();
                card.resident = Some(s.state.is_resident());
                card
            })
            .collect();
        ModelList { object: "list".into(), data }
    }
}

/// Engines that hold (or are about to hold) memory, as the policy sees them.
fn residents(g: &Inner) -> impl Iterator<Item = Resident<ModelId>> + '_ {
    g.slots.iter().filter(|(_, s)| matches!(s.state, EngineState::Starting | EngineState::Ready)).map(|(k, s)| {
        Resident {
            key: k.clone(),
            starting: s.state == EngineState::Starting,
            in_flight: s.in_flight,
            last_used: s.last_used,
            bytes: s.bytes(),
        }
    })
}

fn can_start_now(g: &Inner, id: &ModelId, bytes: u64, cfg: &PoolConfig) -> bool {
    let residents: Vec<Resident<ModelId>> = residents(g).filter(|r| r.key != *id).collect();
    policy::can_start(&residents, bytes, &Limits { cap: cfg.cap, memory_budget: cfg.memory_budget })
}

/// Mark the slot Starting and launch the start task; returns the new generation.
fn begin_start(shared: &Arc<Shared>, g: &mut Inner, id: &ModelId, switch_started: Option<Instant>) -> u64 {
    let slot = g.slots.get_mut(id).expect("slot exists");
    let respawn = slot.state == EngineState::Crashed;
    slot.set(EngineState::Starting);
    slot.generation += 1;
    slot.failed_start = None;
    slot.stopping = false;
    slot.switch_started = switch_started;
    slot.started_at = Some(child::unix_secs());
    if respawn {
        slot.restarts += 1;
        shared.counters.respawns.fetch_add(1, Ordering::Relaxed);
    } else {
        shared.counters.spawns.fetch_add(1, Ordering::Relaxed);
    }
    let generation = slot.generation;
    let socket = shared.cfg.runtime_dir.join(format!("e-{:08x}-{generation}.sock", short_hash(id.as_str())));
    let mut args: Vec<OsString> = vec![
        "engine".into(),
        "--model".into(),
        slot.entry.path.clone().into(),
        "--id".into(),
        id.to_string().into(),
        "--socket".into(),
        socket.clone().into(),
    ];
    args.extend(shared.cfg.engine_args.iter().cloned());
    let spec = SpawnSpec { program: shared.cfg.engine_program.clone(), args };
    let (shared, id) = (shared.clone(), id.clone());
    tokio::spawn(async move { run_engine(shared, id, generation, spec, socket).await });
    generation
}

fn short_hash(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ b as u32).wrapping_mul(0x0100_0193))
}

/// Spawn, wait for ready, then watch until the process exits.
async fn run_engine(shared: Arc<Shared>, id: ModelId, generation: u64, spec: SpawnSpec, socket: PathBuf) {
    let child = match shared.spawner.spawn(spec).await {
        Ok(c) => c,
        Err(e) => {
            let info = ExitInfo {
                code: None,
                signal: None,
                at: child::unix_secs(),
                stderr_tail: vec![format!("spawn failed: {e}")],
            };
            on_exit(&shared, &id, generation, info);
            return;
        }
    };
    let mut w = match child::watch(child, id.as_str()) {
        Ok(w) => w,
        Err(e) => {
            let info = ExitInfo { code: None, signal: None, at: child::unix_secs(), stderr_tail: vec![e.to_string()] };
            on_exit(&shared, &id, generation, info);
            return;
        }
    };
    {
        let mut g = lock(&shared.inner);
        if let Some(s) = g.slots.get_mut(&id) {
            s.proc = Some(Proc { pid: w.pid, socket: socket.clone(), _stdin: w.stdin.take() });
            s.tail = Some(w.tail.clone());
        }
    }
    let pid = w.pid;
    // The first event is the ready line or the exit (a closed channel without either
    // cannot happen while the watcher lives; on_ready's health check would catch it).
    let load = tokio::time::timeout(shared.cfg.load_timeout, async {
        match w.events.recv().await {
            Some(ProcEvent::Exited(info)) => Some(info),
            Some(ProcEvent::Ready(_)) | None => None,
        }
    })
    .await;
    match load {
        Ok(Some(info)) => return on_exit(&shared, &id, generation, info),
        Ok(None) => on_ready(&shared, &id, generation, &socket).await,
        Err(_) => {
            tracing::error!(model = %id, pid, "engine did not become ready in time; killing it");
            child::signal_group(pid, Signal::SIGKILL);
        }
    }
    while let Some(ev) = w.events.recv().await {
        if let ProcEvent::Exited(info) = ev {
            return on_exit(&shared, &id, generation, info);
        }
    }
}

async fn on_ready(shared: &Arc<Shared>, id: &ModelId, generation: u64, socket: &std::path::Path) {
    // The ready line says the socket accepts; confirm end to end, then learn the card.
    let mut healthy = false;
    for _ in 0..50 {
        if matches!(unix_http::call(socket, "GET", "/health", Bytes::new(), Duration::from_secs(2)).await, Ok((200, _)))
        {
            healthy = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let card = match unix_http::call(socket, "GET", "/v1/models", Bytes::new(), Duration::from_secs(2)).await {
        Ok((200, body)) => serde_json::from_slice::<ModelList>(&body).ok().and_then(|l| l.data.into_iter().next()),
        _ => None,
    };
    {
        let mut g = lock(&shared.inner);
        let Some(s) = g.slots.get_mut(id) else { return };
        if s.generation != generation || s.state != EngineState::Starting || !healthy {
            return;
        }
        s.set(EngineState::Ready);
        s.ready_at = Some(Instant::now());
        if card.is_some() {
            s.card = card;
        }
        if let Some(t) = s.switch_started.take() {
            shared.counters.switches.fetch_add(1, Ordering::Relaxed);
            shared.counters.last_switch_ms.store(t.elapsed().as_millis() as u64, Ordering::Relaxed);
        }
        shared.changed.notify_waiters();
    }
    enforce(shared, Some(id));
}

fn on_exit(shared: &Arc<Shared>, id: &ModelId, generation: u64, mut info: ExitInfo) {
    let mut g = lock(&shared.inner);
    let Some(s) = g.slots.get_mut(id) else { return };
    if s.generation != generation {
        return;
    }
    if let Some(p) = s.proc.take() {
        let _ = std::fs::remove_file(&p.socket);
    }
    if info.stderr_tail.is_empty()
        && let Some(t) = &s.tail
    {
        info.stderr_tail = t.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect();
    }
    let line = child::last_error_line(&info.stderr_tail).unwrap_or_else(|| "no output".into());
    let clean = s.stopping && (info.code == Some(0) || info.signal.is_some());
    let was_starting = s.state == EngineState::Starting;
    let now = Instant::now();
    tracing::info!(model = %id, code = ?info.code, signal = ?info.signal, clean, "engine exited");
    s.last_exit = Some(info.clone());
    s.in_flight = 0;
    if s.stopping {
        s.stopping = false;
        s.set(if clean { EngineState::Stopped } else { EngineState::Crashed });
        if !clean {
            s.next_start = None;
        }
    } else if info.code == Some(78) {
        shared.counters.crashes.fetch_add(1, Ordering::Relaxed);
        let err = ApiError::new(ErrorKind::EngineConfig, format!("model {id} cannot be served: {line}"));
        s.set(EngineState::Failed);
        s.failed_until = Some(now + policy::FAILED_COOLDOWN);
        s.failed_error = Some(err.clone());
        s.failed_start = Some((generation, err));
    } else {
        shared.counters.crashes.fetch_add(1, Ordering::Relaxed);
        if s.ready_at.is_some_and(|t| now.duration_since(t) >= policy::HEALTHY_AFTER) {
            s.failures = 0;
        }
        s.failures += 1;
        let looping = s.crashes.record(now);
        let how = match (info.code, info.signal) {
            (Some(c), _) => format!("exit code {c}"),
            (_, Some(sig)) => format!("signal {sig}"),
            _ => "unknown status".into(),
        };
        if looping {
            let err = ApiError::new(
                ErrorKind::EngineCrashLoop,
                format!("model {id} keeps crashing ({how}); last output: {line}"),
            );
            s.set(EngineState::Failed);
            s.failed_until = Some(now + policy::FAILED_COOLDOWN);
            s.failed_error = Some(err.clone());
            s.failed_start = Some((generation, err));
        } else {
            s.set(EngineState::Crashed);
            s.next_start = Some(now + policy::backoff(s.failures));
            if was_starting {
                let err =
                    ApiError::new(ErrorKind::EngineStartFailed, format!("model {id} failed to start ({how}): {line}"));
                s.failed_start = Some((generation, err));
            }
        }
    }
    s.ready_at = None;
    shared.changed.notify_waiters();
}

/// Evict least-recently-used idle engines until the residents fit the limits.
fn enforce(shared: &Arc<Shared>, keep: Option<&ModelId>) {
    let cfg = &shared.cfg;
    let mut stops = Vec::new();
    {
        let mut g = lock(&shared.inner);
        if g.shutting_down {
            return;
        }
        let residents: Vec<Resident<ModelId>> = residents(&g).collect();
        for id in policy::victims(&residents, keep, &Limits { cap: cfg.cap, memory_budget: cfg.memory_budget }) {
            if let Some(s) = g.slots.get_mut(&id)
                && let Some(p) = &s.proc
            {
                stops.push((p.pid, p.socket.clone()));
                s.stopping = true;
                s.set(EngineState::Draining);
                shared.counters.evictions.fetch_add(1, Ordering::Relaxed);
                tracing::info!(model = %id, "evicting least-recently-used idle engine");
            }
        }
    }
    for (pid, socket) in stops {
        let (drain, stop) = (cfg.drain_timeout, cfg.stop_timeout);
        let shared = shared.clone();
        tokio::spawn(async move {
            child::drain_then_term(pid, &socket, drain).await;
            let deadline = Instant::now() + stop;
            while Instant::now() < deadline && alive(&shared, pid) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if alive(&shared, pid) {
                tracing::warn!(pid, "engine ignored SIGTERM; killing its group");
                child::signal_group(pid, Signal::SIGKILL);
            }
        });
    }
}

fn alive(shared: &Shared, pid: u32) -> bool {
    lock(&shared.inner).slots.values().any(|s| s.proc.as_ref().is_some_and(|p| p.pid == pid))
}

async fn keep_alive_loop(shared: Arc<Shared>, ttl: Duration) {
    loop {
        tokio::time::sleep(Duration::from_secs(1).min(ttl)).await;
        let expired: Vec<ModelId> = {
            let g = lock(&shared.inner);
            if g.shutting_down {
                return;
            }
            g.slots
                .iter()
                .filter(|(_, s)| s.state == EngineState::Ready && s.in_flight == 0 && s.last_used.elapsed() >= ttl)
                .map(|(k, _)| k.clone())
                .collect()
        };
        for id in expired {
            let stop = {
                let mut g = lock(&shared.inner);
                let Some(s) = g.slots.get_mut(&id) else { continue };
                if s.state != EngineState::Ready || s.in_flight > 0 {
                    continue;
                }
                s.stopping = true;
                s.set(EngineState::Draining);
                shared.counters.evictions.fetch_add(1, Ordering::Relaxed);
                s.proc.as_ref().map(|p| (p.pid, p.socket.clone()))
            };
            if let Some((pid, socket)) = stop {
                tracing::info!(model = %id, "keep-alive expired; stopping idle engine");
                child::drain_then_term(pid, &socket, shared.cfg.drain_timeout).await;
            }
        }
    }
}

async fn join_all<F: std::future::Future<Output = ()>>(futs: impl IntoIterator<Item = F>) {
    let handles: Vec<_> = futs.into_iter().collect();
    for f in handles {
        f.await;
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct PoolView {
    pub cap: usize,
    pub resident: Vec<String>,
    pub memory_budget_bytes: u64,
    pub default: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct EngineView {
    pub model: String,
    pub state: &'static str,
    pub pid: Option<u32>,
    pub socket: Option<String>,
    pub restarts: u32,
    pub started_at: Option<u64>,
    pub last_used_at: Option<u64>,
    pub in_flight: usize,
    pub model_bytes: u64,
    pub last_exit: Option<ExitInfo>,
}

/// `GET /engine`.
#[derive(Clone, Debug, Serialize)]
pub struct PoolSnapshot {
    pub pool: PoolView,
    pub engines: Vec<EngineView>,
}
