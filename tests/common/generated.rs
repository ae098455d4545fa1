//! make-gguf's generated models for tests that drive the binary: kept as
//! `<models dir>/generated/<preset>-<type>.gguf` and made here when missing
//! (`scripts/models/make-gguf`, seconds each; it needs python3 with numpy and the preset's
//! vocabulary from `scripts/models/vocab`). A model that cannot be made is `None` (the
//! test prints `skipped:`) unless `CORRAL_REQUIRE_GENERATED=1`.

use std::path::PathBuf;

use super::models_dir;

pub fn generated_model(preset: &str, kind: &str) -> Option<PathBuf> {
    generated_model_with(preset, None, kind)
}

/// `generated_model` with another vocabulary than the preset's (make-gguf's `--vocab`):
/// kept as `<preset>-<vocab>-<type>.gguf`.
pub fn generated_model_with(preset: &str, vocab: Option<&str>, kind: &str) -> Option<PathBuf> {
    let name = vocab.map_or(format!("{preset}-{kind}"), |v| format!("{preset}-{v}-{kind}"));
    let path = models_dir().join(format!("generated/{name}.gguf"));
    if path.is_file() {
        return Some(path);
    }
    // Tests run in parallel processes: each writes its own file, then renames it into
    // place (the bytes are the same every time).
    let root = env!("CARGO_MANIFEST_DIR");
    let own = path.with_extension(format!("{}.tmp", std::process::id()));
    std::fs::create_dir_all(path.parent().expect("a dir")).expect("creates the models dir");
    let made = std::process::Command::new("python3")
        .args([&format!("{root}/scripts/models/make-gguf"), own.to_str().expect("a UTF-8 path")])
        .args(["--preset", preset, "--type", kind, "--jobs", "1"])
        .args(vocab.map(|v| ["--vocab", v]).into_iter().flatten())
        .output()
        .expect("python3 runs");
    if made.status.success() {
        std::fs::rename(&own, &path).expect("renames the model into place");
        return Some(path);
    }
    let _ = std::fs::remove_file(&own);
    let why = String::from_utf8_lossy(&made.stderr);
    assert!(std::env::var("CORRAL_REQUIRE_GENERATED").as_deref() != Ok("1"), "cannot make {}: {why}", path.display());
    eprintln!("skipped: cannot make {} ({})", path.display(), why.trim());
    None
}
