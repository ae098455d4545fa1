//! The gateway's shared state: its configuration, the pool, the upstream models, its
//! counters, the stored Responses, and the two
//! controls shutdown uses — the stop token (no new work is admitted once it is
//! cancelled) and the in-flight gauge (every proxied request, from admission until its
//! last byte is out, so shutdown waits for exactly the work that exists).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use corral_net::CancellationToken;
use corral_net::gauge::Gauge;
use corral_pool::Pool;

use crate::auth::ApiKey;
use crate::cors::Cors;
use crate::guard::Guard;
use crate::stats::GatewayStats;
use crate::stored::{ResponseStore, StoreConfig};
use crate::upstream::Upstreams;

#[derive(Clone, Debug)]
pub struct GatewayConfig {
    pub addr: SocketAddr,
    pub max_body_bytes: usize,
    /// No response head from an engine within this: 504 and the engine is recycled.
    pub engine_timeout: Duration,
    /// No body bytes from an engine for this long mid-response: the response is cut.
    pub stall_timeout: Duration,
    /// How long shutdown lets in-flight requests finish.
    pub drain_timeout: Duration,
    /// Per-engine timeout when `/stats` asks each engine for its counters.
    pub stats_timeout: Duration,
    /// Start these models' engines at startup.
    pub preload: Vec<String>,
    /// Stored Responses (`previous_response_id`).
    pub responses: StoreConfig,
    /// Open the chat page in a browser once listening (an interactive start).
    pub open_ui: bool,
    /// Host names accepted besides the loopback ones (`--allow-host`).
    pub allow_hosts: Vec<String>,
    /// Other origins a browser may call the API from (`--allow-origin`).
    pub cors: Cors,
    /// Required on every route but `/health` and the UI's files (`auth.rs`).
    pub api_key: Option<ApiKey>,
    /// Listen on a non-loopback address without a key anyway.
    pub insecure_no_api_key: bool,
    /// Open client connections at once; at the cap, accepting waits.
    pub max_connections: usize,
    /// A request head must arrive within this (slowloris).
    pub header_timeout: Duration,
    /// A request body with no bytes for this long: 408.
    pub body_timeout: Duration,
    /// Models served by forwarding to another server (`upstream/`).
    pub upstreams: Vec<crate::upstream::spec::UpstreamSpec>,
}

pub struct App {
    pub cfg: GatewayConfig,
    pub pool: Pool,
    /// Upstream models (never in the pool).
    pub upstreams: Upstreams,
    pub stats: GatewayStats,
    pub responses: Arc<ResponseStore>,
    /// Cancelled when shutdown begins.
    pub stop: CancellationToken,
    /// Proxied requests in progress.
    pub in_flight: Arc<Gauge>,
    /// The Host and Origin rules (`guard.rs`), for the address actually bound.
    pub guard: Guard,
    next_request: AtomicU64,
}

impl App {
    /// The gateway's state once it is listening on `bound`.
    pub fn new(cfg: GatewayConfig, pool: Pool, upstreams: Upstreams, bound: SocketAddr) -> Arc<Self> {
        let responses = Arc::new(ResponseStore::open(cfg.responses.clone()));
        let guard = Guard::new(bound, &cfg.allow_hosts, cfg.cors.clone());
        Arc::new(Self {
            guard,
            cfg,
            pool,
            upstreams,
            responses,
            stats: GatewayStats::new(),
            stop: CancellationToken::new(),
            in_flight: Gauge::new(),
            next_request: AtomicU64::new(1),
        })
    }

    /// A short id for log lines of one request.
    pub fn request_id(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }
}
