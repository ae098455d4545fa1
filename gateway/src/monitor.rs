//! `GET /engine` and `/v1/models` (the pool's views with the upstream models beside
//! them), `GET /stats` and `GET /metrics`: the gateway's and the pool's counters plus each ready
//! engine's own (`/admin/stats` on its socket, typed by `protocol::engine_wire::EngineStats`).
//! Engines are asked at once and a slow or dead one is shown as stale after
//! `stats_timeout` instead of holding the answer up. `/stats` is JSON; `/metrics` is the
//! same figures in the Prometheus text format (`metrics.rs` writes it).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use corral_pool::unix_http;
use corral_protocol::engine_wire::EngineStats;
use http::Response;
use serde::{Deserialize, Serialize};

use crate::app::App;
use crate::body::Body;
use crate::metrics::{self, PoolFigures, ReplicaFigures, Scrape, UpstreamFigures};
use crate::respond;
pub use crate::stats::EngineEntry;
use crate::stats::GatewayView;
use crate::upstream::view::{self, UpstreamView};
use crate::upstream::{Upstream, card};
use corral_pool::PoolSnapshot;
use corral_protocol::openai::ModelList;

/// `GET /stats`.
#[derive(Debug, Serialize, Deserialize)]
pub struct StatsView {
    pub gateway: GatewayView,
    pub engines: BTreeMap<String, EngineEntry>,
    /// Upstream models by id.
    #[serde(default)]
    pub upstreams: BTreeMap<String, UpstreamView>,
}

/// `GET /engine`: the pool's snapshot and the upstream models.
#[derive(Debug, Serialize)]
pub struct EnginesView {
    #[serde(flatten)]
    pub pool: PoolSnapshot,
    pub upstreams: Vec<UpstreamView>,
}

pub fn engines_view(app: &App) -> EnginesView {
    let mut pool = app.pool.snapshot();
    // Requests without `model` go to the only model of all, local or upstream.
    pool.pool.default = crate::target::default_model(app);
    EnginesView { pool, upstreams: app.upstreams.0.iter().map(|u| view::of(u)).collect() }
}

/// `GET /v1/models`: the local models, then the upstream ones.
pub fn models(app: &App) -> ModelList {
    let mut list = app.pool.models();
    list.data.extend(app.upstreams.0.iter().map(|u| card::card(u.id(), u.reported().as_ref(), u.up())));
    list
}

fn upstream_views(app: &App) -> BTreeMap<String, UpstreamView> {
    app.upstreams.0.iter().map(|u| (u.id().to_owned(), view::of(u))).collect()
}

async fn engine_stats(socket: std::path::PathBuf, timeout: std::time::Duration) -> EngineEntry {
    let stale = |error: String| EngineEntry::Stale { stale: true, error };
    match unix_http::call(&socket, "GET", "/admin/stats", Bytes::new(), timeout).await {
        Ok((200, body)) => match serde_json::from_slice::<EngineStats>(&body) {
            Ok(s) => EngineEntry::Live(Box::new(s)),
            Err(e) => stale(format!("unreadable stats: {e}")),
        },
        Ok((status, _)) => stale(format!("status {status}")),
        Err(e) => stale(e.to_string()),
    }
}

/// Every ready engine's stats, asked at once, each within `stats_timeout`.
async fn engines(app: &App) -> BTreeMap<String, EngineEntry> {
    let timeout = app.cfg.stats_timeout;
    let mut set = tokio::task::JoinSet::new();
    for (model, socket) in app.pool.ready_sockets() {
        set.spawn(async move { (model, engine_stats(socket, timeout).await) });
    }
    let mut engines = BTreeMap::new();
    while let Some(r) = set.join_next().await {
        if let Ok((m, e)) = r {
            engines.insert(m, e);
        }
    }
    engines
}

pub async fn stats_route(app: &Arc<App>) -> Response<Body> {
    let gateway = app.stats.view(app.pool.counters(), app.in_flight.get());
    let engines = engines(app).await;
    let upstreams = upstream_views(app);
    respond::json(serde_json::to_string(&StatsView { gateway, engines, upstreams }).unwrap_or_default())
}

pub async fn metrics_route(app: &Arc<App>) -> Response<Body> {
    let c = app.pool.counters();
    let ld = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let pool = PoolFigures {
        resident: app.pool.snapshot().pool.resident.len(),
        spawns: ld(&c.spawns),
        respawns: ld(&c.respawns),
        evictions: ld(&c.evictions),
        crashes: ld(&c.crashes),
        switch_seconds: c.switch_seconds(),
    };
    let scrape = Scrape {
        requests: app.stats.requests(),
        in_flight: app.in_flight.get(),
        proxy_errors: ld(&app.stats.proxy_errors),
        pool,
        engines: engines(app).await,
        upstreams: app.upstreams.0.iter().map(|u| upstream_figures(u)).collect(),
    };
    match metrics::render(scrape) {
        Ok(text) => respond::text(metrics::CONTENT_TYPE, text),
        Err(e) => {
            tracing::error!(error = %e, "metrics could not be written");
            let e =
                corral_protocol::ApiError::new(corral_protocol::ErrorKind::Internal, "metrics could not be written");
            respond::error(corral_protocol::ApiShape::OpenAi, &e)
        }
    }
}

fn upstream_figures(u: &Upstream) -> UpstreamFigures {
    use std::sync::atomic::Ordering::Relaxed;
    UpstreamFigures {
        model: u.id().to_owned(),
        retries: u.retries.load(Relaxed),
        replicas: u
            .replicas
            .iter()
            .map(|r| ReplicaFigures {
                url: r.base.to_string(),
                up: r.health().state == crate::upstream::health::State::Up,
                in_flight: r.in_flight() as u64,
                requests: r.answered.load(Relaxed),
                failures: r.failed.load(Relaxed),
                response_seconds: r.latency().seconds,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stats_answer_reads_back_with_its_stale_engines_stale() {
        let json = r#"{"gateway":{"pid":1,"uptime_s":2.5,"requests_total":3,"requests_by_route":{"/stats":3},
            "responses_by_status":{"200":3},"in_flight":0,"proxy_errors":0,"switches":0,"last_switch_ms":0,
            "spawns":1,"respawns":0,"evictions":0,"crashes":0},
            "engines":{"a":{"model":"a","pid":7,"requests_total":4},"b":{"stale":true,"error":"timed out"}}}"#;
        let v: StatsView = serde_json::from_str(json).unwrap();
        assert_eq!(v.gateway.requests_by_route["/stats"], 3);
        assert!(matches!(&v.engines["a"], EngineEntry::Live(s) if s.pid == 7 && s.requests_total == 4));
        assert!(matches!(&v.engines["b"], EngineEntry::Stale { error, .. } if error == "timed out"));
        let again: serde_json::Value = serde_json::to_value(&v).unwrap();
        assert_eq!(again["engines"]["b"], serde_json::json!({"stale": true, "error": "timed out"}));
    }
}
