//! `/metrics`' text from plain values, read back by an independent parser of the text
//! format.

use corral_protocol::engine_wire::{BatchStats, PromptCacheStats};
use prom_text_format_parser::{Scrape as Parsed, Type, ValueType};

use super::*;

fn engine(model: &str, ssd: bool) -> EngineEntry {
    let mut ttft = Histogram::new(&[0.1, 1.0]);
    for v in [0.05, 0.5, 3.0] {
        ttft.observe(v);
    }
    let mut decode = Histogram::new(&[10.0, 100.0]);
    decode.observe(42.0);
    EngineEntry::Live(Box::new(EngineStats {
        model: model.into(),
        prompt_tokens_total: 120,
        generated_tokens_total: 30,
        queue_depth: 2,
        batch: BatchStats { configured: 8, active_rows: 3, pending_rows: 2, ..Default::default() },
        ttft_seconds: ttft,
        decode_tokens_per_second: decode,
        prompt_cache: PromptCacheStats { hits: 4, misses: 1, hit_tokens: 77, bytes: 1 << 20, ..Default::default() },
        ssd_cache: ssd.then(|| SsdCacheStats { restores: 2, bytes: 4096, entries: 3, ..Default::default() }),
        ..Default::default()
    }))
}

fn scrape() -> Scrape {
    let mut requests = RequestCounts::new();
    requests.insert(("/v1/chat/completions", 200), 5);
    requests.insert(("/v1/responses/{id}", 404), 1);
    requests.insert(("other", 404), 2);
    let mut switch_seconds = Histogram::new(&[1.0, 10.0]);
    switch_seconds.observe(2.0);
    let mut engines = BTreeMap::new();
    engines.insert("smol".into(), engine("smol", true));
    engines.insert("gemma".into(), engine("gemma", false));
    engines.insert("hung".into(), EngineEntry::Stale { stale: true, error: "timed out".into() });
    Scrape {
        requests,
        in_flight: 1,
        proxy_errors: 0,
        pool: PoolFigures { resident: 3, spawns: 4, respawns: 1, evictions: 1, crashes: 1, switch_seconds },
        engines,
        upstreams: vec![upstream()],
    }
}

fn upstream() -> UpstreamFigures {
    let mut lat = Histogram::new(&[0.01, 0.1]);
    lat.observe(0.004);
    lat.observe(0.05);
    let replica = |url: &str, up, in_flight, requests, failures, h: &Histogram| ReplicaFigures {
        url: url.into(),
        up,
        in_flight,
        requests,
        failures,
        response_seconds: h.clone(),
    };
    UpstreamFigures {
        model: "big".into(),
        retries: 3,
        replicas: vec![
            replica("http://10.0.0.1:8000", true, 2, 40, 0, &lat),
            replica("https://b.example:443/v1x", false, 0, 7, 5, &Histogram::new(&[0.01, 0.1])),
        ],
    }
}

#[test]
fn upstream_replicas_are_labelled_by_model_and_url() {
    let text = render(scrape()).unwrap();
    let p = Parsed::parse(&text).unwrap_or_else(|e| panic!("{e:?}\n{text}"));
    let get = |name, labels: &[(&str, &str)]| value(&p, name, ValueType::Sample, labels);
    let a = [("model", "big"), ("replica", "http://10.0.0.1:8000")];
    let b = [("model", "big"), ("replica", "https://b.example:443/v1x")];
    assert_eq!((get("corral_upstream_up", &a), get("corral_upstream_up", &b)), (Some(1.0), Some(0.0)));
    assert_eq!(get("corral_upstream_in_flight", &a), Some(2.0));
    assert_eq!(get("corral_upstream_requests_total", &b), Some(7.0));
    assert_eq!(get("corral_upstream_failures_total", &b), Some(5.0));
    assert_eq!(get("corral_upstream_retries_total", &[("model", "big")]), Some(3.0));
    assert_eq!(value(&p, "corral_upstream_response_seconds", ValueType::Count, &a), Some(2.0));
    assert_eq!(value(&p, "corral_upstream_response_seconds", ValueType::Count, &b), Some(0.0));
}

/// The value of `name`'s sample (its `_sum`/`_count` for `kind`) with these labels.
fn value(p: &Parsed, name: &str, kind: ValueType, labels: &[(&str, &str)]) -> Option<f64> {
    let m = p.metrics.iter().find(|m| m.name == name)?;
    m.samples
        .iter()
        .filter(|s| s.value.value_type == kind)
        .find(|s| {
            labels.iter().all(|(k, v)| s.labels.iter().any(|l| l.key == *k && l.value == *v))
                && s.labels.iter().filter(|l| l.key != "le").count() == labels.len()
        })
        .map(|s| s.value.value.as_f64())
}

