//! The prompt cache: prefix KV kept in RAM (`ram`), demoted to and restored from an
//! SSD tier (`ssd`, files in the `file` format), with a background writer (`writer`).
//!
//! The generation thread calls `prepare` before a request (the longest cached prefix
//! of its prompt: a RAM fork, else a restore from disk) and `store` after it (the
//! prompt plus completion it computed). Everything that touches the disk in the
//! background pauses while a request runs. A hybrid model's entries carry recurrent
//! states at a few positions (`crate::checkpoint`): a prefix is usable up to the newest
//! state within it, in RAM and on disk alike.

pub mod file;
mod file_header;
pub mod ram;
pub mod ssd;
mod writer;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use corral_protocol::engine_wire::{PromptCacheStats, SsdCacheStats};
use serde::Serialize;

use crate::kv::{KvShape, SeqCache};
pub use file::Identity;
pub use ssd::SsdConfig;

#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// RAM tier cap in bytes; 0 disables the prompt cache (and the SSD tier with it).
    pub ram_bytes: u64,
    pub ssd: Option<SsdConfig>,
    /// Entries unused this long leave RAM for the SSD tier (`None`: never for idleness).
    pub demote_idle: Option<Duration>,
    /// Bytes of entries pushed out of RAM that may wait for the writer.
    pub spill_queue_bytes: u64,
    /// Write new entries behind once idle (eviction, drain and flush write regardless).
    pub write_behind: bool,
    /// Idle time after a request before the write-behind snapshots new entries.
    pub write_behind_after: Duration,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            ram_bytes: 8_000_000_000,
            ssd: None,
            demote_idle: Some(Duration::from_secs(300)),
            spill_queue_bytes: 2_000_000_000,
            write_behind: true,
            write_behind_after: Duration::from_secs(2),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Miss,
    Ram,
    Ssd,
}

#[derive(Default)]
struct RamCounters {
    hits: AtomicU64,
    misses: AtomicU64,
    hit_tokens: AtomicU64,
}

pub struct PromptCache {
    shape: KvShape,
    ram: Mutex<ram::RamCache>,
    ssd: Option<ssd::SsdTier>,
    counters: RamCounters,
    /// The spill queue and the busy/idle signal shared with the writer thread.
    writer: Arc<writer::Shared>,
    cfg: CacheConfig,
}

#[derive(Serialize)]
pub struct FlushReport {
    /// Files written by this call.
    pub written: usize,
    /// RAM entries that are now on disk.
    pub durable: usize,
    /// RAM entries that could not be written (SSD off, disk full, ...).
    pub failed: usize,
    pub bytes: u64,
}

impl PromptCache {
    /// A cache for a model with KV shape `shape`; `identity` must be given when the
    /// SSD tier is on. Starts the background writer.
    pub fn new(cfg: CacheConfig, shape: KvShape, identity: Option<Identity>) -> Arc<Self> {
        let ssd = match (&cfg.ssd, identity) {
            (Some(s), Some(id)) if cfg.ram_bytes > 0 => Some(ssd::SsdTier::open(s, id)),
            _ => None,
        };
        let cache = Arc::new(Self {
            shape,
            ram: Mutex::new(ram::RamCache::new(cfg.ram_bytes)),
            ssd,
            counters: RamCounters::default(),
            writer: writer::Shared::new(cfg.spill_queue_bytes),
            cfg,
        });
        if cache.ssd.is_some() {
            writer::start(&cache);
        }
        cache
    }

    pub fn enabled(&self) -> bool {
        self.cfg.ram_bytes > 0
    }

    fn ram(&self) -> MutexGuard<'_, ram::RamCache> {
        self.ram.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn ssd(&self) -> Option<&ssd::SsdTier> {
        self.ssd.as_ref()
    }

    /// Mark the start or end of request work (background writes pause meanwhile).
    pub fn set_busy(&self, busy: bool) {
        self.writer.set_busy(busy);
    }

