//! The pool: which engines run, and getting a request to a ready one.
//!
//! This file is the driver of the per-model state machines in `slot.rs`: it takes the
//! lock, feeds a slot an event, drops the lock, and performs the effects the slot asked
//! for — spawn an engine task, stop one through `stop.rs`, remove a socket, wake the
//! requests waiting on a change, count. Every decision lives in the slot (or, across
//! models, in `policy.rs`); nothing here decides.
//!
//! - `lease` routes a model name, starts the engine on demand (exactly one start however
//!   many requests arrive at once: the others wait on the same start), respects the count
//!   cap and memory budget by evicting least-recently-used idle engines *after* the new one
//!   is ready (spawn overlap), and never evicts an engine with requests in flight.
//! - All state sits behind one mutex never held across an await; changes wake waiters
//!   through one `Notify`. Every process task (engine watcher, stop) is spawned on one
//!   `TaskTracker`, so shutdown stops every engine concurrently and awaits them all
//!   under one deadline. No wait polls: they sleep until a deadline or a wake.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use corral_protocol::ModelId;
use corral_protocol::launch::{EngineLaunch, EngineOptions};
use corral_protocol::openai::ModelCard;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::child::{self, ExitInfo, Tail};
use crate::counters::Counters;
use crate::error::LeaseError;
use crate::event::{Effect, Event, StopHow, StopReason};
pub use crate::lease::Lease;
use crate::policy::{self, Limits, Resident};
use crate::procs::{ExitWatch, Procs, RealProcs};
use crate::registry::ModelEntry;
use crate::settings::ModelSettings;
use crate::slot::{Admit, Slot};
use crate::state::EngineState;
use crate::stop::{StopPolicy, stop_engine};
use crate::tasks;

#[derive(Clone, Debug)]
pub struct PoolConfig {
    pub models: Vec<ModelEntry>,
    pub cap: usize,
    /// Bytes; 0 = no budget.
    pub memory_budget: u64,
    /// Private directory for engine sockets.
    pub runtime_dir: PathBuf,
    /// The engine executable (normally this binary).
    pub engine_program: PathBuf,
    /// What every engine is started with besides its model and socket (a model's
    /// `settings` override parts of it).
    pub engine_options: EngineOptions,
    /// Per-model aliases, pins and option overrides (the config file's `[models.<id>]`).
    pub settings: BTreeMap<ModelId, ModelSettings>,
    /// Longest wait for an engine to become ready.
    pub load_timeout: Duration,
    /// Longest wait for room in the pool (all engines busy).
    pub queue_timeout: Duration,
    /// Drain deadline for the requests of an engine being stopped.
    pub drain_timeout: Duration,
    /// SIGTERM → SIGKILL deadline.
    pub stop_timeout: Duration,
    /// Stop engines idle this long (`None`: keep them).
    pub keep_alive: Option<Duration>,
}

/// One model: its machine plus what the driver and the views keep beside it.
pub(crate) struct Model {
    pub(crate) entry: ModelEntry,
    pub(crate) slot: Slot,
    /// The exit event of the live process (the stop path awaits it).
    pub(crate) exited: Option<ExitWatch>,
    pub(crate) tail: Option<Tail>,
    pub(crate) card: Option<ModelCard>,
    pub(crate) last_exit: Option<ExitInfo>,
    pub(crate) started_at: Option<u64>,
    pub(crate) last_used_at: Option<u64>,
    /// What the live (or last) engine computes on, from its ready line.
    pub(crate) device: Option<String>,
    pub(crate) settings: ModelSettings,
    /// Dropped from the model list by a reload: no longer routed or listed; its engine
    /// drains and stops, then the entry goes.
    pub(crate) retired: bool,
}

impl Model {
    pub(crate) fn new(entry: ModelEntry, settings: ModelSettings, base: &EngineOptions, t: Instant) -> Self {
        let card = crate::card::from_header(&entry, crate::gguf_meta::read(&entry.path), &settings.apply(base));
        Self {
            slot: Slot::new(entry.id.as_str(), t),
            entry,
            exited: None,
            tail: None,
            card: Some(card),
            last_exit: None,
            started_at: None,
            last_used_at: None,
            device: None,
            settings,
            retired: false,
        }
    }

    pub(crate) fn apply(&mut self, id: &ModelId, ev: Event, now: Instant) -> Vec<Effect> {
        let from = self.slot.state();
        let fx = self.slot.on(ev, now);
        let to = self.slot.state();
        if from != to {
            tracing::info!(model = %id, from = from.as_str(), to = to.as_str(), "engine state");
        }
        fx
    }