#[test]
fn every_line_parses_and_says_what_the_values_say() {
    let text = render(scrape()).unwrap();
    let p = Parsed::parse(&text).unwrap_or_else(|e| panic!("{e:?}\n{text}"));
    let get = |name, labels: &[(&str, &str)]| value(&p, name, ValueType::Sample, labels);
    let route = |r, s| [("route", r), ("status", s)];
    assert_eq!(get("corral_http_requests_total", &route("/v1/chat/completions", "200")), Some(5.0));
    assert_eq!(get("corral_http_requests_total", &route("/v1/responses/{id}", "404")), Some(1.0), "braces kept");
    assert_eq!(get("corral_http_requests_in_flight", &[]), Some(1.0));
    assert_eq!(get("corral_engines_resident", &[]), Some(3.0));
    assert_eq!(get("corral_engine_spawns_total", &[]), Some(4.0));
    assert_eq!(get("corral_engine_evictions_total", &[]), Some(1.0));
    assert_eq!(get("corral_engine_crashes_total", &[]), Some(1.0));
    assert_eq!(get("corral_engine_stats_up", &[("model", "smol")]), Some(1.0));
    assert_eq!(get("corral_engine_stats_up", &[("model", "hung")]), Some(0.0));
    assert_eq!(get("corral_generated_tokens_total", &[("model", "gemma")]), Some(30.0));
    assert_eq!(get("corral_generated_tokens_total", &[("model", "hung")]), None, "a stale engine has no figures");
    assert_eq!(get("corral_batch_rows", &[("model", "smol"), ("state", "active")]), Some(3.0));
    assert_eq!(get("corral_batch_rows", &[("model", "smol"), ("state", "pending")]), Some(2.0));
    assert_eq!(get("corral_queue_depth", &[("model", "smol")]), Some(2.0));
    assert_eq!(get("corral_prompt_cache_hit_tokens_total", &[("model", "smol")]), Some(77.0));
    assert_eq!(get("corral_prompt_cache_bytes", &[("model", "smol")]), Some(1048576.0));
    assert_eq!(get("corral_ssd_cache_hits_total", &[("model", "smol")]), Some(2.0));
    assert_eq!(get("corral_ssd_cache_hits_total", &[("model", "gemma")]), None, "no SSD tier, no SSD figures");

    let kinds = |name: &str| p.metrics.iter().find(|m| m.name == name).map(|m| m.kind);
    assert_eq!(kinds("corral_http_requests_total"), Some(Type::Counter));
    assert_eq!(kinds("corral_engines_resident"), Some(Type::Gauge));
    assert_eq!(kinds("corral_ttft_seconds"), Some(Type::Histogram));
    for m in &p.metrics {
        assert!(m.name.starts_with("corral_"), "{}", m.name);
        assert!(m.help_desc.as_deref().is_some_and(|h| h.ends_with('.')), "{} has help", m.name);
        assert_eq!(m.kind == Type::Counter, m.name.ends_with("_total"), "{}", m.name);
    }
}

#[test]
fn histograms_are_cumulative_with_a_sum_a_count_and_an_inf_bucket() {
    let text = render(scrape()).unwrap();
    let p = Parsed::parse(&text).unwrap();
    let smol = [("model", "smol")];
    let h = "corral_ttft_seconds";
    assert_eq!(value(&p, h, ValueType::Count, &smol), Some(3.0));
    assert_eq!(value(&p, h, ValueType::Sum, &smol), Some(3.55));
    let buckets: Vec<(String, f64)> = p
        .metrics
        .iter()
        .find(|m| m.name == h)
        .unwrap()
        .samples
        .iter()
        .filter(|s| s.value.value_type == ValueType::Sample && s.labels.iter().any(|l| l.value == "smol"))
        .map(|s| (s.labels.iter().find(|l| l.key == "le").unwrap().value.clone(), s.value.value.as_f64()))
        .collect();
    assert_eq!(buckets, [("0.1".into(), 1.0), ("1".into(), 2.0), ("+Inf".into(), 3.0)]);
    assert_eq!(value(&p, "corral_decode_rate_tokens_per_second", ValueType::Count, &smol), Some(1.0));
    assert_eq!(value(&p, "corral_model_switch_seconds", ValueType::Count, &[]), Some(1.0));
    assert_eq!(value(&p, "corral_model_switch_seconds", ValueType::Sum, &[]), Some(2.0));
}

#[test]
fn nothing_resident_still_parses_and_a_broken_histogram_is_left_out() {
    let text = render(Scrape::default()).unwrap();
    let p = Parsed::parse(&text).unwrap_or_else(|e| panic!("{e:?}\n{text}"));
    assert_eq!(value(&p, "corral_engines_resident", ValueType::Sample, &[]), Some(0.0));
    assert!(p.metrics.iter().all(|m| m.name != "corral_ttft_seconds" && m.name != "corral_http_requests_total"));

    let mut s = scrape();
    if let Some(EngineEntry::Live(e)) = s.engines.get_mut("smol") {
        e.ttft_seconds.count += 1;
    }
    let text = render(s).unwrap();
    let p = Parsed::parse(&text).unwrap();
    assert_eq!(value(&p, "corral_ttft_seconds", ValueType::Count, &[("model", "smol")]), None);
    assert_eq!(value(&p, "corral_ttft_seconds", ValueType::Count, &[("model", "gemma")]), Some(3.0));
}
