//! `GET /metrics`: the Prometheus text exposition format (0.0.4), written by the
//! Prometheus project's `prometheus-client` encoder from a `Scrape` — plain values the
//! gateway, the pool and each ready engine already keep for `/stats`. Pure: gathering
//! the values (the engines are asked over their sockets) is `monitor.rs`'s job.
//!
//! Names follow Prometheus' conventions: the `corral_` prefix, `_total` on counters
//! (added by the encoder), base units in the name (`_seconds`, `_bytes`). Engine metrics
//! carry a `model` label and are the engine's own: they start at zero with each engine
//! process (an eviction, a crash) and are absent while the model has no ready engine,
//! as any restarted process's counters. `docs/service.md` lists every metric.

use std::collections::BTreeMap;
use std::fmt;

use corral_protocol::engine_wire::{EngineStats, SsdCacheStats};
use corral_protocol::histogram::Histogram;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::stats::{EngineEntry, RequestCounts};

/// The `Content-Type` of the text format.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The pool's figures at the time of a scrape.
#[derive(Debug, Default)]
pub struct PoolFigures {
    /// Engines holding a process: starting, ready or draining.
    pub resident: usize,
    pub spawns: u64,
    pub respawns: u64,
    pub evictions: u64,
    pub crashes: u64,
    pub switch_seconds: Histogram,
}

/// One replica of an upstream model at the time of a scrape.
#[derive(Debug, Default)]
pub struct ReplicaFigures {
    /// Its base URL (never holds credentials).
    pub url: String,
    pub up: bool,
    pub in_flight: u64,
    pub requests: u64,
    pub failures: u64,
    pub response_seconds: Histogram,
}

/// One upstream model at the time of a scrape.
#[derive(Debug, Default)]
pub struct UpstreamFigures {
    pub model: String,
    pub retries: u64,
    pub replicas: Vec<ReplicaFigures>,
}

/// Everything one `/metrics` answer shows.
#[derive(Debug, Default)]
pub struct Scrape {
    pub requests: RequestCounts,
    /// Proxied requests from admission to their last byte.
    pub in_flight: usize,
    pub proxy_errors: u64,
    pub pool: PoolFigures,
    /// Each ready engine's `/admin/stats`, or why it did not answer.
    pub engines: BTreeMap<String, EngineEntry>,
    pub upstreams: Vec<UpstreamFigures>,
}

/// The exposition text of one scrape.
pub fn render(scrape: Scrape) -> Result<String, fmt::Error> {
    let mut registry = Registry::with_prefix("corral");
    registry.register_collector(Box::new(Families(scrape)));
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)?;
    Ok(out)
}