    /// Model file plus a KV-cache estimate (a quarter of the weights: generous for the
    /// small models a desktop runs, and the pool does not read model files).
    fn bytes(&self) -> u64 {
        self.entry.bytes + self.entry.bytes / 4
    }
}

pub(crate) struct Inner {
    pub(crate) models: BTreeMap<ModelId, Model>,
    /// Live model ids in the order given (the first is listed first).
    pub(crate) order: Vec<ModelId>,
    /// The pool-wide engine options (a reload replaces them for engines started later).
    pub(crate) engine_options: EngineOptions,
    pub(crate) shutting_down: bool,
}

impl Inner {
    /// The live model a name routes to: its id, or one of its aliases.
    pub(crate) fn find(&self, name: &str) -> Option<ModelId> {
        let live = || self.models.iter().filter(|(_, m)| !m.retired);
        live()
            .find(|(k, _)| k.as_str() == name)
            .or_else(|| live().find(|(_, m)| m.settings.aliases.iter().any(|a| a == name)))
            .map(|(k, _)| k.clone())
    }

    /// The only live model, if exactly one is configured.
    pub(crate) fn only(&self) -> Option<ModelId> {
        match self.order.as_slice() {
            [id] => Some(id.clone()),
            _ => None,
        }
    }

    pub(crate) fn known(&self) -> Vec<String> {
        self.order.iter().map(ModelId::to_string).collect()
    }
}

pub(crate) struct Shared {
    pub(crate) cfg: PoolConfig,
    pub(crate) procs: Arc<dyn Procs>,
    inner: Mutex<Inner>,
    pub(crate) changed: Notify,
    pub(crate) counters: Counters,
    tasks: TaskTracker,
    pub(crate) stop: CancellationToken,
}

#[derive(Clone)]
pub struct Pool {
    pub(crate) shared: Arc<Shared>,
}

/// How long a retry waits for the successor of an engine that refused a connection.
pub const AVOID_GRACE: Duration = Duration::from_secs(2);

/// The current time on tokio's clock (paused in tests), as the slots see it.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

impl Pool {
    /// Build the pool over real processes; engines start on demand. Must run inside a
    /// tokio runtime.
    pub fn new(cfg: PoolConfig) -> std::io::Result<Self> {
        let procs = Arc::new(RealProcs::new(cfg.engine_program.clone())?);
        Ok(Self::with_procs(cfg, procs))
    }

    /// Build the pool over any `Procs` (tests use a scripted one).
    pub fn with_procs(cfg: PoolConfig, procs: Arc<dyn Procs>) -> Self {
        let t = now();
        let models = cfg
            .models
            .iter()
            .map(|e| {
                let settings = cfg.settings.get(&e.id).cloned().unwrap_or_default();
                (e.id.clone(), Model::new(e.clone(), settings, &cfg.engine_options, t))
            })
            .collect();
        let order = cfg.models.iter().map(|e| e.id.clone()).collect();
        let inner = Inner { models, order, engine_options: cfg.engine_options.clone(), shutting_down: false };
        let shared = Arc::new(Shared {
            cfg,
            procs,
            inner: Mutex::new(inner),
            changed: Notify::new(),
            counters: Counters::default(),
            tasks: TaskTracker::new(),
            stop: CancellationToken::new(),
        });
        if let Some(ttl) = shared.cfg.keep_alive {
            shared.tasks.spawn(tasks::keep_alive_loop(shared.clone(), ttl));
        }
        Self { shared }
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
        self.shared.lock().only()
    }

    /// Whether a name is a live model's id or alias (no default applies).
    pub fn has(&self, name: &str) -> bool {
        self.shared.lock().find(name).is_some()
    }

    /// The live model ids, in the order given.
    pub fn ids(&self) -> Vec<String> {
        self.shared.lock().known()
    }

    pub fn route(&self, requested: Option<&str>) -> Result<ModelId, LeaseError> {
        let g = self.shared.lock();
        if let Some(id) = requested.and_then(|name| g.find(name)) {
            return Ok(id);
        }
        if let Some(id) = g.only() {
            return Ok(id);
        }
        Err(LeaseError::UnknownModel { requested: requested.map(str::to_owned), known: g.known() })
    }

    /// Start a model's engine now (`--preload`); returns once it is ready.
    pub async fn preload(&self, model: &str) -> Result<(), LeaseError> {
        self.lease(Some(model)).await.map(drop)
    }

    /// Claim a ready engine for `requested`, starting one if needed.
    pub async fn lease(&self, requested: Option<&str>) -> Result<Lease, LeaseError> {
        self.lease_avoiding(requested, None).await
    }

