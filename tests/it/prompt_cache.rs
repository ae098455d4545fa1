//! The prompt cache and its SSD tier on a real engine (SmolLM2): hits, identical
//! output, restores across restarts, and every kind of bad cache file or directory
//! being a miss that is counted while the answer stays right.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::common::engine::EngineProc;
use crate::common::*;
use corral_engine::cache::file::{self, Identity};
use serde_json::{Value, json};

const SYSTEM: &str = "You are a careful assistant for a small bakery. You answer questions about bread, \
    pastry, opening hours and prices. Keep answers short, friendly and factual. The bakery opens at seven \
    and closes at six, every day except Monday. Sourdough costs four euros, a baguette two.";

fn chat(messages: Value, max_tokens: u32) -> Value {
    json!({"messages": messages, "max_tokens": max_tokens, "temperature": 0})
}

fn sys_user(q: &str) -> Value {
    json!([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
}

fn answer(e: &EngineProc, body: &Value) -> (String, u64, u64) {
    let r = e.post("/v1/chat/completions", body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap().to_owned();
    (
        text,
        v["usage"]["prompt_tokens"].as_u64().unwrap(),
        v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(),
    )
}

fn smol() -> PathBuf {
    model_path(SMOLLM)
}

#[test]
fn ram_hits_are_non_consuming_shared_and_token_identical() {
    let reference = EngineProc::start(&smol(), &["--prompt-cache", "0", "--threads", "1"]);
    let e = EngineProc::start(&smol(), &["--threads", "1"]);
    let q1 = chat(sys_user("When do you open?"), 24);
    let q2 = chat(sys_user("How much is a baguette?"), 24);
    let (t1, p1, c1) = answer(&e, &q1);
    assert_eq!(c1, 0);
    // Another question under the same system prompt reuses it.
    let (t2, p2, c2) = answer(&e, &q2);
    assert!(c2 >= 60 && c2 < p2, "shared system prompt: cached {c2} of {p2}");
    // The first conversation is still cached (hits do not consume): all but one token.
    let (t1b, _, c1b) = answer(&e, &q1);
    assert_eq!(c1b, p1 - 1);
    assert_eq!(t1b, t1);
    // The next turn reuses the whole previous turn (prompt and completion).
    let turn2 = chat(
        json!([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "When do you open?"},
               {"role": "assistant", "content": t1}, {"role": "user", "content": "And on Mondays?"}]),
        24,
    );
    let (t3, p3, c3) = answer(&e, &turn2);
    assert!(c3 >= p1 && c3 < p3, "turn 2: cached {c3} of {p3} (turn 1 prompt {p1})");
    // Streaming reports it too.
    let mut s = e.stream(
        "/v1/chat/completions",
        &json!({"messages": sys_user("When do you open?"), "max_tokens": 4,
        "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}),
    );
    let events = s.collect();
    let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], p1 - 1, "{usage}");
    // Every answer equals the no-cache engine's.
    for (body, text) in [(&q1, &t1), (&q2, &t2), (&turn2, &t3)] {
        let (want, _, cached) = answer(&reference, body);
        assert_eq!(cached, 0);
        assert_eq!(&want, text, "cached and uncached output differ for {body}");
    }
    let pc = e.stats()["prompt_cache"].clone();
    assert!(pc["hits"].as_u64().unwrap() >= 4, "{pc}");
    assert_eq!(pc["misses"], 1, "{pc}");
    assert!(pc["entries"].as_u64().unwrap() >= 2 && pc["bytes"].as_u64().unwrap() > 0, "{pc}");
    assert!(e.stats()["ssd_cache"].is_null(), "a bare engine has no SSD tier unless asked");
}

/// A valid cache file made by a real engine, and the request that hits it.
struct Seed {
    bytes: Vec<u8>,
    name: String,
    fp_dir: String,
    body: Value,
    want: String,
    prompt_tokens: u64,
}

fn seed() -> &'static Seed {
    static SEED: OnceLock<Seed> = OnceLock::new();
    SEED.get_or_init(|| {
        let dir = TempDir::new("seed");
        let kv = dir.path().join("kv");
        let body = chat(sys_user("What does sourdough cost?"), 16);
        let e = EngineProc::start_fresh(&smol(), &["--threads", "1", "--ssd-cache", kv.to_str().unwrap()], |_| {});
        let (want, prompt_tokens, _) = answer(&e, &body);
        let r = e.post("/admin/cache/flush", &json!({}));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["written"], 1, "{}", r.text());
        let fp_dir = std::fs::read_dir(&kv).unwrap().next().unwrap().unwrap();
        let f = std::fs::read_dir(fp_dir.path()).unwrap().next().unwrap().unwrap();
        Seed {
            bytes: std::fs::read(f.path()).unwrap(),
            name: f.file_name().to_string_lossy().into_owned(),
            fp_dir: fp_dir.file_name().to_string_lossy().into_owned(),
            body,
            want,
            prompt_tokens,
        }
    })
}

