//! Gateway counters for `GET /stats`. Counters only: nothing here decides anything
//! (shutdown waits on `App::in_flight`, a gauge, not on these).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde::Serialize;

pub struct GatewayStats {
    started: Instant,
    pub requests_total: AtomicU64,
    pub proxy_errors: AtomicU64,
    by_route: Mutex<BTreeMap<String, u64>>,
    by_status: Mutex<BTreeMap<u16, u64>>,
}

#[derive(Serialize)]
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
        Self {
            started: Instant::now(),
            requests_total: AtomicU64::new(0),
            proxy_errors: AtomicU64::new(0),
            by_route: Mutex::new(BTreeMap::new()),
            by_status: Mutex::new(BTreeMap::new()),
        }
    }

    /// Count a request by route (known routes only, so the map stays small).
    pub fn count(&self, route: &str, status: u16) {
        self.requests_total.fetch_add(1, Ordering::Relaxed);
        *self.by_route.lock().unwrap_or_else(|e| e.into_inner()).entry(route.to_owned()).or_default() += 1;
        *self.by_status.lock().unwrap_or_else(|e| e.into_inner()).entry(status).or_default() += 1;
    }

    pub fn view(&self, pool: &corral_pool::pool::Counters, in_flight: usize) -> GatewayView {
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        GatewayView {
            pid: std::process::id(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            requests_total: ld(&self.requests_total),
            requests_by_route: self.by_route.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            responses_by_status: self
                .by_status
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
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

impl Default for GatewayStats {
    fn default() -> Self {
        Self::new()
    }
}
