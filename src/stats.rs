//! `corral stats`: a running gateway's `/stats` for a person — the gateway's requests,
//! the pool's spawns, evictions and switches, and each ready engine's requests, tokens,
//! speed, memory and caches. `--json` prints the answer as the gateway sent it. The text
//! is a pure function of the parsed answer.

use std::fmt::Write;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use corral_gateway::monitor::{EngineEntry, StatsView};
use corral_gateway::stats::GatewayView;
use corral_protocol::engine_wire::EngineStats;

use crate::client::{Target, block_on};
use crate::human::{bytes, count, duration, plural};

/// The gateway bounds each engine's answer (500 ms by default).
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Args)]
pub struct StatsArgs {
    #[command(flatten)]
    target: Target,
    /// Print the gateway's JSON answer as it came (as `fit --json`, no env var: an
    /// exported one would change what a person reads).
    #[arg(long)]
    json: bool,
}

pub fn stats(args: StatsArgs) -> Result<()> {
    let gw = args.target.gateway()?;
    let body = block_on(gw.get("/stats", TIMEOUT))?;
    if args.json {
        println!("{}", String::from_utf8_lossy(&body).trim_end());
        return Ok(());
    }
    let view: StatsView = serde_json::from_slice(&body).context("reading the gateway's /stats answer")?;
    print!("{}", render(&view));
    Ok(())
}

/// The summary: the gateway and the pool, then one block per engine.
pub fn render(v: &StatsView) -> String {
    let mut out = gateway(&v.gateway);
    for (model, e) in &v.engines {
        out.push('\n');
        match e {
            EngineEntry::Live(s) => out.push_str(&engine(model, s)),
            EngineEntry::Stale { error, .. } => {
                let _ = writeln!(out, "{model}: no stats ({error})");
            }
        }
    }
    if v.engines.is_empty() {
        out.push_str("\nno engine is ready\n");
    }
    out
}

/// `label  value` lines under a heading, labels padded to one width.
fn block(heading: String, rows: &[(&str, String)]) -> String {
    let width = rows.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    let mut out = heading + "\n";
    for (label, value) in rows {
        let _ = writeln!(out, "  {label:<width$}  {value}");
    }
    out
}

/// `a 3 · b 1`, in the map's order.
fn listed<'a>(m: impl IntoIterator<Item = (&'a String, &'a u64)>) -> String {
    let parts: Vec<String> = m.into_iter().map(|(k, n)| format!("{k} {}", count(*n))).collect();
    if parts.is_empty() { "-".into() } else { parts.join(" · ") }
}

fn gateway(g: &GatewayView) -> String {
    let switches = match g.switches {
        0 => "no switches".to_owned(),
        n => format!(
            "{}, the last {}",
            plural(n, "switch", "switches"),
            duration(Duration::from_millis(g.last_switch_ms))
        ),
    };
    block(
        format!("gateway: pid {}, up {}", g.pid, duration(Duration::from_secs_f64(g.uptime_s.max(0.0)))),
        &[
            (
                "requests",
                format!(
                    "{}, {} in flight, {}",
                    count(g.requests_total),
                    g.in_flight,
                    plural(g.proxy_errors, "proxy error", "proxy errors")
                ),
            ),
            ("by route", listed(&g.requests_by_route)),
            ("by status", listed(&g.responses_by_status)),
            (
                "engines",
                format!(
                    "{}{}, {}, {}; {switches}",
                    plural(g.spawns, "spawn", "spawns"),
                    if g.respawns > 0 { format!(" ({} after a crash)", count(g.respawns)) } else { String::new() },
                    plural(g.evictions, "eviction", "evictions"),
                    plural(g.crashes, "crash", "crashes"),
                ),
            ),
        ],
    )
}

