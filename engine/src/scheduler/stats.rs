//! Engine counters for `GET /admin/stats`. Hot counters are atomics (the generation
//! thread bumps them per token, so a client can watch a cancelled request stop); the
//! per-request timings sit behind a mutex touched once per request. Counters only:
//! admission and the server's drain decide on other state, never on these.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use corral_protocol::engine_wire::{Averages, BatchStats, EngineStats, Memory, RequestTiming, SpecStats};
use corral_protocol::histogram::Histogram;

use crate::generate::Outcome;

/// Weight of the newest request in the moving averages.
const EMA: f64 = 0.2;

/// Bucket bounds of the time to first token, seconds: from a cached prompt on a GPU to a
/// long prompt read on a laptop's CPU.
const TTFT_BOUNDS: [f64; 12] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
/// Bucket bounds of a request's decode rate, tokens per second.
const DECODE_BOUNDS: [f64; 11] = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0];

/// What is kept per finished request, behind one lock.
struct Timings {
    last: Option<RequestTiming>,
    avg: Averages,
    ttft: Histogram,
    decode: Histogram,
}

pub struct Stats {
    started: Instant,
    pub requests_total: AtomicU64,
    pub requests_failed: AtomicU64,
    pub requests_cancelled: AtomicU64,
    pub prompt_tokens_total: AtomicU64,
    pub generated_tokens_total: AtomicU64,
    pub queue_depth: AtomicUsize,
    pub in_flight: AtomicUsize,
    pub peak_rows: AtomicUsize,
    pub submitted_rows: AtomicU64,
    pub steps: AtomicU64,
    pub batched_steps: AtomicU64,
    /// KV bytes the running rows hold in reserve.
    pub kv_bytes: AtomicU64,
    /// Requests that speculated, their draft tokens and the kept ones.
    spec_requests: AtomicU64,
    spec_drafted: AtomicU64,
    spec_accepted: AtomicU64,
    timings: Mutex<Timings>,
}

