//! `corral ps`: the engines a running gateway holds, as `ollama ps` lists loaded models —
//! model, state, pid, device, memory, requests in flight, uptime and how long it stays.
//! Read from the gateway's `/engine` (pool and engine states) and `/stats` (each engine's
//! resident memory); the table is a pure function of those answers and the time.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use corral_gateway::monitor::{EngineEntry, StatsView};
use serde::Deserialize;

use crate::client::{Target, block_on};
use crate::human;

/// `/engine` and `/stats` answer within the gateway's own per-engine deadline.
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Args)]
pub struct PsArgs {
    #[command(flatten)]
    target: Target,
}

/// The parts of `GET /engine` shown here.
#[derive(Debug, Deserialize)]
pub struct Snapshot {
    pub pool: PoolInfo,
    pub engines: Vec<EngineInfo>,
}

#[derive(Debug, Deserialize)]
pub struct PoolInfo {
    pub cap: usize,
    #[serde(default)]
    pub keep_alive_s: Option<u64>,
}

#[derive(Debug, Deserialize)]
pub struct EngineInfo {
    pub model: String,
    pub state: String,
    pub pid: Option<u32>,
    #[serde(default)]
    pub device: Option<String>,
    #[serde(default)]
    pub in_flight: usize,
    pub started_at: Option<u64>,
    pub last_used_at: Option<u64>,
}

pub fn ps(args: PsArgs) -> Result<()> {
    let gw = args.target.gateway()?;
    let (engine, stats) =
        block_on(async { Ok((gw.get("/engine", TIMEOUT).await?, gw.get("/stats", TIMEOUT).await?)) })?;
    let snap: Snapshot = serde_json::from_slice(&engine).context("reading the gateway's /engine answer")?;
    let stats: StatsView = serde_json::from_slice(&stats).context("reading the gateway's /stats answer")?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    print!("{}", render(&snap, &resident_memory(&stats), now));
    Ok(())
}

/// Resident bytes of each engine that answered for its stats.
fn resident_memory(v: &StatsView) -> BTreeMap<String, u64> {
    v.engines
        .iter()
        .filter_map(|(m, e)| match e {
            EngineEntry::Live(s) => Some((m.clone(), s.memory.rss_bytes)),
            EngineEntry::Stale { .. } => None,
        })
        .collect()
}

/// The table (or a line saying nothing runs). `rss`: resident bytes by model, for the
/// engines that answered for their stats; `now`: Unix seconds.
pub fn render(snap: &Snapshot, rss: &BTreeMap<String, u64>, now: u64) -> String {
    let shown: Vec<&EngineInfo> = snap.engines.iter().filter(|e| e.state != "stopped").collect();
    if shown.is_empty() {
        let n = snap.engines.len() as u64;
        return format!(
            "no engines running ({} known; `corral load MODEL` starts one)\n",
            human::plural(n, "model", "models")
        );
    }
    let lru = next_to_evict(snap);
    let rows: Vec<Vec<String>> = shown
        .iter()
        .map(|e| {
            let resident = matches!(e.state.as_str(), "starting" | "ready" | "draining");
            vec![
                e.model.clone(),
                e.state.clone(),
                e.pid.map_or("-".into(), |p| p.to_string()),
                e.device.clone().unwrap_or_else(|| "-".into()),
                rss.get(&e.model).map_or("-".into(), |b| human::bytes(*b)),
                e.in_flight.to_string(),
                match e.started_at {
                    Some(t) if resident => human::duration(Duration::from_secs(now.saturating_sub(t))),
                    _ => "-".into(),
                },
                until(e, &snap.pool, lru, now),
            ]
        })
        .collect();
    crate::table::render(&["NAME", "STATE", "PID", "DEVICE", "MEMORY", "IN-FLIGHT", "UPTIME", "UNTIL"], &rows)
}

/// The engine the pool stops first when another model needs room: the least recently
/// used idle ready one, once the pool is full.
fn next_to_evict(snap: &Snapshot) -> Option<&str> {
    let resident = snap.engines.iter().filter(|e| matches!(e.state.as_str(), "starting" | "ready" | "draining"));
    if resident.count() < snap.pool.cap {
        return None;
    }
    snap.engines
        .iter()
        .filter(|e| e.state == "ready" && e.in_flight == 0)
        .min_by_key(|e| e.last_used_at.unwrap_or(0))
        .map(|e| e.model.as_str())
}

