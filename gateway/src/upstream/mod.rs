//! Upstream models: ids this gateway serves by forwarding to another OpenAI-compatible
//! server (vLLM, SGLang, TGI, llama.cpp's server, another corral), one or more replicas
//! each. The pool never sees them: it neither starts, drains nor evicts them.
//!
//! Layout: `spec` (the configuration, parsed), `health` (a replica's health as a pure
//! state machine), `choose` (which replica a request goes to, pure), `card` (what an
//! upstream reports in its `/v1/models`, and which APIs it serves, pure), `rewrite` (the
//! request as the upstream gets it, pure), `client` (hyper + rustls), `checker` (the
//! periodic health checks), `forward` (a request's way there and back), `view` (what
//! `/engine`, `/stats` and `/metrics` show). This file holds the live state.

pub mod card;
pub mod checker;
pub mod choose;
pub mod client;
pub mod forward;
pub mod health;
pub mod rewrite;
pub mod spec;
pub mod view;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use corral_protocol::histogram::Histogram;
use http::HeaderValue;

use self::card::Reported;
use self::health::{Health, Seen, State};
use self::spec::{Base, UpstreamSpec};

/// Bucket bounds of the time to a response head, seconds.
pub const LATENCY_BOUNDS: [f64; 12] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Time to a response head, as `/engine` and `/metrics` show it.
#[derive(Clone, Debug)]
pub struct Latency {
    pub last_ms: Option<f64>,
    /// Exponentially weighted mean (each new sample weighs 1/8).
    pub mean_ms: Option<f64>,
    pub seconds: Histogram,
}

impl Latency {
    fn new() -> Self {
        Self { last_ms: None, mean_ms: None, seconds: Histogram::new(&LATENCY_BOUNDS) }
    }

    fn observe(&mut self, d: Duration) {
        let ms = d.as_secs_f64() * 1e3;
        self.last_ms = Some(ms);
        self.mean_ms = Some(self.mean_ms.map_or(ms, |m| m + (ms - m) / 8.0));
        self.seconds.observe(d.as_secs_f64());
    }
}

/// One server of an upstream.
pub struct Replica {
    pub base: Base,
    health: Mutex<Health>,
    in_flight: AtomicUsize,
    /// Exchanges that got a response head.
    pub answered: AtomicU64,
    /// Exchanges that failed (connect, before the head, a timeout, mid-body).
    pub failed: AtomicU64,
    latency: Mutex<Latency>,
}

impl Replica {
    fn new(base: Base, now: Instant) -> Self {
        Self {
            base,
            health: Mutex::new(Health::new(now)),
            in_flight: AtomicUsize::new(0),
            answered: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            latency: Mutex::new(Latency::new()),
        }
    }

    pub fn health(&self) -> Health {
        lock(&self.health).clone()
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn latency(&self) -> Latency {
        lock(&self.latency).clone()
    }

    /// Feed the health machine; a change is logged.
    pub fn seen(&self, model: &str, seen: Seen) {
        let mut h = lock(&self.health);
        if let Some(from) = h.on(seen, Instant::now()) {
            let (to, error) = (h.state, h.last_error.clone().unwrap_or_default());
            drop(h);
            if to == State::Down {
                tracing::warn!(model, replica = %self.base, from = from.as_str(), error, "upstream replica out");
            } else {
                tracing::info!(model, replica = %self.base, from = from.as_str(), to = to.as_str(), "upstream replica state");
            }
        }
    }
}

/// A request's claim on a replica: counted in flight until dropped (with the response
/// body, or when the client leaves).
pub struct InFlight(Arc<Upstream>, usize);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.replicas[self.1].in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One upstream model, live.
pub struct Upstream {
    pub spec: UpstreamSpec,
    /// `Authorization: Bearer <key>`, marked sensitive; never shown.
    key: Option<HeaderValue>,
    pub replicas: Vec<Replica>,
    pub client: client::HttpClient,
    reported: Mutex<Option<Reported>>,
    turn: AtomicUsize,
    /// Requests sent on to another replica after one failed before its head.
    pub retries: AtomicU64,
}

impl Upstream {
    /// The live upstream of a spec; its API key is read from the environment now.
    pub fn new(spec: UpstreamSpec) -> Result<Arc<Self>, String> {
        let key = match &spec.api_key_env {
            None => None,
            Some(var) => {
                let v = std::env::var(var).map_err(|_| {
                    format!("upstream {}: api-key-env names {var}, which is not set (or not UTF-8)", spec.id)
                })?;
                Some(
                    rewrite::bearer(&v)
                        .ok_or_else(|| format!("upstream {}: the key in {var} cannot be sent in a header", spec.id))?,
                )
            }
        };
        let tls = spec.replicas.iter().any(Base::is_https);
        let client = client::build(spec.connect_timeout, tls).map_err(|e| format!("upstream {}: {e}", spec.id))?;
        let now = Instant::now();
        let replicas = spec.replicas.iter().map(|b| Replica::new(b.clone(), now)).collect();
        Ok(Arc::new(Self {
            spec,
            key,
            replicas,
            client,
            reported: Mutex::new(None),
            turn: AtomicUsize::new(0),
            retries: AtomicU64::new(0),
        }))
    }

    pub fn id(&self) -> &str {
        self.spec.id.as_str()
    }

    pub fn key(&self) -> Option<&HeaderValue> {
        self.key.as_ref()
    }

    pub fn reported(&self) -> Option<Reported> {
        lock(&self.reported).clone()
    }

    pub(crate) fn set_reported(&self, r: Reported) {
        *lock(&self.reported) = Some(r);
    }

    /// Whether any replica takes requests and one has answered.
    pub fn up(&self) -> bool {
        self.replicas.iter().any(|r| r.health().state == State::Up)
    }

    /// The next replica for a request that has failed on `tried`, counted in flight.
    pub fn claim(self: &Arc<Self>, tried: &[usize]) -> Option<(usize, InFlight)> {
        let candidates: Vec<choose::Candidate> = self
            .replicas
            .iter()
            .enumerate()
            .map(|(i, r)| choose::Candidate {
                usable: r.health().usable(),
                in_flight: r.in_flight(),
                tried: tried.contains(&i),
            })
            .collect();
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        let i = choose::pick(&candidates, turn)?;
        self.replicas[i].in_flight.fetch_add(1, Ordering::Relaxed);
        Some((i, InFlight(self.clone(), i)))
    }

    pub fn observe_latency(&self, replica: usize, d: Duration) {
        lock(&self.replicas[replica].latency).observe(d);
    }

    pub fn in_flight(&self) -> usize {
        self.replicas.iter().map(Replica::in_flight).sum()
    }
}

/// Every upstream model of this gateway.
#[derive(Clone, Default)]
pub struct Upstreams(pub Vec<Arc<Upstream>>);

impl Upstreams {
    pub fn new(specs: Vec<UpstreamSpec>) -> Result<Self, String> {
        specs.into_iter().map(Upstream::new).collect::<Result<_, _>>().map(Self)
    }

    /// The upstream a name routes to: its id, or one of its aliases.
    pub fn find(&self, name: &str) -> Option<&Arc<Upstream>> {
        self.0
            .iter()
            .find(|u| u.id() == name)
            .or_else(|| self.0.iter().find(|u| u.spec.aliases.iter().any(|a| a == name)))
    }

    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|u| u.id())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}
