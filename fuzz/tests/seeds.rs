//! Every committed seed (`fuzz/corpus/<target>/`) replayed through its fuzz target's
//! body, one test per target, on stable Rust: what CI runs on every commit instead of
//! building the libFuzzer targets (nightly). A seed that makes a body panic fails its
//! target's test, naming the file. Real fuzzing, which finds new inputs, is
//! `scripts/test/fuzz` (docs/reliability.md, "Fuzzing").

use std::any::Any;
use std::panic;
use std::path::{Path, PathBuf};

fn fuzz_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The file stems in `dir`, sorted.
fn stems(dir: &Path, ext: Option<&str>) -> Vec<String> {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut out: Vec<String> = entries
        .map(|e| e.unwrap_or_else(|e| panic!("{}: {e}", dir.display())).path())
        .filter(|p| ext.is_none_or(|ext| p.extension().is_some_and(|x| x == ext)))
        .filter_map(|p| Some(p.file_stem()?.to_str()?.to_owned()))
        .collect();
    out.sort();
    out
}

fn message(payload: &(dyn Any + Send)) -> &str {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(s), _) => s,
        (_, Some(s)) => s,
        _ => "(a panic without a message)",
    }
}

/// Run every seed of `target` through `body`; fail naming each seed that panicked.
fn replay(target: &str, body: fn(&[u8])) {
    let dir = fuzz_dir().join("corpus").join(target);
    let seeds: Vec<PathBuf> = stems(&dir, None).iter().map(|s| dir.join(s)).collect();
    assert!(!seeds.is_empty(), "{} holds no seeds", dir.display());
    let mut failed = Vec::new();
    for seed in &seeds {
        let bytes = std::fs::read(seed).unwrap_or_else(|e| panic!("{}: {e}", seed.display()));
        if let Err(payload) = panic::catch_unwind(|| body(&bytes)) {
            failed.push(format!("  {}: {}", seed.display(), message(payload.as_ref())));
        }
    }
    assert!(
        failed.is_empty(),
        "{target}: {} of {} seeds panicked (under libFuzzer: cargo +nightly fuzz run --fuzz-dir fuzz/targets \
         -s none {target} <seed>):\n{}",
        failed.len(),
        seeds.len(),
        failed.join("\n")
    );
}

/// One test per target, and the list of them (checked against the targets and corpora).
macro_rules! replay_tests {
    ($($target:ident),* $(,)?) => {
        const REPLAYED: &[&str] = &[$(stringify!($target)),*];
        $(
            #[test]
            fn $target() {
                replay(stringify!($target), corral_fuzz::$target);
            }
        )*
    };
}

replay_tests!(
    anthropic_request,
    cache_file,
    cache_file_hybrid,
    chat_template,
    gguf_header,
    model_id,
    openai_request,
    responses_request,
    tool_calls,
);

/// A new libFuzzer target, or a corpus without one, fails here until it is replayed above.
#[test]
fn every_target_and_every_corpus_is_replayed() {
    let replayed: Vec<String> = REPLAYED.iter().map(|s| s.to_string()).collect();
    let targets = stems(&fuzz_dir().join("targets/fuzz_targets"), Some("rs"));
    assert_eq!(targets, replayed, "the libFuzzer targets (fuzz/targets/fuzz_targets/) and the replayed ones differ");
    let corpora = stems(&fuzz_dir().join("corpus"), None);
    assert_eq!(corpora, replayed, "the corpora (fuzz/corpus/) and the replayed targets differ");
}