type Labels = Vec<(&'static str, String)>;

fn model(m: &str) -> Labels {
    vec![("model", m.to_owned())]
}

/// Per-engine counters: name (the encoder adds `_total`), help, value.
type EngineFigure = (&'static str, &'static str, fn(&EngineStats) -> u64);

const ENGINE_COUNTERS: [EngineFigure; 5] = [
    ("prompt_tokens", "Prompt tokens of finished requests, cached ones included.", |e| e.prompt_tokens_total),
    ("generated_tokens", "Tokens generated.", |e| e.generated_tokens_total),
    ("prompt_cache_hits", "Requests that reused a cached prefix, from RAM or from the SSD tier.", |e| {
        e.prompt_cache.hits
    }),
    ("prompt_cache_misses", "Requests that reused no cached prefix.", |e| e.prompt_cache.misses),
    ("prompt_cache_hit_tokens", "Prompt tokens read from the prompt cache instead of computed.", |e| {
        e.prompt_cache.hit_tokens
    }),
];

const ENGINE_GAUGES: [EngineFigure; 6] = [
    ("queue_depth", "Requests waiting to join the generation batch.", |e| e.queue_depth as u64),
    ("batch_rows_max", "Rows the generation batch may hold (--batch).", |e| e.batch.configured as u64),
    ("engine_resident_memory_bytes", "Resident set size of the engine process.", |e| e.memory.rss_bytes),
    ("prompt_cache_bytes", "Bytes held by the RAM prompt cache.", |e| e.prompt_cache.bytes),
    ("prompt_cache_max_bytes", "The RAM prompt cache's capacity (--prompt-cache).", |e| e.prompt_cache.max_bytes),
    ("prompt_cache_entries", "Entries in the RAM prompt cache.", |e| e.prompt_cache.entries as u64),
];

type SsdFigure = (&'static str, &'static str, fn(&SsdCacheStats) -> u64);

const SSD_COUNTERS: [SsdFigure; 4] = [
    ("ssd_cache_hits", "Prompt-cache hits restored from the SSD tier.", |s| s.restores),
    ("ssd_cache_writes", "Prompt-cache entries written to the SSD tier.", |s| s.spills),
    ("ssd_cache_write_failures", "SSD-tier writes that failed or were dropped from a full queue.", |s| {
        s.failed_spills + s.dropped_spills
    }),
    ("ssd_cache_rejected_files", "SSD-tier files refused on reading (corrupt, or another model's).", |s| {
        s.rejected_files
    }),
];

const SSD_GAUGES: [SsdFigure; 3] = [
    ("ssd_cache_bytes", "Bytes of prompt-cache files in the SSD tier.", |s| s.bytes),
    ("ssd_cache_max_bytes", "The SSD tier's capacity (--ssd-cache-max).", |s| s.max_bytes),
    ("ssd_cache_entries", "Prompt-cache files in the SSD tier.", |s| s.entries as u64),
];

#[derive(Debug)]
struct Families(Scrape);

impl Families {
    fn live(&self) -> impl Iterator<Item = (&str, &EngineStats)> {
        self.0.engines.iter().filter_map(|(m, e)| match e {
            EngineEntry::Live(s) => Some((m.as_str(), &**s)),
            EngineEntry::Stale { .. } => None,
        })
    }

    fn ssd(&self) -> impl Iterator<Item = (&str, &SsdCacheStats)> {
        self.live().filter_map(|(m, e)| Some((m, e.ssd_cache.as_ref()?)))
    }

    fn replicas(&self) -> impl Iterator<Item = (Labels, &ReplicaFigures)> {
        self.0
            .upstreams
            .iter()
            .flat_map(|u| u.replicas.iter().map(|r| (vec![("model", u.model.clone()), ("replica", r.url.clone())], r)))
    }

    /// The upstream models' families.
    fn encode_upstreams(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let per = |f: fn(&ReplicaFigures) -> u64| self.replicas().map(move |(l, r)| (l, f(r)));
        gauge(
            e,
            "upstream_up",
            "1 while an upstream replica takes requests (its last check or request succeeded).",
            per(|r| u64::from(r.up)),
        )?;
        gauge(e, "upstream_in_flight", "Requests in flight on an upstream replica.", per(|r| r.in_flight))?;
        counter(
            e,
            "upstream_requests",
            "Exchanges with an upstream replica that got a response head.",
            per(|r| r.requests),
        )?;
        counter(
            e,
            "upstream_failures",
            "Exchanges with an upstream replica that failed (before the head, a timeout, mid-body).",
            per(|r| r.failures),
        )?;
        let retries = self.0.upstreams.iter().map(|u| (model(&u.model), u.retries));
        counter(
            e,
            "upstream_retries",
            "Requests sent on to another replica after one failed before answering.",
            retries,
        )?;
        let lat = self.replicas().map(|(l, r)| (l, &r.response_seconds));
        histogram(
            e,
            "upstream_response_seconds",
            "Time from sending a request to an upstream replica to its response head.",
            lat,
        )
    }
}

impl Collector for Families {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let s = &self.0;
        let e = &mut enc;
        let requests = s
            .requests
            .iter()
            .map(|((route, status), n)| (vec![("route", (*route).to_owned()), ("status", status.to_string())], *n));
        counter(e, "http_requests", "HTTP responses by route (the route table's path) and status code.", requests)?;
        gauge(
            e,
            "http_requests_in_flight",
            "Proxied requests from admission to their last byte.",
            [(vec![], s.in_flight as u64)],
        )?;
        counter(
            e,
            "proxy_errors",
            "Proxied requests that failed on the engine's or the gateway's side.",
            [(vec![], s.proxy_errors)],
        )?;

        let p = &s.pool;
        gauge(
            e,
            "engines_resident",
            "Engines holding a process (starting, ready or draining).",
            [(vec![], p.resident as u64)],
        )?;
        counter(e, "engine_spawns", "Engine processes started.", [(vec![], p.spawns)])?;
        counter(e, "engine_respawns", "Engine processes started again after a crash.", [(vec![], p.respawns)])?;
        counter(
            e,
            "engine_evictions",
            "Engines stopped for another model or idle past their keep-alive.",
            [(vec![], p.evictions)],
        )?;
        counter(e, "engine_crashes", "Engine processes that died unexpectedly.", [(vec![], p.crashes)])?;
        histogram(
            e,
            "model_switch_seconds",
            "Model switches: from the request that needed another model to its engine being ready.",
            [(vec![], &p.switch_seconds)],
        )?;

        let up = s.engines.iter().map(|(m, en)| (model(m), u64::from(matches!(en, EngineEntry::Live(_)))));
        gauge(e, "engine_stats_up", "1 when a ready engine answered for its stats in time, else 0.", up)?;
        let ttft = self.live().map(|(m, st)| (model(m), &st.ttft_seconds));
        histogram(e, "ttft_seconds", "Time to first token: from a request's arrival at its engine.", ttft)?;
        let decode = self.live().map(|(m, st)| (model(m), &st.decode_tokens_per_second));
        histogram(e, "decode_rate_tokens_per_second", "Decode rate of each request (two tokens or more).", decode)?;
        let rows = self.live().flat_map(|(m, st)| {
            [("active", st.batch.active_rows), ("pending", st.batch.pending_rows)]
                .map(|(state, n)| (vec![("model", m.to_owned()), ("state", state.to_owned())], n as u64))
        });
        gauge(e, "batch_rows", "Rows generating (active) and waiting to join (pending) the batch.", rows)?;
        for (name, help, f) in ENGINE_COUNTERS {
            counter(e, name, help, self.live().map(|(m, st)| (model(m), f(st))))?;
        }
        for (name, help, f) in ENGINE_GAUGES {
            gauge(e, name, help, self.live().map(|(m, st)| (model(m), f(st))))?;
        }
        for (name, help, f) in SSD_COUNTERS {
            counter(e, name, help, self.ssd().map(|(m, st)| (model(m), f(st))))?;
        }
        for (name, help, f) in SSD_GAUGES {
            gauge(e, name, help, self.ssd().map(|(m, st)| (model(m), f(st))))?;
        }
        self.encode_upstreams(e)
    }
}