    /// Like `lease`, but not the engine process `avoid` (one that just refused a
    /// connection: its exit is on the way, wait for its successor) — unless it is still
    /// the ready engine after `AVOID_GRACE` (alive but unreachable: the caller then fails
    /// on it instead of waiting for a successor that is not coming).
    pub async fn lease_avoiding(&self, requested: Option<&str>, avoid: Option<u32>) -> Result<Lease, LeaseError> {
        let id = self.route(requested)?;
        let shared = &self.shared;
        let cfg = &shared.cfg;
        let asked = now();
        let deadline = tokio::time::Instant::now() + cfg.queue_timeout.max(cfg.load_timeout);
        let mut waited_on: Option<u64> = None;
        loop {
            let notified = shared.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let mut until = None;
            let fx = {
                let mut g = shared.lock();
                if g.shutting_down {
                    return Err(LeaseError::ShuttingDown);
                }
                let t = now();
                let others_resident = g.models.iter().any(|(k, m)| *k != id && m.slot.state().is_resident());
                let room = has_room(&g, &id, cfg);
                // Routed ids exist unless a reload dropped the model since.
                let Some(m) = g.models.get_mut(&id).filter(|m| !m.retired) else {
                    return Err(LeaseError::UnknownModel { requested: Some(id.to_string()), known: g.known() });
                };
                match m.slot.admit(t, waited_on) {
                    Admit::Grant { proc, .. } if Some(proc.pid) == avoid && t < asked + AVOID_GRACE => {
                        until = Some(asked + AVOID_GRACE);
                        vec![]
                    }
                    Admit::Grant { proc, generation } => {
                        let fx = m.apply(&id, Event::Leased { generation }, t);
                        m.last_used_at = Some(child::unix_secs());
                        drop(g);
                        shared.perform(&id, fx);
                        return Ok(Lease::new(shared.clone(), id, proc.socket, proc.pid, generation));
                    }
                    Admit::Refuse(e) => return Err(e),
                    Admit::Wait { until: u, starting } => {
                        waited_on = starting.or(waited_on);
                        until = u;
                        vec![]
                    }
                    Admit::Start if room => {
                        let fx = m.apply(&id, Event::Start { switch_from: others_resident.then_some(asked) }, t);
                        m.started_at = Some(child::unix_secs());
                        waited_on = m.slot.live_generation();
                        fx
                    }
                    // No room: wait for an engine to finish its requests or stop.
                    Admit::Start => vec![],
                }
            };
            shared.perform(&id, fx);
            if tokio::time::Instant::now() >= deadline {
                return Err(match waited_on {
                    Some(_) => LeaseError::LoadTimeout { model: id.to_string() },
                    None => LeaseError::Overloaded,
                });
            }
            let wake = until.map_or(deadline, |u| tokio::time::Instant::from_std(u).min(deadline));
            let _ = tokio::time::timeout_at(wake, notified).await;
        }
    }

    /// Stop admitting leases and stop every engine at once (each: drain, SIGTERM, SIGKILL
    /// at its deadline). Returns when every engine process is gone.
    pub async fn shutdown(&self) {
        let shared = &self.shared;
        shared.stop_all(StopReason::Shutdown);
        let bound = StopPolicy::new(StopHow::Graceful, shared.cfg.drain_timeout, shared.cfg.stop_timeout).bound();
        if tokio::time::timeout(bound + Duration::from_secs(1), shared.tasks.wait()).await.is_err() {
            tracing::error!("engines still running after the stop deadline; killing them");
            self.kill_all().await;
        }
    }

    /// Kill a hung or broken engine (the proxy saw it stall or answer garbage); it is
    /// respawned on the next request like any crash.
    pub fn recycle(&self, model: &ModelId, pid: u32) {
        tracing::warn!(model = %model, pid, "recycling an unresponsive engine");
        self.shared.step(model, Event::Stop { why: StopReason::Hung, pid: Some(pid) });
    }

    /// SIGKILL every engine group at once (second signal, or past the stop deadline),
    /// even those draining, and return once their exits are reaped (bounded): each
    /// slot decides what it has to kill (`StopReason::Kill`) and the stop path does it.
    pub async fn kill_all(&self) {
        let shared = &self.shared;
        shared.stop_all(StopReason::Kill);
        let _ = tokio::time::timeout(crate::stop::KILL_GRACE, shared.tasks.wait()).await;
    }
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Refuse leases from now on and feed every slot the same stop; the tracker is
    /// closed, so `tasks.wait()` ends once every engine task has.
    fn stop_all(self: &Arc<Self>, why: StopReason) {
        let all: Vec<(ModelId, Vec<Effect>)> = {
            let mut g = self.lock();
            g.shutting_down = true;
            let t = now();
            let stop = || Event::Stop { why, pid: None };
            g.models.iter_mut().map(|(id, m)| (id.clone(), m.apply(id, stop(), t))).collect()
        };
        self.changed.notify_waiters();
        for (id, fx) in all {
            self.perform(&id, fx);
        }
        self.stop.cancel();
        self.tasks.close();
    }

