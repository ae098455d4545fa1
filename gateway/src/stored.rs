//! Stored Responses (`previous_response_id`, `GET`/`DELETE /v1/responses/{id}`): kept by
//! the gateway, not an engine, so a conversation survives an engine's eviction, crash or
//! a model switch; bounded by count, bytes and age; and persisted one file per response
//! (written to a temporary name, synced, renamed: never half-written) so it survives a
//! gateway restart.
//!
//! The entries live in memory (the bounds keep that small); a writer thread mirrors them
//! to disk in order, so request paths never wait on the disk. Which entries go is a pure
//! decision (`to_evict`), tested with plain values.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Where responses are persisted; `None` keeps them in memory only.
    pub dir: Option<PathBuf>,
    pub max_count: usize,
    pub max_bytes: u64,
    pub ttl: Duration,
}

/// One stored response: the whole input its engine saw (the history included, without
/// `instructions`, which never carry over) and the response object it answered.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct Stored {
    pub id: String,
    pub created_at: u64,
    pub input: Vec<Value>,
    pub response: Value,
}

impl Stored {
    /// The conversation so far: its input, then its output items.
    pub fn history(&self) -> Vec<Value> {
        let mut items = self.input.clone();
        if let Some(out) = self.response.get("output").and_then(Value::as_array) {
            items.extend(out.iter().cloned());
        }
        items
    }
}

/// What eviction looks at.
#[derive(Clone, Debug, PartialEq)]
pub struct Meta {
    pub id: String,
    pub created_at: u64,
    pub bytes: u64,
    /// Insertion order, for entries created in the same second.
    pub seq: u64,
}

/// The ids to drop: everything older than the TTL, then the oldest until both the count
/// and the byte bounds hold.
pub fn to_evict(entries: &[Meta], now: u64, cfg: &StoreConfig) -> Vec<String> {
    let mut by_age: Vec<&Meta> = entries.iter().collect();
    by_age.sort_by_key(|m| (m.created_at, m.seq));
    let (mut count, mut bytes) = (entries.len(), entries.iter().map(|m| m.bytes).sum::<u64>());
    let mut out = Vec::new();
    for m in by_age {
        let expired = m.created_at.saturating_add(cfg.ttl.as_secs()) < now;
        if !expired && count <= cfg.max_count && bytes <= cfg.max_bytes {
            break;
        }
        count -= 1;
        bytes -= m.bytes;
        out.push(m.id.clone());
    }
    out
}

/// Ids become file names, so only ones of our own form are accepted.
pub fn valid_id(id: &str) -> bool {
    id.strip_prefix("resp_")
        .is_some_and(|r| !r.is_empty() && r.len() <= 96 && r.bytes().all(|b| b.is_ascii_alphanumeric()))
}

enum Op {
    Put(Arc<Stored>),
    Delete(String),
    Flush(tokio::sync::oneshot::Sender<()>),
}

struct Entry {
    stored: Arc<Stored>,
    meta: Meta,
}

pub struct ResponseStore {
    cfg: StoreConfig,
    entries: Mutex<HashMap<String, Entry>>,
    next_seq: Mutex<u64>,
    writer: Option<Mutex<mpsc::Sender<Op>>>,
}

impl ResponseStore {
    /// Load what an earlier run persisted (bad files are skipped with a warning) and
    /// start the writer. A directory that cannot be used leaves the store in memory
    /// only, said once in the log.
    pub fn open(cfg: StoreConfig) -> Self {
        let mut store = ResponseStore {
            cfg: cfg.clone(),
            entries: Mutex::new(HashMap::new()),
            next_seq: Mutex::new(0),
            writer: None,
        };
        let Some(dir) = cfg.dir.clone() else { return store };
        if let Err(e) = corral_net::dirs::ensure_dir(&dir, corral_net::dirs::Access::Private) {
            tracing::error!(error = %e, "stored responses stay in memory only");
            return store;
        }
        let mut loaded = load_dir(&dir);
        loaded.sort_by_key(|s| s.created_at);
        let n = loaded.len();
        for s in loaded {
            store.insert_entry(Arc::new(s));
        }
        let (tx, rx) = mpsc::channel();
        let spawned = std::thread::Builder::new().name("responses-store".into()).spawn(move || write_loop(&dir, rx));
        match spawned {
            Ok(_) => store.writer = Some(Mutex::new(tx)),
            Err(e) => tracing::error!(error = %e, "stored responses stay in memory only"),
        }
        let gone = store.evict();
        tracing::info!(loaded = n, evicted = gone, "stored responses");
        store
    }

    pub fn get(&self, id: &str) -> Option<Arc<Stored>> {
        let g = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let e = g.get(id)?;
        let expired = e.meta.created_at.saturating_add(self.cfg.ttl.as_secs()) < unix_now();
        (!expired).then(|| e.stored.clone())
    }

    pub fn put(&self, stored: Stored) {
        let stored = Arc::new(stored);
        self.insert_entry(stored.clone());
        self.send(Op::Put(stored));
        self.evict();
    }

    /// Whether it was there.
    pub fn delete(&self, id: &str) -> bool {
        let had = self.entries.lock().unwrap_or_else(|e| e.into_inner()).remove(id).is_some();
        if had {
            self.send(Op::Delete(id.to_owned()));
        }
        had
    }

