//! The generation thread: one dedicated OS thread runs up to `--batch` requests at once
//! from a bounded queue (over capacity is refused at submit time), one forward pass per
//! step for every running row (`Model::forward_batch`), streaming events back to each
//! request's handler. Newcomers join at the next step with their prompt-cache hit;
//! finished, failed and cancelled rows leave without stalling the rest. A handler that
//! goes away (client disconnect) closes its event channel; the thread sees that before
//! every pass and after every token, so abandoned work costs at most one step.
//! `--batch 1` runs one request at a time, exactly as before batching.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tokio::sync::mpsc;

use super::SchedulerError;
use super::admission::{self, KvBudget};
use super::pacing::{ESTABLISHED_TOKENS, Pacer};
use super::stats::Stats;
use crate::Engine;
use crate::cache::{PromptCache, Source};
use crate::generate::{FinishReason, GenerateParams, Observer, Outcome, TokenOut};
use crate::model::Row;
use crate::sequence::Sequence;

/// What a handler receives, in order: tokens, then exactly one `Done` or `Failed`.
pub enum Event {
    Token(TokenOut),
    /// Text released at the end that belongs to no token.
    Flush(String),
    Done(Outcome),
    Failed(SchedulerError),
}

pub struct Job {
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    /// KV bytes it may grow to (`admission::admit`), held while it runs.
    pub kv_bytes: u64,
    pub events: mpsc::UnboundedSender<Event>,
    /// When the request reached the engine: its time to first token counts from here.
    pub arrived: Instant,
}

/// How the generation thread runs.
#[derive(Clone, Copy, Debug)]
pub struct WorkerConfig {
    /// Context size per request.
    pub ctx: usize,
    /// Requests waiting beyond the running ones.
    pub max_queue: usize,
    /// Rows per forward pass.
    pub batch: usize,
    /// What the running rows' KV may add up to.
    pub kv: KvBudget,
}

pub struct Worker {
    queue: mpsc::Sender<Job>,
    cache: Arc<PromptCache>,
    stats: Arc<Stats>,
    /// Set to cut every running and queued request (drain deadline, parent gone).
    pub cancel_all: Arc<AtomicBool>,
}

impl Worker {
    pub fn spawn(
        engine: Arc<Engine>,
        cache: Arc<PromptCache>,
        cfg: WorkerConfig,
        stats: Arc<Stats>,
    ) -> std::io::Result<Self> {
        let (queue, rx) = mpsc::channel(cfg.max_queue.max(1));
        let cancel_all = Arc::new(AtomicBool::new(false));
        let (st, cancel) = (stats.clone(), cancel_all.clone());
        let cache_handle = cache.clone();
        std::thread::Builder::new().name("generate".into()).spawn(move || run(engine, cache, cfg, rx, st, cancel))?;
        Ok(Self { queue, cache: cache_handle, stats, cancel_all })
    }

    /// Queue a job, or refuse it at once when the queue is full.
    pub fn submit(&self, job: Job) -> Result<(), SchedulerError> {
        self.stats.queue_depth.fetch_add(1, Ordering::Relaxed);
        // Background cache writes yield from the moment a request is queued.
        self.cache.set_busy(true);
        self.queue.try_send(job).map_err(|e| {
            self.stats.queue_depth.fetch_sub(1, Ordering::Relaxed);
            match e {
                mpsc::error::TrySendError::Full(_) => SchedulerError::QueueFull,
                mpsc::error::TrySendError::Closed(_) => SchedulerError::Stopped,
            }
        })
    }
}

struct Sink<'a> {
    events: &'a mpsc::UnboundedSender<Event>,
    stats: &'a Stats,
    cancel_all: &'a AtomicBool,
    /// Set at the request's first generated token.
    first_token: &'a mut Option<Instant>,
}

impl Observer for Sink<'_> {
    fn keep_going(&mut self) -> bool {
        !self.events.is_closed() && !self.cancel_all.load(Ordering::Relaxed)
    }

    fn on_token(&mut self, tok: &TokenOut) -> bool {
        self.stats.generated_tokens_total.fetch_add(1, Ordering::Relaxed);
        self.first_token.get_or_insert_with(Instant::now);
        // Never blocks: a slow reader must not hold up the other rows of a batch.
        self.keep_going() && self.events.send(Event::Token(tok.clone())).is_ok()
    }

    fn on_flush(&mut self, text: &str) {
        let _ = self.events.send(Event::Flush(text.to_owned()));
    }
}