fn engine(model: &str, s: &EngineStats) -> String {
    let device = if s.device.kind.is_empty() { String::new() } else { format!(" on {}", s.device.kind) };
    let draining = if s.draining { ", draining" } else { "" };
    let heading = format!(
        "{model}: pid {}{device}, up {}{draining}",
        s.pid,
        duration(Duration::from_secs_f64(s.uptime_s.max(0.0)))
    );
    let b = &s.batch;
    let mut rows = vec![
        (
            "requests",
            format!(
                "{} ({} failed, {} cancelled); {} queued of {}; batch {} of {} rows",
                count(s.requests_total),
                count(s.requests_failed),
                count(s.requests_cancelled),
                s.queue_depth,
                s.max_queue,
                b.active_rows,
                b.configured
            ),
        ),
        ("tokens", format!("{} prompt, {} generated", count(s.prompt_tokens_total), count(s.generated_tokens_total))),
        (
            "speed",
            format!(
                "prefill {:.1} tok/s, decode {:.1} tok/s (moving averages)",
                s.avg.prefill_tok_s, s.avg.decode_tok_s
            ),
        ),
    ];
    let t = &s.ttft_seconds;
    if t.count > 0 {
        let mean = Duration::from_secs_f64((t.sum / t.count as f64).max(0.0));
        rows.push((
            "first token",
            format!("{} on average over {}", duration(mean), plural(t.count, "request", "requests")),
        ));
    }
    rows.push(("memory", format!("{} resident", bytes(s.memory.rss_bytes))));
    let pc = &s.prompt_cache;
    rows.push((
        "prompt cache",
        format!(
            "{} of {}, {}; {}, {}, {} tokens reused",
            bytes(pc.bytes),
            bytes(pc.max_bytes),
            plural(pc.entries as u64, "entry", "entries"),
            plural(pc.hits, "hit", "hits"),
            plural(pc.misses, "miss", "misses"),
            count(pc.hit_tokens)
        ),
    ));
    rows.push((
        "ssd tier",
        match &s.ssd_cache {
            None => "off".to_owned(),
            Some(d) if !d.usable => format!("unusable: {}", d.error.as_deref().unwrap_or("unknown error")),
            Some(d) => format!(
                "{} of {}, {}; {}, {}",
                bytes(d.bytes),
                bytes(d.max_bytes),
                plural(d.entries as u64, "file", "files"),
                plural(d.restores, "restore", "restores"),
                plural(d.spills, "write", "writes")
            ),
        },
    ));
    block(heading, &rows)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use corral_protocol::engine_wire::{BatchStats, DeviceStats, Memory, PromptCacheStats, SsdCacheStats};
    use corral_protocol::histogram::Histogram;

    use super::*;

    fn view() -> StatsView {
        let gateway = GatewayView {
            pid: 1234,
            uptime_s: 7_380.0,
            requests_total: 1_057,
            requests_by_route: BTreeMap::from([("/engine".to_owned(), 7), ("/v1/chat/completions".to_owned(), 1_050)]),
            responses_by_status: BTreeMap::from([("200".to_owned(), 1_055), ("404".to_owned(), 2)]),
            in_flight: 1,
            proxy_errors: 0,
            switches: 1,
            last_switch_ms: 1_250,
            spawns: 3,
            respawns: 1,
            evictions: 1,
            crashes: 1,
        };
        let mut ttft = Histogram::new(&[1.0]);
        ttft.observe(0.2);
        ttft.observe(0.4);
        let smol = EngineStats {
            model: "smol".into(),
            pid: 4242,
            uptime_s: 303.0,
            requests_total: 50,
            requests_cancelled: 1,
            prompt_tokens_total: 12_345,
            generated_tokens_total: 6_789,
            max_queue: 64,
            batch: BatchStats { configured: 8, active_rows: 1, ..Default::default() },
            avg: corral_protocol::engine_wire::Averages { prefill_tok_s: 512.34, decode_tok_s: 45.21 },
            ttft_seconds: ttft,
            memory: Memory { rss_bytes: 189_000_000, ..Default::default() },
            device: DeviceStats { kind: "cpu".into(), ..Default::default() },
            prompt_cache: PromptCacheStats {
                entries: 12,
                bytes: 35_651_584,
                max_bytes: 8 << 30,
                hits: 30,
                misses: 5,
                hit_tokens: 12_000,
            },
            ssd_cache: Some(SsdCacheStats {
                usable: true,
                entries: 1,
                bytes: 2048,
                max_bytes: 1 << 30,
                restores: 3,
                spills: 1,
                ..Default::default()
            }),
            ..Default::default()
        };
        let engines = BTreeMap::from([
            ("gemma".to_owned(), EngineEntry::Stale { stale: true, error: "timed out".into() }),
            ("smol".to_owned(), EngineEntry::Live(Box::new(smol))),
        ]);
        StatsView { gateway, engines, upstreams: Default::default() }
    }

    #[test]
    fn the_summary_reads_as_sentences_per_part() {
        let want = "\
gateway: pid 1234, up 2h 3m
  requests   1,057, 1 in flight, 0 proxy errors
  by route   /engine 7 · /v1/chat/completions 1,050
  by status  200 1,055 · 404 2
  engines    3 spawns (1 after a crash), 1 eviction, 1 crash; 1 switch, the last 1.2s

gemma: no stats (timed out)

smol: pid 4242 on cpu, up 5m 3s
  requests      50 (0 failed, 1 cancelled); 0 queued of 64; batch 1 of 8 rows
  tokens        12,345 prompt, 6,789 generated
  speed         prefill 512.3 tok/s, decode 45.2 tok/s (moving averages)
  first token   0.3s on average over 2 requests
  memory        180.2 MiB resident
  prompt cache  34.0 MiB of 8.0 GiB, 12 entries; 30 hits, 5 misses, 12,000 tokens reused
  ssd tier      2.0 KiB of 1.0 GiB, 1 file; 3 restores, 1 write
";
        assert_eq!(render(&view()), want);
    }

    #[test]
    fn no_engine_and_an_unusable_ssd_tier_say_so() {
        let mut v = view();
        v.engines.clear();
        assert!(render(&v).ends_with("\nno engine is ready\n"), "{}", render(&v));
        let mut v = view();
        if let Some(EngineEntry::Live(s)) = v.engines.get_mut("smol") {
            s.ssd_cache = Some(SsdCacheStats {
                usable: false,
                error: Some("read-only file system".into()),
                ..Default::default()
            });
            s.ttft_seconds = Histogram::default();
        }
        let text = render(&v);
        assert!(text.contains("  ssd tier      unusable: read-only file system\n"), "{text}");
        assert!(!text.contains("first token"), "no request yet, no mean: {text}");
    }
}
