//! The SSD tier: prompt-cache entries as immutable files under `<dir>/<fingerprint>/`.
//!
//! The files are the database: at start the directory is scanned (headers only), files
//! that fail a check are counted, logged and deleted (newer-format ones are left), and
//! temp files of dead writers are removed. The index kept in memory is only token ids,
//! sizes and use times. A byte cap deletes least-recently-used files; a file extended by
//! a newer one is deleted as superseded. A directory that is a symlink, not ours, or
//! writable by others disables the tier (every lookup misses) with a warning.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use super::file::{self, Identity, Reject};
use super::ram::common_prefix;
use crate::kv::SeqCache;

#[derive(Clone, Debug)]
pub struct SsdConfig {
    /// The cache root; files go to `<dir>/<model fingerprint>/`.
    pub dir: PathBuf,
    pub max_bytes: u64,
    /// Check every tensor checksum on every restore (otherwise once per file per process).
    pub verify: bool,
}

struct DiskEntry {
    name: String,
    tokens: Arc<[u32]>,
    /// Positions with a recurrent state (a hybrid model's file), ascending; empty otherwise.
    states: Arc<[u32]>,
    bytes: u64,
    last_used: SystemTime,
}

#[derive(Default)]
struct Index {
    files: Vec<DiskEntry>,
    bytes: u64,
    /// Files whose body checksums were checked by this process.
    verified: HashSet<String>,
    backoff_until: Option<Instant>,
    backoff: Duration,
}

#[derive(Default)]
pub struct SsdCounters {
    pub restores: AtomicU64,
    pub restore_ms_last: AtomicU64,
    pub spills: AtomicU64,
    pub demotions: AtomicU64,
    pub failed_spills: AtomicU64,
    pub rejected_files: AtomicU64,
}

pub struct SsdTier {
    pub root: PathBuf,
    pub dir: PathBuf,
    pub max_bytes: u64,
    verify: bool,
    identity: Identity,
    /// Why the tier is off (bad directory), if it is.
    pub unusable: Option<String>,
    index: Mutex<Index>,
    pub counters: SsdCounters,
}