/// How long a ready engine stays: its keep-alive countdown, or until the pool needs room.
fn until(e: &EngineInfo, pool: &PoolInfo, lru: Option<&str>, now: u64) -> String {
    if e.state != "ready" {
        return "-".into();
    }
    if e.in_flight > 0 {
        return "in use".into();
    }
    match pool.keep_alive_s {
        Some(ttl) => {
            let due = e.last_used_at.unwrap_or(now) + ttl;
            if due > now {
                format!("{} (keep-alive)", human::duration(Duration::from_secs(due - now)))
            } else {
                "stopping (keep-alive)".into()
            }
        }
        None if lru == Some(e.model.as_str()) => "next to evict".into(),
        None => "until evicted".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(model: &str, state: &str, in_flight: usize, last_used: u64) -> EngineInfo {
        let live = state != "crashed";
        EngineInfo {
            model: model.into(),
            state: state.into(),
            pid: live.then_some(4242),
            device: Some("cpu".into()),
            in_flight,
            started_at: Some(1_000),
            last_used_at: Some(last_used),
        }
    }

    fn snap(cap: usize, keep_alive_s: Option<u64>, engines: Vec<EngineInfo>) -> Snapshot {
        Snapshot { pool: PoolInfo { cap, keep_alive_s }, engines }
    }

    #[test]
    fn a_row_per_engine_that_is_not_stopped() {
        let s = snap(
            2,
            None,
            vec![engine("smol", "ready", 0, 1_100), engine("gemma", "stopped", 0, 0), engine("qwen", "crashed", 0, 0)],
        );
        let rss = BTreeMap::from([("smol".to_owned(), 95_632_384)]);
        let t = render(&s, &rss, 1_192);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        assert_eq!(lines[0], "NAME  STATE    PID   DEVICE  MEMORY    IN-FLIGHT  UPTIME  UNTIL");
        assert_eq!(lines[1], "smol  ready    4242  cpu     91.2 MiB  0          3m 12s  until evicted");
        assert_eq!(lines[2], "qwen  crashed  -     cpu     -         0          -       -");
    }

    #[test]
    fn until_is_the_keep_alive_countdown_or_the_next_eviction() {
        let now = 2_000;
        let ka = PoolInfo { cap: 1, keep_alive_s: Some(300) };
        assert_eq!(until(&engine("a", "ready", 0, 1_900), &ka, None, now), "3m 20s (keep-alive)");
        assert_eq!(until(&engine("a", "ready", 0, 1_000), &ka, None, now), "stopping (keep-alive)");
        assert_eq!(until(&engine("a", "ready", 2, 1_000), &ka, None, now), "in use");
        assert_eq!(until(&engine("a", "starting", 0, 1_000), &ka, None, now), "-");

        // A full pool of two: the least recently used idle engine goes first.
        let full = snap(2, None, vec![engine("a", "ready", 0, 1_500), engine("b", "ready", 0, 1_200)]);
        assert_eq!(next_to_evict(&full), Some("b"));
        let t = render(&full, &BTreeMap::new(), now);
        assert!(t.lines().any(|l| l.starts_with("b ") && l.ends_with("next to evict")), "{t}");
        assert!(t.lines().any(|l| l.starts_with("a ") && l.ends_with("until evicted")), "{t}");
        let busy = snap(2, None, vec![engine("a", "ready", 0, 1_500), engine("b", "ready", 1, 1_200)]);
        assert_eq!(next_to_evict(&busy), Some("a"), "never one with requests in flight");
        let room = snap(3, None, vec![engine("a", "ready", 0, 1_500), engine("b", "ready", 0, 1_200)]);
        assert_eq!(next_to_evict(&room), None, "a pool with room evicts nobody");
    }

    #[test]
    fn nothing_running_says_so() {
        let s = snap(1, None, vec![engine("smol", "stopped", 0, 0), engine("gemma", "stopped", 0, 0)]);
        assert_eq!(
            render(&s, &BTreeMap::new(), 0),
            "no engines running (2 models known; `corral load MODEL` starts one)\n"
        );
    }

    #[test]
    fn reads_the_gateways_engine_answer() {
        let body = r#"{"pool":{"cap":1,"resident":["smol"],"memory_budget_bytes":0,"default":null,"keep_alive_s":null},
            "engines":[{"model":"smol","state":"ready","pid":7,"socket":"/s","restarts":0,"started_at":5,
            "last_used_at":6,"in_flight":1,"model_bytes":9,"device":"cpu","last_exit":null}]}"#;
        let s: Snapshot = serde_json::from_str(body).unwrap();
        assert_eq!((s.pool.cap, s.engines[0].pid, s.engines[0].in_flight), (1, Some(7), 1));
    }
}