    /// The sequence to start `prompt` from: the longest usable cached prefix (always
    /// leaving one prompt token to compute), from RAM or else from disk.
    pub fn prepare(&self, prompt: &[u32]) -> (SeqCache, Source) {
        let limit = prompt.len().saturating_sub(1);
        if !self.enabled() || limit == 0 {
            return (SeqCache::new(self.shape), Source::Miss);
        }
        let in_ram = self.ram().lookup(prompt, limit);
        let ram_n = in_ram.as_ref().map_or(0, |(n, _)| *n);
        if let Some(ssd) = &self.ssd
            && let Some((name, n)) = ssd.lookup(prompt, limit)
            && n > ram_n
            && let Some(kv) = ssd.restore(&name, n)
            && kv.len() > ram_n
        {
            let n = kv.len();
            // Keep the restored prefix in RAM too (it is on disk already).
            let tokens: Arc<[u32]> = prompt[..kv.len()].into();
            let file_tokens_match = ssd.covers(&tokens);
            let out = self.ram().insert(tokens, kv.clone(), file_tokens_match);
            self.spill(out);
            self.counters.hits.fetch_add(1, Ordering::Relaxed);
            self.counters.hit_tokens.fetch_add(n as u64, Ordering::Relaxed);
            return (kv, Source::Ssd);
        }
        match in_ram {
            Some((n, kv)) => {
                self.counters.hits.fetch_add(1, Ordering::Relaxed);
                self.counters.hit_tokens.fetch_add(n as u64, Ordering::Relaxed);
                (kv, Source::Ram)
            }
            None => {
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
                (SeqCache::new(self.shape), Source::Miss)
            }
        }
    }

    /// Keep the KV a request computed: `tokens` are the prompt and completion tokens,
    /// of which the first `kv.len()` have KV.
    pub fn store(&self, tokens: &[u32], kv: SeqCache) {
        if !self.enabled() || kv.is_empty() {
            return;
        }
        let tokens: Arc<[u32]> = tokens[..kv.len()].into();
        let out = self.ram().insert(tokens, kv, false);
        self.spill(out);
    }

    /// Hand entries pushed out of RAM to the writer (they are demotions). Entries already
    /// on disk need nothing; without an SSD tier they are simply gone.
    fn spill(&self, out: Vec<ram::Entry>) {
        if out.is_empty() || self.ssd.is_none() {
            return;
        }
        self.writer.push(out.into_iter().filter(|e| !e.durable).map(|e| writer::Spill { tokens: e.tokens, kv: e.kv }));
    }

    /// Write every RAM entry not yet on disk, now (no pausing). With `demote`, the
    /// entries also leave RAM (drain: the engine is about to stop).
    pub fn flush(&self, demote: bool) -> FlushReport {
        let mut report = FlushReport { written: 0, durable: 0, failed: 0, bytes: 0 };
        let Some(ssd) = &self.ssd else {
            report.failed = self.ram().len();
            return report;
        };
        let before = ssd.counters.spills.load(Ordering::Relaxed);
        let todo = self.ram().not_durable();
        for (id, tokens, kv) in todo {
            if ssd.write(&tokens, &kv, &mut || {}) {
                self.ram().mark_durable(id);
                report.bytes += kv.bytes() as u64;
            } else {
                report.failed += 1;
            }
        }
        report.written = (ssd.counters.spills.load(Ordering::Relaxed) - before) as usize;
        let mut ram = self.ram();
        report.durable = ram.len().saturating_sub(report.failed);
        if demote {
            let gone = ram.clear();
            ssd.counters.demotions.fetch_add(gone.len().saturating_sub(report.failed) as u64, Ordering::Relaxed);
        }
        report
    }

    pub fn stats(&self) -> (PromptCacheStats, Option<SsdCacheStats>) {
        let ram = self.ram();
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let prompt = PromptCacheStats {
            entries: ram.len(),
            bytes: ram.bytes(),
            max_bytes: self.cfg.ram_bytes,
            hits: ld(&self.counters.hits),
            misses: ld(&self.counters.misses),
            hit_tokens: ld(&self.counters.hit_tokens),
        };
        drop(ram);
        let q = self.writer.stats();
        let ssd = self.ssd.as_ref().map(|s| {
            let (entries, bytes) = s.entries();
            let c = &s.counters;
            SsdCacheStats {
                dir: s.dir.display().to_string(),
                usable: s.unusable.is_none(),
                error: s.unusable.clone(),
                entries,
                bytes,
                max_bytes: s.max_bytes,
                restores: ld(&c.restores),
                restore_ms_last: ld(&c.restore_ms_last),
                spills: ld(&c.spills),
                demotions: ld(&c.demotions),
                failed_spills: ld(&c.failed_spills),
                rejected_files: ld(&c.rejected_files),
                pending_spills: q.pending,
                pending_spill_bytes: q.pending_bytes,
                dropped_spills: q.dropped,
            }
        });
        (prompt, ssd)
    }
}

impl Drop for PromptCache {
    fn drop(&mut self) {
        // Ends the writer thread's wait.
        self.writer.close();
    }
}
