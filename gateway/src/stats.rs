//! Gateway counters for `GET /stats` and `GET /metrics`. Counters only: nothing here
//! decides anything (shutdown waits on `App::in_flight`, a gauge, not on these).
//!
//! Requests are counted once, by (route label, status): `/stats` shows the two sums,
//! `/metrics` the pairs. Route labels are the route table's paths (or `other`), so the
//! map stays small whatever clients send.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use corral_protocol::engine_wire::EngineStats;
use serde::{Deserialize, Serialize};

/// Responses by (route label, status code).
pub type RequestCounts = BTreeMap<(&'static str, u16), u64>;

/// One engine in `/stats`. Read back (by `corral stats`) stale first: every field of
/// `EngineStats` has a default, so any object would read as a live one.
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EngineEntry {
    Stale { stale: bool, error: String },
    Live(Box<EngineStats>),
}

pub struct GatewayStats {
    started: Instant,
    pub proxy_errors: AtomicU64,
    requests: Mutex<RequestCounts>,
}

/// The gateway's part of `/stats` (read back by `corral stats`).
#[derive(Debug, Serialize, Deserialize)]
pub struct GatewayView {
    pub pid: u32,
    pub uptime_s: f64,
    pub requests_total: u64,
    pub requests_by_route: BTreeMap<String, u64>,
    pub responses_by_status: BTreeMap<String, u64>,
    pub in_flight: usize,
    pub proxy_errors: u64,
    pub switches: u64,
    pub last_switch_ms: u64,
    pub spawns: u64,
    pub respawns: u64,
    pub evictions: u64,
    pub crashes: u64,
}

impl GatewayStats {
    pub fn new() -> Self {
        Self { started: Instant::now(), proxy_errors: AtomicU64::new(0), requests: Mutex::new(BTreeMap::new()) }
    }

    /// Count a response by its route label and status.
    pub fn count(&self, route: &'static str, status: u16) {
        *self.requests.lock().unwrap_or_else(|e| e.into_inner()).entry((route, status)).or_default() += 1;
    }

    /// Every (route, status) pair counted so far.
    pub fn requests(&self) -> RequestCounts {
        self.requests.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn view(&self, pool: &corral_pool::counters::Counters, in_flight: usize) -> GatewayView {
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (requests_total, requests_by_route, responses_by_status) = sums(&self.requests());
        GatewayView {
            pid: std::process::id(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            requests_total,
            requests_by_route,
            responses_by_status,
            in_flight,
            proxy_errors: ld(&self.proxy_errors),
            switches: ld(&pool.switches),
            last_switch_ms: ld(&pool.last_switch_ms),
            spawns: ld(&pool.spawns),
            respawns: ld(&pool.respawns),
            evictions: ld(&pool.evictions),
            crashes: ld(&pool.crashes),
        }
    }
}

/// The total, and the counts summed by route and by status.
fn sums(counts: &RequestCounts) -> (u64, BTreeMap<String, u64>, BTreeMap<String, u64>) {
    let (mut by_route, mut by_status) = (BTreeMap::new(), BTreeMap::new());
    for ((route, status), n) in counts {
        *by_route.entry((*route).to_owned()).or_default() += n;
        *by_status.entry(status.to_string()).or_default() += n;
    }
    (counts.values().sum(), by_route, by_status)
}

impl Default for GatewayStats {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_count_per_response_shows_by_route_and_by_status() {
        let s = GatewayStats::new();
        for (route, status) in [("/health", 200), ("/health", 200), ("/v1/models", 200), ("other", 404)] {
            s.count(route, status);
        }
        assert_eq!(s.requests()[&("/health", 200)], 2);
        let (total, by_route, by_status) = sums(&s.requests());
        assert_eq!(total, 4);
        assert_eq!(
            by_route.into_iter().collect::<Vec<_>>(),
            [("/health".to_owned(), 2), ("/v1/models".to_owned(), 1), ("other".to_owned(), 1)]
        );
        assert_eq!(by_status.into_iter().collect::<Vec<_>>(), [("200".to_owned(), 3), ("404".to_owned(), 1)]);
    }
}
