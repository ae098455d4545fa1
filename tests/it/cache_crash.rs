//! Crash safety of the SSD tier: a real engine is `kill -9`ed at random moments while it
//! writes prompt-cache files, over and over. No published file may ever fail its checks,
//! temp files are cleaned at the next start, and the cache still gives correct output.
//!
//! Iterations: `CORRAL_CRASH_ITERATIONS` (default 50; `scripts/test/crash-cache` runs 1,000).

use std::io::Write;
use std::time::Duration;

use crate::common::engine::EngineProc;
use crate::common::*;
use corral_engine::cache::file::{self, Identity};
use serde_json::{Value, json};

fn base_prompt() -> String {
    let facts = [
        "The river rises in the northern hills and runs south for two hundred kilometres.",
        "Its valley was farmed for three thousand years before the first town was built.",
        "Millers used its current to grind grain, and later to spin cotton.",
        "The old stone bridge has nine arches and was rebuilt after the flood of 1870.",
    ];
    (0..12).map(|i| facts[i % facts.len()]).collect::<Vec<_>>().join(" ")
}

fn files(dir: &std::path::Path) -> (Vec<std::path::PathBuf>, Vec<std::path::PathBuf>) {
    let all: Vec<_> = std::fs::read_dir(dir).map(|rd| rd.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    let temp = all.iter().filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(".tmp-")).cloned().collect();
    let published = all
        .iter()
        .filter(|p| {
            p.extension().is_some_and(|e| e == "kv") && !p.file_name().unwrap().to_string_lossy().starts_with('.')
        })
        .cloned()
        .collect();
    (published, temp)
}

fn complete(e: &EngineProc, prompt: &str) -> Value {
    let r = e.post("/v1/completions", &json!({"prompt": prompt, "max_tokens": 3, "temperature": 0}));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

#[test]
fn kill_9_while_writing_never_publishes_a_bad_file() {
    let iterations: usize = std::env::var("CORRAL_CRASH_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(50);
    let dir = TempDir::new("crash");
    let kv = dir.path().join("kv");
    let args = [
        "--threads",
        "1",
        "--ssd-cache",
        kv.to_str().unwrap(),
        "--ssd-cache-max",
        "0.05",
        "--ssd-write-behind-ms",
        "0",
    ];
    let model = model_path(SMOLLM);
    let base = base_prompt();
    let mut identity: Option<Identity> = None;
    let (mut temps_seen, mut checked) = (0usize, 0usize);
    for i in 0..iterations {
        let e = EngineProc::start_fresh(&model, &args, |_| {});
        complete(&e, &format!("{base} Note {i}:"));
        // Ask for a flush and kill the engine somewhere inside it.
        let mut conn = e.conn();
        let _ = conn.write_all(b"POST /admin/cache/flush HTTP/1.1\r\nhost: e\r\ncontent-length: 0\r\n\r\n");
        std::thread::sleep(Duration::from_micros(rand_below(30_000)));
        e.signal(nix::sys::signal::Signal::SIGKILL);
        let mut e = e;
        let _ = e.child.wait();
        let fp = std::fs::read_dir(&kv).unwrap().flatten().find(|d| d.path().is_dir()).map(|d| d.path());
        let Some(fp) = fp else { continue };
        let (published, temp) = files(&fp);
        temps_seen += temp.len();
        for p in &published {
            let bytes = std::fs::read(p).unwrap();
            let id = identity.get_or_insert_with(|| crate::common::engine::kv_file_identity(&bytes));
            if let Err(why) = file::verify(p, id) {
                panic!("iteration {i}: published file {} is invalid: {why}", p.display());
            }
            checked += 1;
        }
    }
    eprintln!(
        "{iterations} kills: {checked} published-file checks passed, {temps_seen} temp files left by killed writers"
    );
    // The next start removes what crashed writers left, and the cache still answers right.
    let e = EngineProc::start_fresh(&model, &args, |_| {});
    let fp = std::fs::read_dir(&kv).unwrap().flatten().find(|d| d.path().is_dir()).unwrap().path();
    assert!(files(&fp).1.is_empty(), "temp files survive a restart: {:?}", files(&fp).1);
    let prompt = format!("{base} Note {iterations}:");
    let got = complete(&e, &prompt);
    assert!(got["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() > 100, "{got}");
    assert_eq!(e.stats()["ssd_cache"]["rejected_files"], 0);
    let reference = EngineProc::start_fresh(&model, &["--threads", "1", "--prompt-cache", "0"], |_| {});
    let want = complete(&reference, &prompt);
    assert_eq!(got["choices"][0]["text"], want["choices"][0]["text"], "cached output differs from uncached");
}

fn rand_below(n: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64);
    h.finish() % n
}
