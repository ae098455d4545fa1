//! The generation thread: one dedicated OS thread runs one request at a time from a
//! bounded queue (over capacity is a 429 at submit time), streaming events back to the
//! request's handler. A handler that goes away (client disconnect) closes its event
//! channel; the thread sees that between prefill chunks and after every token and
//! stops, so abandoned work costs at most one step.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use corral_protocol::{ApiError, ErrorKind};
use tokio::sync::mpsc;

use super::stats::Stats;
use crate::Engine;
use crate::cache::{PromptCache, Source};
use crate::generate::{FinishReason, GenerateParams, Observer, Outcome, TokenOut, generate};

/// What a handler receives, in order: tokens, then exactly one `Done` or `Failed`.
pub enum Event {
    Token(TokenOut),
    /// Text released at the end that belongs to no token.
    Flush(String),
    Done(Outcome),
    Failed(ApiError),
}

pub struct Job {
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    pub events: mpsc::Sender<Event>,
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
        ctx: usize,
        max_queue: usize,
        stats: Arc<Stats>,
    ) -> std::io::Result<Self> {
        let (queue, rx) = mpsc::channel(max_queue.max(1));
        let cancel_all = Arc::new(AtomicBool::new(false));
        let (st, cancel) = (stats.clone(), cancel_all.clone());
        let cache_handle = cache.clone();
        std::thread::Builder::new().name("generate".into()).spawn(move || run(engine, cache, ctx, rx, st, cancel))?;
        Ok(Self { queue, cache: cache_handle, stats, cancel_all })
    }

    /// Queue a job, or refuse it at once when the queue is full.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        self.stats.queue_depth.fetch_add(1, Ordering::Relaxed);
        // Background cache writes yield from the moment a request is queued.
        self.cache.set_busy(true);
        self.queue.try_send(job).map_err(|e| {
            self.stats.queue_depth.fetch_sub(1, Ordering::Relaxed);
            match e {
                mpsc::error::TrySendError::Full(_) => {
                    ApiError::new(ErrorKind::QueueFull, "the request queue is full; retry later")
                }
                mpsc::error::TrySendError::Closed(_) => {
                    ApiError::new(ErrorKind::Internal, "the generation thread stopped")
                }
            }
        })
    }
}

struct Sink<'a> {
    events: &'a mpsc::Sender<Event>,
    stats: &'a Stats,
    cancel_all: &'a AtomicBool,
}

impl Observer for Sink<'_> {
    fn keep_going(&mut self) -> bool {
        !self.events.is_closed() && !self.cancel_all.load(Ordering::Relaxed)
    }

    fn on_token(&mut self, tok: &TokenOut) -> bool {
        self.stats.generated_tokens_total.fetch_add(1, Ordering::Relaxed);
        self.keep_going() && self.events.blocking_send(Event::Token(tok.clone())).is_ok()
    }

    fn on_flush(&mut self, text: &str) {
        let _ = self.events.blocking_send(Event::Flush(text.to_owned()));
    }
}

fn run(
    engine: Arc<Engine>,
    pc: Arc<PromptCache>,
    ctx: usize,
    mut rx: mpsc::Receiver<Job>,
    stats: Arc<Stats>,
    cancel_all: Arc<AtomicBool>,
) {
    while let Some(job) = rx.blocking_recv() {
        pc.set_busy(true);
        run_one(&engine, &pc, ctx, job, &stats, &cancel_all);
        if stats.queue_depth.load(Ordering::SeqCst) == 0 {
            pc.set_busy(false);
        }
    }
}

fn run_one(engine: &Engine, pc: &PromptCache, ctx: usize, job: Job, stats: &Stats, cancel_all: &AtomicBool) {
    stats.queue_depth.fetch_sub(1, Ordering::SeqCst);
    if job.events.is_closed() || cancel_all.load(Ordering::Relaxed) {
        stats.requests_cancelled.fetch_add(1, Ordering::Relaxed);
        let _ = job.events.blocking_send(Event::Failed(ApiError::new(ErrorKind::EngineDraining, "request cancelled")));
        return;
    }
    stats.in_flight.fetch_add(1, Ordering::Relaxed);
    let (mut cache, source) =
        if job.prompt.len() < ctx { pc.prepare(&job.prompt) } else { (engine.model.new_cache(), Source::Miss) };
    tracing::debug!(cached = cache.len(), source = ?source, "prompt cache");
    let mut sink = Sink { events: &job.events, stats, cancel_all };
    let result = generate(&engine.model, &engine.tokenizer, &mut cache, &job.prompt, job.params, ctx, &mut sink);
    stats.in_flight.fetch_sub(1, Ordering::Relaxed);
    match result {
        Ok(outcome) => {
            let mut seen = job.prompt.clone();
            seen.extend_from_slice(&outcome.tokens);
            pc.store(&seen, cache);
            stats.record(&outcome);
            if !outcome.mask.is_zero() {
                tracing::debug!(
                    mask_us = outcome.mask.as_micros() as u64,
                    decode_us = outcome.decode.as_micros() as u64,
                    tokens = outcome.tokens.len(),
                    "grammar masks"
                );
            }
            if outcome.finish == FinishReason::Cancelled {
                stats.requests_cancelled.fetch_add(1, Ordering::Relaxed);
                tracing::info!(generated = outcome.tokens.len(), "request cancelled");
            }
            let _ = job.events.blocking_send(Event::Done(outcome));
        }
        Err(e) => {
            stats.requests_failed.fetch_add(1, Ordering::Relaxed);
            tracing::error!(error = %e, "generation failed");
            let _ = job.events.blocking_send(Event::Failed(ApiError::from(&e)));
        }
    }
}