    /// Resolves once every change so far is on disk.
    pub async fn flush(&self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.send(Op::Flush(tx)) {
            let _ = rx.await;
        }
    }

    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn insert_entry(&self, stored: Arc<Stored>) {
        let bytes = serde_json::to_vec(&*stored).map_or(0, |v| v.len() as u64);
        let seq = {
            let mut s = self.next_seq.lock().unwrap_or_else(|e| e.into_inner());
            *s += 1;
            *s
        };
        let meta = Meta { id: stored.id.clone(), created_at: stored.created_at, bytes, seq };
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).insert(stored.id.clone(), Entry { stored, meta });
    }

    fn evict(&self) -> usize {
        let gone = {
            let mut g = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            let metas: Vec<Meta> = g.values().map(|e| e.meta.clone()).collect();
            let gone = to_evict(&metas, unix_now(), &self.cfg);
            for id in &gone {
                g.remove(id);
            }
            gone
        };
        for id in &gone {
            self.send(Op::Delete(id.clone()));
        }
        gone.len()
    }

    /// Whether a writer took it.
    fn send(&self, op: Op) -> bool {
        let Some(w) = &self.writer else { return false };
        w.lock().unwrap_or_else(|e| e.into_inner()).send(op).is_ok()
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn file_of(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.json"))
}

fn load_dir(dir: &Path) -> Vec<Stored> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out = Vec::new();
    for ent in rd.flatten() {
        let path = ent.path();
        let name = ent.file_name().to_string_lossy().into_owned();
        if name.ends_with(".tmp") {
            // A write cut short by a crash: never read, removed.
            let _ = std::fs::remove_file(&path);
            continue;
        }
        let Some(id) = name.strip_suffix(".json") else { continue };
        let parsed = std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<Stored>(&b).map_err(|e| e.to_string()));
        match parsed {
            Ok(s) if s.id == id && valid_id(id) => out.push(s),
            Ok(_) => tracing::warn!(file = %path.display(), "stored response file does not match its name; skipped"),
            Err(e) => tracing::warn!(file = %path.display(), error = %e, "unreadable stored response; skipped"),
        }
    }
    out
}

fn write_loop(dir: &Path, rx: mpsc::Receiver<Op>) {
    while let Ok(op) = rx.recv() {
        match op {
            Op::Put(s) => {
                if let Err(e) = write_atomic(&file_of(dir, &s.id), &s) {
                    tracing::warn!(id = %s.id, error = %e, "could not persist a stored response");
                }
            }
            Op::Delete(id) => match std::fs::remove_file(file_of(dir, &id)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!(id = %id, error = %e, "could not remove a stored response")
                }
                _ => {}
            },
            Op::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

fn write_atomic(path: &Path, s: &Stored) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("json.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&serde_json::to_vec(s)?)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg(max_count: usize, max_bytes: u64, ttl_s: u64) -> StoreConfig {
        StoreConfig { dir: None, max_count, max_bytes, ttl: Duration::from_secs(ttl_s) }
    }

    fn meta(id: &str, created_at: u64, bytes: u64, seq: u64) -> Meta {
        Meta { id: id.into(), created_at, bytes, seq }
    }

    #[test]
    fn eviction_takes_the_expired_then_the_oldest_until_the_bounds_hold() {
        let m = [meta("a", 100, 10, 1), meta("b", 200, 10, 2), meta("c", 200, 10, 3), meta("d", 300, 10, 4)];
        assert!(to_evict(&m, 300, &cfg(4, 40, 1000)).is_empty());
        assert_eq!(to_evict(&m, 300, &cfg(3, 40, 1000)), ["a"]);
        assert_eq!(to_evict(&m, 300, &cfg(4, 25, 1000)), ["a", "b"], "bytes; same second goes by insertion");
        assert_eq!(to_evict(&m, 350, &cfg(10, 1000, 100)), ["a", "b", "c"], "older than the TTL");
        assert_eq!(to_evict(&m, 300, &cfg(0, 1000, 1000)).len(), 4);
    }

    #[test]
    fn ids_are_only_our_own_form() {
        assert!(valid_id("resp_0123abcdEF"));
        for bad in ["resp_", "resp_../x", "resp_a/b", "x_1", "resp_a.json", ""] {
            assert!(!valid_id(bad), "{bad}");
        }
    }

    fn stored(id: &str, created_at: u64) -> Stored {
        Stored {
            id: id.into(),
            created_at,
            input: vec![json!({"role": "user", "content": "hi"})],
            response: json!({"id": id, "output": [{"type": "message", "content": [{"type": "output_text", "text": "hello"}]}]}),
        }
    }

    #[test]
    fn history_is_input_then_output() {
        let h = stored("resp_1", 1).history();
        assert_eq!(h.len(), 2);
        assert_eq!(h[1]["type"], "message");
    }

    #[tokio::test]
    async fn what_is_stored_survives_a_reopen_and_deletes_stick() {
        let dir = std::env::temp_dir().join(format!("corral-stored-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let c =
            StoreConfig { dir: Some(dir.clone()), max_count: 2, max_bytes: 1 << 20, ttl: Duration::from_secs(3600) };
        let now = unix_now();
        {
            let s = ResponseStore::open(c.clone());
            s.put(stored("resp_a", now - 2));
            s.put(stored("resp_b", now - 1));
            s.put(stored("resp_c", now));
            assert!(s.get("resp_a").is_none(), "over the count bound");
            assert!(s.delete("resp_b"));
            assert!(!s.delete("resp_b"));
            s.flush().await;
        }
        std::fs::write(dir.join("resp_x.json.tmp"), b"{half").unwrap();
        std::fs::write(dir.join("resp_y.json"), b"not json").unwrap();
        let s = ResponseStore::open(c);
        assert_eq!(s.len(), 1);
        assert_eq!(*s.get("resp_c").unwrap(), stored("resp_c", now));
        assert!(!dir.join("resp_x.json.tmp").exists(), "a cut write is removed");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