    /// Feed one model's slot an event and perform what it asks for.
    pub(crate) fn step(self: &Arc<Self>, id: &ModelId, ev: Event) {
        let fx = {
            let mut g = self.lock();
            let Some(m) = g.models.get_mut(id) else { return };
            let fx = m.apply(id, ev, now());
            if m.retired && !m.slot.state().is_resident() && m.slot.proc().is_none() {
                tracing::info!(model = %id, "a model dropped by a reload has stopped; forgetting it");
                g.models.remove(id);
            }
            fx
        };
        self.perform(id, fx);
    }

    pub(crate) fn perform(self: &Arc<Self>, id: &ModelId, fx: Vec<Effect>) {
        for e in fx {
            match e {
                Effect::Spawn { generation } => {
                    let launch = {
                        let g = self.lock();
                        let Some(m) = g.models.get(id) else { continue };
                        EngineLaunch {
                            model: m.entry.path.clone(),
                            id: id.clone(),
                            socket: self.cfg.runtime_dir.join(id.socket_name(generation)),
                            options: m.settings.apply(&g.engine_options),
                        }
                    };
                    self.tasks.spawn(tasks::run_engine(self.clone(), id.clone(), generation, launch));
                }
                Effect::Stop { generation, proc, how } => {
                    let exited = {
                        let g = self.lock();
                        g.models
                            .get(id)
                            .filter(|m| m.slot.live_generation() == Some(generation))
                            .and_then(|m| m.exited.clone())
                    };
                    let Some(exited) = exited else { continue };
                    let policy = StopPolicy::new(how, self.cfg.drain_timeout, self.cfg.stop_timeout);
                    let (procs, model) = (self.procs.clone(), id.clone());
                    self.tasks.spawn(async move {
                        tracing::info!(model = %model, pid = proc.pid, ?how, "stopping engine");
                        stop_engine(&*procs, &proc, exited, policy).await;
                    });
                }
                Effect::RemoveSocket(path) => {
                    let _ = std::fs::remove_file(path);
                }
                Effect::Wake => self.changed.notify_waiters(),
                Effect::Count(c) => self.counters.count(c),
                Effect::Switched(d) => self.counters.switched(d),
                Effect::Evict { keep_self } => self.evict_over_limits(keep_self.then_some(id)),
            }
        }
    }

    /// Stop least-recently-used idle engines until the residents fit the limits.
    fn evict_over_limits(self: &Arc<Self>, keep: Option<&ModelId>) {
        let all: Vec<(ModelId, Vec<Effect>)> = {
            let mut g = self.lock();
            if g.shutting_down {
                return;
            }
            let residents: Vec<Resident<ModelId>> = residents(&g).collect();
            let limits = Limits { cap: self.cfg.cap, memory_budget: self.cfg.memory_budget };
            let t = now();
            policy::victims(&residents, keep, &limits)
                .into_iter()
                .filter_map(|id| {
                    let m = g.models.get_mut(&id)?;
                    tracing::info!(model = %id, "evicting the least recently used idle engine");
                    let fx = m.apply(&id, Event::Stop { why: StopReason::Evict, pid: None }, t);
                    Some((id, fx))
                })
                .collect()
        };
        for (id, fx) in all {
            self.perform(&id, fx);
        }
    }
}

/// Engines that hold (or are about to hold) memory, as the policy sees them.
fn residents(g: &Inner) -> impl Iterator<Item = Resident<ModelId>> + '_ {
    g.models.iter().filter(|(_, m)| matches!(m.slot.state(), EngineState::Starting | EngineState::Ready)).map(
        |(k, m)| Resident {
            key: k.clone(),
            starting: m.slot.state() == EngineState::Starting,
            in_flight: m.slot.in_flight(),
            last_used: m.slot.last_used(),
            bytes: m.bytes(),
            pinned: m.settings.pin,
        },
    )
}

fn has_room(g: &Inner, id: &ModelId, cfg: &PoolConfig) -> bool {
    let others: Vec<Resident<ModelId>> = residents(g).filter(|r| r.key != *id).collect();
    let bytes = g.models.get(id).map_or(0, Model::bytes);
    policy::can_start(&others, bytes, &Limits { cap: cfg.cap, memory_budget: cfg.memory_budget })
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