/// Place `bytes` as the seed's file in a fresh cache dir, start an engine on it, ask the
/// seed's question: the answer must be right and uncached, one rejection counted.
struct Case {
    e: EngineProc,
    fp: PathBuf,
    _dir: TempDir,
}

fn served_correctly_despite(case: &str, place: impl FnOnce(&Path, &Path)) -> Case {
    let s = seed();
    let dir = TempDir::new(case);
    let kv = dir.path().join("kv");
    let fp = kv.join(&s.fp_dir);
    std::fs::create_dir_all(&fp).unwrap();
    for d in [&kv, &fp] {
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    }
    place(&kv, &fp);
    let e = EngineProc::start_fresh(&smol(), &["--threads", "1", "--ssd-cache", kv.to_str().unwrap()], |_| {});
    let (text, prompt_tokens, cached) = answer(&e, &s.body);
    assert_eq!(text, s.want, "{case}: wrong answer");
    assert_eq!(prompt_tokens, s.prompt_tokens);
    assert_eq!(cached, 0, "{case}: a bad file must be a miss");
    let ssd = e.stats()["ssd_cache"].clone();
    assert_eq!(ssd["rejected_files"], 1, "{case}: {ssd}");
    assert!(e.log().contains("WARN") || e.log().contains("\"level\":\"WARN\""), "{case}: no warning logged");
    Case { e, fp, _dir: dir }
}

fn with_bytes(case: &str, bytes: Vec<u8>) -> Case {
    let name = seed().name.clone();
    served_correctly_despite(case, move |_, fp| std::fs::write(fp.join(name), bytes).unwrap())
}

#[test]
fn a_valid_file_restores_after_a_restart() {
    let s = seed();
    let dir = TempDir::new("valid");
    let fp = dir.path().join("kv").join(&s.fp_dir);
    std::fs::create_dir_all(&fp).unwrap();
    std::fs::write(fp.join(&s.name), &s.bytes).unwrap();
    let kv = dir.path().join("kv");
    let e = EngineProc::start_fresh(&smol(), &["--threads", "1", "--ssd-cache", kv.to_str().unwrap()], |_| {});
    let (text, p, cached) = answer(&e, &s.body);
    assert_eq!(text, s.want);
    assert_eq!(cached, p - 1, "restored from disk");
    let ssd = e.stats()["ssd_cache"].clone();
    assert_eq!(ssd["restores"], 1, "{ssd}");
    assert_eq!(ssd["rejected_files"], 0, "{ssd}");
}

#[test]
fn a_truncated_file_is_a_miss() {
    let b = &seed().bytes;
    let c = with_bytes("truncated", b[..b.len() / 2].to_vec());
    assert!(!c.fp.join(&seed().name).exists(), "garbage is deleted");
}

#[test]
fn a_bit_flip_in_the_header_is_a_miss() {
    let mut b = seed().bytes.clone();
    b[300] ^= 0x10; // inside the token ids
    with_bytes("header-flip", b);
}

#[test]
fn a_bit_flip_in_the_data_is_a_miss() {
    let mut b = seed().bytes.clone();
    let at = b.len() - 5000; // in the last tensor
    b[at] ^= 0x01;
    with_bytes("data-flip", b);
}

#[test]
fn a_zero_filled_file_is_a_miss() {
    with_bytes("zeros", vec![0; seed().bytes.len()]);
}

fn rewritten_with(case: &str, change: impl FnOnce(&mut Identity)) {
    let s = seed();
    let real = crate::common::engine::kv_file_identity(&s.bytes);
    let tmp = TempDir::new(case);
    let src = tmp.path().join(&s.name);
    std::fs::write(&src, &s.bytes).unwrap();
    let h = file::read_header(&src, &real).expect("the seed is valid");
    let kv = file::restore(&src, &h, h.tokens.len(), true).unwrap();
    let mut other = real.clone();
    change(&mut other);
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let path = file::write(&out, &other, &h.tokens, &kv, &mut || {}).unwrap();
    with_bytes(case, std::fs::read(path).unwrap());
}

#[test]
fn another_models_file_is_a_miss() {
    rewritten_with("other-model", |id| id.model_fingerprint[3] ^= 0xff);
}

#[test]
fn another_tokenizers_file_is_a_miss() {
    rewritten_with("other-tokenizer", |id| id.tokenizer_hash[0] ^= 0xff);
}

#[test]
fn older_and_newer_format_versions_are_misses() {
    let mut old = seed().bytes.clone();
    old[8..10].copy_from_slice(&0u16.to_le_bytes());
    let c = with_bytes("older", old);
    assert!(!c.fp.join(&seed().name).exists(), "an older file is deleted");
    let mut new = seed().bytes.clone();
    new[8..10].copy_from_slice(&(file::FORMAT_VERSION + 1).to_le_bytes());
    let c = with_bytes("newer", new);
    assert!(c.fp.join(&seed().name).exists(), "a newer corral's file is left alone");
}