/// A request in the running batch.
struct Active {
    seq: Sequence,
    kv_bytes: u64,
    prompt: Vec<u32>,
    events: mpsc::UnboundedSender<Event>,
    failed: Option<SchedulerError>,
    arrived: Instant,
    first_token: Option<Instant>,
}

struct Ctx<'a> {
    engine: &'a Engine,
    pc: &'a PromptCache,
    ctx: usize,
    kv: KvBudget,
    stats: &'a Stats,
    cancel_all: &'a AtomicBool,
}

fn run(
    engine: Arc<Engine>,
    pc: Arc<PromptCache>,
    cfg: WorkerConfig,
    mut rx: mpsc::Receiver<Job>,
    stats: Arc<Stats>,
    cancel_all: Arc<AtomicBool>,
) {
    let cx = Ctx { engine: &engine, pc: &pc, ctx: cfg.ctx, kv: cfg.kv, stats: &stats, cancel_all: &cancel_all };
    let mut active: Vec<Active> = Vec::new();
    // The head of the queue when its KV does not fit beside the running rows yet.
    let mut waiting: Option<Job> = None;
    let mut pacer = Pacer::default();
    loop {
        // Newcomers join at the next step, up to the batch size and the KV budget.
        while active.len() < cfg.batch.max(1) {
            let job = match waiting.take() {
                Some(j) => j,
                None if active.is_empty() => match rx.blocking_recv() {
                    Some(j) => j,
                    None => return,
                },
                None => match rx.try_recv() {
                    Ok(j) => j,
                    Err(_) => break,
                },
            };
            let held: u64 = active.iter().map(|a| a.kv_bytes).sum();
            if !admission::fits_now(held, job.kv_bytes, &cx.kv) {
                waiting = Some(job);
                break;
            }
            pc.set_busy(true);
            active.extend(admit(&cx, job));
        }
        stats.kv_bytes.store(active.iter().map(|a| a.kv_bytes).sum(), Ordering::Relaxed);
        if !active.is_empty() {
            step(&cx, &mut pacer, &mut active);
        }
        // Finished rows give their KV reservation back before their clients hear the end,
        // so a client that reads /stats after its response sees it released.
        let done = extract_done(&mut active);
        stats.kv_bytes.store(active.iter().map(|a| a.kv_bytes).sum(), Ordering::Relaxed);
        for a in done {
            complete(&cx, a);
        }
        if active.is_empty() && waiting.is_none() && stats.queue_depth.load(Ordering::SeqCst) == 0 {
            pc.set_busy(false);
        }
    }
}

/// Start a job: its prompt-cache hit (RAM or SSD) becomes its cache.
fn admit(cx: &Ctx<'_>, job: Job) -> Option<Active> {
    cx.stats.queue_depth.fetch_sub(1, Ordering::SeqCst);
    if job.events.is_closed() || cx.cancel_all.load(Ordering::Relaxed) {
        cx.stats.requests_cancelled.fetch_add(1, Ordering::Relaxed);
        let _ = job.events.send(Event::Failed(SchedulerError::Cancelled));
        return None;
    }
    let (cache, source) = if job.prompt.len() < cx.ctx {
        cx.pc.prepare(&job.prompt)
    } else {
        (cx.engine.model.new_cache(), Source::Miss)
    };
    tracing::debug!(cached = cache.len(), source = ?source, "prompt cache");
    let seq = Sequence::new(cache, &job.prompt, job.params, cx.ctx);
    let model = &cx.engine.model;
    match seq.map(|s| s.with_snapshots(model.recurrent()).with_speculation(model.speculates())) {
        Ok(seq) => {
            cx.stats.in_flight.fetch_add(1, Ordering::Relaxed);
            cx.stats.submitted_rows.fetch_add(1, Ordering::Relaxed);
            Some(Active {
                seq,
                kv_bytes: job.kv_bytes,
                prompt: job.prompt,
                events: job.events,
                failed: None,
                arrived: job.arrived,
                first_token: None,
            })
        }
        Err(e) => {
            cx.stats.requests_failed.fetch_add(1, Ordering::Relaxed);
            let _ = job.events.send(Event::Failed(e.into()));
            None
        }
    }
}