/// How many of the first `n` positions of file `f` can be restored.
fn usable(f: &DiskEntry, n: usize) -> usize {
    if f.states.is_empty() { n } else { crate::checkpoint::restorable(f.states.iter().map(|&p| p as usize), n) }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A directory we may keep cache files in: a real directory (not a symlink), ours, and
/// not writable by group or others. Created 0700 when missing.
fn check_dir(dir: &Path) -> Result<(), String> {
    corral_net::dirs::ensure_dir(dir, corral_net::dirs::Access::NoForeignWrites).map_err(|e| e.to_string())
}

fn pid_alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

impl SsdTier {
    pub fn open(cfg: &SsdConfig, identity: Identity) -> Self {
        let dir = cfg.dir.join(hex(&identity.model_fingerprint[..16]));
        let unusable = check_dir(&cfg.dir).and_then(|()| check_dir(&dir)).err();
        let tier = Self {
            root: cfg.dir.clone(),
            dir,
            max_bytes: cfg.max_bytes,
            verify: cfg.verify,
            identity,
            unusable,
            index: Mutex::new(Index::default()),
            counters: SsdCounters::default(),
        };
        match &tier.unusable {
            Some(why) => {
                tier.counters.rejected_files.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(dir = %cfg.dir.display(), reason = %why, "SSD cache disabled");
            }
            None => tier.scan(),
        }
        tier
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn reject(&self, path: &Path, why: &Reject) {
        self.counters.rejected_files.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(file = %path.display(), reason = %why, "ignoring a bad prompt-cache file");
        if why.is_garbage() {
            let _ = std::fs::remove_file(path);
        }
    }

    fn scan(&self) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else { return };
        let mut files = Vec::new();
        for ent in rd.flatten() {
            let name = ent.file_name().to_string_lossy().into_owned();
            let path = ent.path();
            if let Some(rest) = name.strip_prefix(".tmp-") {
                let pid = rest.split('-').next().and_then(|p| p.parse::<i32>().ok());
                if pid.is_none_or(|p| p == std::process::id() as i32 || !pid_alive(p)) {
                    tracing::info!(file = %path.display(), "removing a temp file left by a crashed writer");
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            if !name.ends_with(".kv") || !ent.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            match file::read_header(&path, &self.identity) {
                Ok(h) if file::file_name(&h.tokens) == name => {
                    let last_used = ent.metadata().and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH);
                    let (tokens, states) = (h.tokens.into(), h.states.into());
                    files.push(DiskEntry { name, tokens, states, bytes: h.file_len, last_used });
                }
                Ok(_) => self.reject(&path, &Reject::Header("file name does not match its tokens".into())),
                Err(e) => self.reject(&path, &e),
            }
        }
        let mut idx = self.lock();
        idx.bytes = files.iter().map(|f| f.bytes).sum();
        idx.files = files;
        tracing::info!(dir = %self.dir.display(), files = idx.files.len(), bytes = idx.bytes, "SSD cache opened");
        drop(idx);
        self.enforce_cap(None);
    }

    pub fn entries(&self) -> (usize, u64) {
        let idx = self.lock();
        (idx.files.len(), idx.bytes)
    }

    /// The file whose usable prefix of `prompt` is longest (at most `limit` tokens; with
    /// recurrent states, up to the newest state within the shared prefix).
    pub fn lookup(&self, prompt: &[u32], limit: usize) -> Option<(String, usize)> {
        if self.unusable.is_some() {
            return None;
        }
        let idx = self.lock();
        idx.files
            .iter()
            .map(|f| (f, usable(f, common_prefix(&f.tokens, prompt).min(limit))))
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(f, n)| (n, f.last_used))
            .map(|(f, n)| (f.name.clone(), n))
    }

    fn forget(&self, name: &str) {
        let mut idx = self.lock();
        if let Some(i) = idx.files.iter().position(|f| f.name == name) {
            let f = idx.files.remove(i);
            idx.bytes -= f.bytes;
        }
        idx.verified.remove(name);
    }

    /// Load the first `n` positions of file `name` (fewer, for a file with recurrent
    /// states: up to its newest state within them). Any failure is a miss (the file is
    /// counted, logged and, unless it is of a newer format, deleted).
    pub fn restore(&self, name: &str, n: usize) -> Option<SeqCache> {
        let t0 = Instant::now();
        let path = self.dir.join(name);
        // The directory could have been swapped for a symlink since we opened it.
        if let Err(why) = check_dir(&self.dir) {
            self.counters.rejected_files.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(reason = %why, "SSD cache directory became unusable");
            return None;
        }
        let result = file::read_header(&path, &self.identity).and_then(|h| {
            if file::file_name(&h.tokens) != name {
                return Err(Reject::Header("file name does not match its tokens".into()));
            }
            let verify = self.verify || !self.lock().verified.contains(name);
            let kv = file::restore(&path, &h, n, verify)?;
            Ok((h, kv))
        });
        match result {
            Ok((_, kv)) => {
                let mut idx = self.lock();
                idx.verified.insert(name.to_owned());
                let now = SystemTime::now();
                if let Some(f) = idx.files.iter_mut().find(|f| f.name == name) {
                    f.last_used = now;
                }
                drop(idx);
                // The use time survives restarts as the file's mtime (LRU order).
                if let Ok(f) = std::fs::File::options().read(true).open(&path) {
                    let _ = f.set_modified(now);
                }
                self.counters.restores.fetch_add(1, Ordering::Relaxed);
                self.counters.restore_ms_last.store(t0.elapsed().as_millis() as u64, Ordering::Relaxed);
                tracing::info!(
                    file = name,
                    tokens = kv.len(),
                    ms = t0.elapsed().as_millis() as u64,
                    "restored prompt cache from SSD"
                );
                Some(kv)
            }
            Err(Reject::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                self.forget(name);
                None
            }
            Err(e) => {
                self.forget(name);
                self.reject(&path, &e);
                None
            }
        }
    }

    /// Whether a file already holds `tokens` or an extension of them.
    pub fn covers(&self, tokens: &[u32]) -> bool {
        self.lock().files.iter().any(|f| f.tokens.len() >= tokens.len() && f.tokens.starts_with(tokens))
    }

    /// Write an entry (if no file already covers it). `pause` runs between chunks.
    /// Returns whether the entry is now on disk.
    pub fn write(&self, tokens: &Arc<[u32]>, kv: &SeqCache, pause: &mut dyn FnMut()) -> bool {
        if self.unusable.is_some() || tokens.is_empty() {
            return false;
        }
        if self.covers(tokens) {
            return true;
        }
        if self.lock().backoff_until.is_some_and(|t| Instant::now() < t) {
            return false;
        }
        match file::write(&self.dir, &self.identity, tokens, kv, pause) {
            Ok(path) => {
                let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
                let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                self.counters.spills.fetch_add(1, Ordering::Relaxed);
                let superseded: Vec<String> = {
                    let mut idx = self.lock();
                    idx.backoff = Duration::ZERO;
                    idx.backoff_until = None;
                    let old: Vec<String> = idx
                        .files
                        .iter()
                        .filter(|f| f.name == name || (f.tokens.len() < tokens.len() && tokens.starts_with(&f.tokens)))
                        .map(|f| f.name.clone())
                        .collect();
                    idx.files.retain(|f| !old.contains(&f.name));
                    idx.files.push(DiskEntry {
                        name: name.clone(),
                        tokens: tokens.clone(),
                        states: kv.states().map(|s| s.0 as u32).collect(),
                        bytes,
                        last_used: SystemTime::now(),
                    });
                    idx.verified.insert(name.clone());
                    idx.bytes = idx.files.iter().map(|f| f.bytes).sum();
                    old.into_iter().filter(|n| *n != name).collect()
                };
                for old in superseded {
                    let _ = std::fs::remove_file(self.dir.join(&old));
                }
                self.enforce_cap(Some(&name));
                true
            }
            Err(e) => {
                self.counters.failed_spills.fetch_add(1, Ordering::Relaxed);
                let mut idx = self.lock();
                idx.backoff = (idx.backoff * 2).clamp(Duration::from_secs(5), Duration::from_secs(600));
                idx.backoff_until = Some(Instant::now() + idx.backoff);
                tracing::warn!(error = %e, retry_in_s = idx.backoff.as_secs(), "writing a prompt-cache file failed; backing off");
                false
            }
        }
    }

    /// Delete least-recently-used files until the tier fits its byte cap (`keep` stays).
    fn enforce_cap(&self, keep: Option<&str>) {
        let doomed: Vec<String> = {
            let mut idx = self.lock();
            let mut out = Vec::new();
            while idx.bytes > self.max_bytes {
                let Some((i, _)) = idx
                    .files
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| Some(f.name.as_str()) != keep)
                    .min_by_key(|(_, f)| f.last_used)
                else {
                    break;
                };
                let f = idx.files.remove(i);
                idx.bytes -= f.bytes;
                out.push(f.name);
            }
            out
        };
        for name in doomed {
            tracing::info!(file = %name, "SSD cache over its cap: deleting the least recently used file");
            let _ = std::fs::remove_file(self.dir.join(name));
        }
    }
}