#[test]
fn a_symlinked_cache_dir_is_not_used() {
    let s = seed();
    let Case { e, .. } = served_correctly_despite("symlink", |kv, _| {
        let real = kv.with_file_name("real-kv");
        std::fs::remove_dir_all(kv).unwrap();
        std::fs::create_dir_all(real.join(&s.fp_dir)).unwrap();
        std::fs::write(real.join(&s.fp_dir).join(&s.name), &s.bytes).unwrap();
        std::os::unix::fs::symlink(&real, kv).unwrap();
    });
    let ssd = e.stats()["ssd_cache"].clone();
    assert_eq!(ssd["usable"], false, "{ssd}");
    assert!(ssd["error"].as_str().unwrap().contains("symlink"), "{ssd}");
}

#[test]
fn a_world_writable_cache_dir_is_not_used() {
    let s = seed();
    let Case { e, fp, _dir } = served_correctly_despite("world-writable", |_, fp| {
        std::fs::write(fp.join(&s.name), &s.bytes).unwrap();
        std::fs::set_permissions(fp, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    });
    let ssd = e.stats()["ssd_cache"].clone();
    assert_eq!(ssd["usable"], false, "{ssd}");
    assert!(ssd["error"].as_str().unwrap().contains("writable by other users"), "{ssd}");
    assert!(fp.join(&s.name).exists(), "files in an unusable dir are not touched");
}

#[test]
fn a_full_disk_fails_the_write_not_the_request() {
    use nix::sys::resource::{Resource, setrlimit};
    use std::os::unix::process::CommandExt;
    let dir = TempDir::new("full");
    let kv = dir.path().join("kv");
    // A file-size limit stands in for a full disk: every cache file write fails (EFBIG,
    // like ENOSPC) while the engine keeps serving.
    let e = EngineProc::start_fresh(&smol(), &["--threads", "1", "--ssd-cache", kv.to_str().unwrap()], |cmd| {
        // SAFETY: setrlimit is async-signal-safe; nothing else runs in the child here.
        unsafe {
            cmd.pre_exec(|| setrlimit(Resource::RLIMIT_FSIZE, 64 * 1024, 64 * 1024).map_err(std::io::Error::from));
        }
    });
    let body = chat(sys_user("Do you sell croissants?"), 8);
    let (first, p, _) = answer(&e, &body);
    let r = e.post("/admin/cache/flush", &json!({})).json();
    assert_eq!(r["written"], 0, "{r}");
    assert_eq!(r["failed"], 1, "{r}");
    let ssd = e.stats()["ssd_cache"].clone();
    assert!(ssd["failed_spills"].as_u64().unwrap() >= 1, "{ssd}");
    assert_eq!(ssd["entries"], 0, "{ssd}");
    let fp = std::fs::read_dir(&kv).unwrap().next().unwrap().unwrap().path();
    let left: Vec<_> = std::fs::read_dir(&fp).unwrap().flatten().map(|f| f.file_name()).collect();
    assert!(left.is_empty(), "no temp or half file may remain: {left:?}");
    // Requests keep working (from RAM) while caching backs off.
    let (again, _, cached) = answer(&e, &body);
    assert_eq!(again, first);
    assert_eq!(cached, p - 1);
}

/// `--ssd-demote-idle 0` turns idle demotion off (it used to demote every entry at once),
/// and with the write-behind off nothing reaches the disk until a drain: then everything.
#[test]
fn demote_idle_zero_and_write_behind_off_leave_entries_in_ram_until_the_drain() {
    let dir = TempDir::new("nodemote");
    let kv = dir.path().join("kv");
    let kv_arg = kv.display().to_string();
    let args = [
        "--threads",
        "1",
        "--ssd-cache",
        &kv_arg,
        "--ssd-demote-idle",
        "0",
        "--ssd-write-behind",
        "0",
        "--ssd-write-behind-ms",
        "50",
    ];
    let e = EngineProc::start(&smol(), &args);
    answer(&e, &chat(sys_user("When do you open?"), 8));
    // Long past the write-behind delay and any demotion clock.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let s = e.stats();
    assert_eq!(s["prompt_cache"]["entries"], 1, "{s}");
    assert_eq!(s["ssd_cache"]["spills"], 0, "{s}");
    assert_eq!(s["ssd_cache"]["demotions"], 0, "{s}");
    assert_eq!(
        (s["ssd_cache"]["pending_spills"].as_u64(), s["ssd_cache"]["dropped_spills"].as_u64()),
        (Some(0), Some(0))
    );
    let r = e.post("/admin/drain?timeout_ms=1000", &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["demotions"], 1, "{}", r.text());
    assert_eq!(e.stats()["ssd_cache"]["spills"], 1);
}