/// One forward pass for every running row. A lone row, or rows that are all reading
/// their prompts, prefill in `PREFILL_CHUNK`s as before batching; beside decoding rows a
/// newcomer reads as many prompt tokens as the pacer allows, so running streams keep
/// their pace while a long prompt arrives.
fn step(cx: &Ctx<'_>, pacer: &mut Pacer, active: &mut [Active]) {
    for a in active.iter_mut() {
        let mut sink =
            Sink { events: &a.events, stats: cx.stats, cancel_all: cx.cancel_all, first_token: &mut a.first_token };
        if a.seq.prefilling() && !sink.keep_going() {
            a.seq.cancel(&mut sink);
        }
    }
    let running = active.iter().filter(|a| !a.seq.is_done()).count();
    let prefilling = active.iter().filter(|a| !a.seq.is_done() && a.seq.prefilling()).count();
    let decoding = running - prefilling;
    let established = active.iter().filter(|a| !a.seq.is_done() && a.seq.generated() >= ESTABLISHED_TOKENS).count();
    let chunk = pacer.chunk(decoding, established, prefilling);
    if running > 1 {
        for a in active.iter_mut() {
            a.seq.mark_batched();
        }
    }
    let draft_cost = pacer.token_cost(decoding);
    let result = {
        let mut rows: Vec<Row<'_>> =
            active.iter_mut().filter(|a| !a.seq.is_done()).map(|a| a.seq.input(chunk, draft_cost)).collect();
        if rows.is_empty() {
            return;
        }
        cx.stats.record_step(rows.len());
        // Decoding rows carry one token each beyond their drafts; the rest are prompt.
        let prompt_tokens = rows.iter().map(|r| r.tokens.len()).sum::<usize>().saturating_sub(decoding);
        let started = Instant::now();
        let result = cx.engine.model.forward_batch(&mut rows);
        let secs = started.elapsed().as_secs_f64();
        pacer.observe(decoding, prompt_tokens, secs);
        tracing::trace!(decoding, prompt_tokens, chunk, ms = secs * 1e3, "pass");
        result
    };
    let running = active.iter_mut().filter(|a| !a.seq.is_done());
    match result {
        Ok(logits) => {
            for (a, l) in running.zip(logits) {
                let mut sink = Sink {
                    events: &a.events,
                    stats: cx.stats,
                    cancel_all: cx.cancel_all,
                    first_token: &mut a.first_token,
                };
                if let Err(e) = a.seq.advance(l, &cx.engine.tokenizer, &mut sink) {
                    tracing::error!(error = %e, "generation failed");
                    a.failed = Some(e.into());
                }
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "batched forward failed");
            let e = SchedulerError::from(e);
            for a in running {
                a.failed = Some(e.clone());
            }
        }
    }
}

fn extract_done(active: &mut Vec<Active>) -> Vec<Active> {
    let mut done = Vec::new();
    let mut i = 0;
    while i < active.len() {
        if active[i].seq.is_done() || active[i].failed.is_some() {
            done.push(active.swap_remove(i));
        } else {
            i += 1;
        }
    }
    done
}

/// A row leaves the batch: its KV goes to the prompt cache, its handler gets the end.
fn complete(cx: &Ctx<'_>, a: Active) {
    cx.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
    if let Some(e) = a.failed {
        cx.stats.requests_failed.fetch_add(1, Ordering::Relaxed);
        let _ = a.events.send(Event::Failed(e));
        return;
    }
    let (outcome, cache) = a.seq.into_parts();
    let mut seen = a.prompt;
    seen.extend_from_slice(&outcome.tokens);
    cx.pc.store(&seen, cache);
    cx.stats.record(&outcome, a.first_token.map(|t| t.duration_since(a.arrived)));
    if !outcome.mask.is_zero() {
        tracing::debug!(
            mask_us = outcome.mask.as_micros() as u64,
            decode_us = outcome.decode.as_micros() as u64,
            tokens = outcome.tokens.len(),
            "grammar masks"
        );
    }
    if outcome.finish == FinishReason::Cancelled {
        cx.stats.requests_cancelled.fetch_add(1, Ordering::Relaxed);
        tracing::info!(generated = outcome.tokens.len(), "request cancelled");
    }
    let _ = a.events.send(Event::Done(outcome));
}