impl Stats {
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            requests_total: AtomicU64::new(0),
            requests_failed: AtomicU64::new(0),
            requests_cancelled: AtomicU64::new(0),
            prompt_tokens_total: AtomicU64::new(0),
            generated_tokens_total: AtomicU64::new(0),
            queue_depth: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            peak_rows: AtomicUsize::new(0),
            submitted_rows: AtomicU64::new(0),
            steps: AtomicU64::new(0),
            batched_steps: AtomicU64::new(0),
            kv_bytes: AtomicU64::new(0),
            spec_requests: AtomicU64::new(0),
            spec_drafted: AtomicU64::new(0),
            spec_accepted: AtomicU64::new(0),
            timings: Mutex::new(Timings {
                last: None,
                avg: Averages::default(),
                ttft: Histogram::new(&TTFT_BOUNDS),
                decode: Histogram::new(&DECODE_BOUNDS),
            }),
        }
    }

    /// A request left the batch; `ttft` is from its arrival to its first token, when it
    /// generated one.
    pub fn record(&self, o: &Outcome, ttft: Option<Duration>) {
        self.prompt_tokens_total.fetch_add(o.prompt_tokens as u64, Ordering::Relaxed);
        if let Some(s) = o.speculation {
            self.spec_requests.fetch_add(1, Ordering::Relaxed);
            self.spec_drafted.fetch_add(s.drafted as u64, Ordering::Relaxed);
            self.spec_accepted.fetch_add(s.accepted as u64, Ordering::Relaxed);
        }
        let t = RequestTiming {
            prompt_tokens: o.prompt_tokens,
            cached_tokens: o.cached_tokens,
            completion_tokens: o.completion_tokens(),
            prefill_tok_s: o.prefill_tok_s(),
            decode_tok_s: o.decode_tok_s(),
        };
        let mut g = self.timings.lock().unwrap_or_else(|e| e.into_inner());
        let ema = |old: f64, new: f64| if old == 0.0 { new } else { old * (1.0 - EMA) + new * EMA };
        if t.prefill_tok_s > 0.0 {
            g.avg.prefill_tok_s = ema(g.avg.prefill_tok_s, t.prefill_tok_s);
        }
        if t.decode_tok_s > 0.0 {
            g.avg.decode_tok_s = ema(g.avg.decode_tok_s, t.decode_tok_s);
            g.decode.observe(t.decode_tok_s);
        }
        if let Some(d) = ttft {
            g.ttft.observe(d.as_secs_f64());
        }
        g.last = Some(t);
    }

    /// One forward pass over `rows` rows.
    pub fn record_step(&self, rows: usize) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        if rows > 1 {
            self.batched_steps.fetch_add(1, Ordering::Relaxed);
        }
        self.peak_rows.fetch_max(rows, Ordering::Relaxed);
    }

    pub fn snapshot(&self, model: &str, view: Shown, cache: &crate::cache::PromptCache) -> EngineStats {
        let Shown { max_queue, batch, ctx, kv_budget_bytes, memory_budget_bytes, model_file_bytes, draining, device } =
            view;
        let rss = rss_bytes();
        let (prompt_cache, ssd_cache) = cache.stats();
        let g = self.timings.lock().unwrap_or_else(|e| e.into_inner());
        EngineStats {
            model: model.to_owned(),
            pid: std::process::id(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            draining,
            requests_total: self.requests_total.load(Ordering::Relaxed),
            requests_failed: self.requests_failed.load(Ordering::Relaxed),
            requests_cancelled: self.requests_cancelled.load(Ordering::Relaxed),
            prompt_tokens_total: self.prompt_tokens_total.load(Ordering::Relaxed),
            generated_tokens_total: self.generated_tokens_total.load(Ordering::Relaxed),
            queue_depth: self.queue_depth.load(Ordering::Relaxed),
            max_queue,
            in_flight: self.in_flight.load(Ordering::Relaxed),
            batch: BatchStats {
                configured: batch,
                active_rows: self.in_flight.load(Ordering::Relaxed),
                pending_rows: self.queue_depth.load(Ordering::Relaxed),
                peak_rows: self.peak_rows.load(Ordering::Relaxed),
                submitted_rows: self.submitted_rows.load(Ordering::Relaxed),
                steps: self.steps.load(Ordering::Relaxed),
                batched_steps: self.batched_steps.load(Ordering::Relaxed),
                mode: if batch > 1 { "continuous" } else { "serial" }.into(),
                kv_bytes: self.kv_bytes.load(Ordering::Relaxed),
                kv_budget_bytes,
                speculation: SpecStats {
                    requests: self.spec_requests.load(Ordering::Relaxed),
                    drafted: self.spec_drafted.load(Ordering::Relaxed),
                    accepted: self.spec_accepted.load(Ordering::Relaxed),
                },
            },
            ctx,
            last: g.last.clone(),
            avg: g.avg.clone(),
            ttft_seconds: g.ttft.clone(),
            decode_tokens_per_second: g.decode.clone(),
            memory: Memory { rss_bytes: rss, model_file_bytes, budget_bytes: memory_budget_bytes, used_bytes: rss },
            device,
            prompt_cache,
            ssd_cache,
        }
    }
}

/// What the snapshot shows besides the counters.
pub struct Shown {
    pub max_queue: usize,
    pub batch: usize,
    pub ctx: usize,
    pub kv_budget_bytes: u64,
    pub memory_budget_bytes: u64,
    pub model_file_bytes: u64,
    pub draining: bool,
    pub device: corral_protocol::engine_wire::DeviceStats,
}

impl Default for Stats {
    fn default() -> Self {
        Self::new()
    }
}

/// Resident set size from /proc (Linux); 0 elsewhere.
fn rss_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else { return 0 };
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).ok().flatten().unwrap_or(4096) as u64;
    pages * page
}