// A family with no samples is left out: nothing to say, and some parsers refuse it.

fn counter(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels, u64)>,
) -> fmt::Result {
    family(enc, name, help, MetricType::Counter, rows, |v, m| ConstCounter::new(v).encode(m))
}

fn gauge(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels, u64)>,
) -> fmt::Result {
    family(enc, name, help, MetricType::Gauge, rows, |v, m| ConstGauge::new(v).encode(m))
}

/// One family of plain values: its descriptor, then a sample per labelled row.
fn family(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    rows: impl IntoIterator<Item = (Labels, u64)>,
    sample: impl Fn(u64, MetricEncoder) -> fmt::Result,
) -> fmt::Result {
    let rows: Vec<_> = rows.into_iter().collect();
    if rows.is_empty() {
        return Ok(());
    }
    let mut m = enc.encode_descriptor(name, help, None, kind)?;
    for (labels, v) in rows {
        sample(v, m.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Histograms whose shape does not hold (an engine that sent nonsense) are skipped.
fn histogram<'h>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels, &'h Histogram)>,
) -> fmt::Result {
    let rows: Vec<_> = rows.into_iter().filter(|(_, h)| h.is_consistent()).collect();
    if rows.is_empty() {
        return Ok(());
    }
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (labels, h) in rows {
        let buckets: Vec<(f64, u64)> = h.buckets().collect();
        m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(h.sum, h.count, &buckets, None)?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
