//! The model registry: which models this machine has and what they are called.
//!
//! A model is a `.gguf` file; its id is the file stem (`SmolLM2-135M-Instruct.Q4_1`)
//! unless aliased. Ids are validated (`ModelId`) because they become socket and cache
//! directory names. Files whose stem is not a valid id are skipped with a warning.

use std::path::{Path, PathBuf};

use corral_protocol::ModelId;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelEntry {
    pub id: ModelId,
    pub path: PathBuf,
    pub bytes: u64,
    /// File modification time, unix seconds (`created` in `/v1/models`).
    pub modified: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("cannot read models directory {dir}: {source}")]
    Dir { dir: PathBuf, source: std::io::Error },
    #[error("model {name:?} not found: not a file, and not an id in {dir} (known: {known})")]
    NotFound { name: String, dir: PathBuf, known: String },
    #[error("cannot use {path} as a model: {reason}")]
    BadFile { path: PathBuf, reason: String },
}

/// `$CORRAL_MODELS_DIR`, else `~/.cache/corral/models` (where `scripts/fetch-models` puts them).
pub fn default_models_dir() -> PathBuf {
    match std::env::var_os("CORRAL_MODELS_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => home().join(".cache").join("corral").join("models"),
    }
}

/// The user's cache directory: `$XDG_CACHE_HOME`, else `~/Library/Caches` on macOS,
/// else `~/.cache`.
pub fn user_cache_dir() -> PathBuf {
    match std::env::var_os("XDG_CACHE_HOME") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ if cfg!(target_os = "macos") => home().join("Library").join("Caches"),
        _ => home().join(".cache"),
    }
}

/// Where `corral serve` keeps prompt-cache files by default.
pub fn default_kv_dir() -> PathBuf {
    user_cache_dir().join("corral").join("kv")
}

fn home() -> PathBuf {
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."))
}

/// Every `.gguf` file directly in `dir`, sorted by id. A missing directory is empty.
pub fn scan(dir: &Path) -> Result<Vec<ModelEntry>, RegistryError> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(RegistryError::Dir { dir: dir.to_owned(), source });
        }
    };
    let mut out = Vec::new();
    for ent in rd.flatten() {
        let path = ent.path();
        if path.extension().and_then(|e| e.to_str()) != Some("gguf") {
            continue;
        }
        match entry(&path) {
            Ok(e) => out.push(e),
            Err(err) => tracing::warn!(path = %path.display(), error = %err, "skipping model file"),
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// The entry for one model file; its id is the file stem.
pub fn entry(path: &Path) -> Result<ModelEntry, RegistryError> {
    let bad = |reason: String| RegistryError::BadFile { path: path.to_owned(), reason };
    let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    if !meta.is_file() {
        return Err(bad("not a regular file".into()));
    }
    let stem = path.file_stem().and_then(|s| s.to_str()).ok_or_else(|| bad("file name is not UTF-8".into()))?;
    let id = ModelId::new(stem).map_err(|e| bad(e.to_string()))?;
    let modified =
        meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_secs());
    Ok(ModelEntry { id, path: path.to_owned(), bytes: meta.len(), modified })
}

/// A model named on the command line: an existing file path, or an id in `dir`.
pub fn resolve(name: &str, dir: &Path) -> Result<ModelEntry, RegistryError> {
    let p = Path::new(name);
    if p.exists() {
        return entry(p);
    }
    let all = scan(dir)?;
    if let Some(e) = all.iter().find(|e| e.id.as_str() == name) {
        return Ok(e.clone());
    }
    let known = if all.is_empty() {
        "none; run scripts/fetch-models".to_owned()
    } else {
        all.iter().map(|e| e.id.as_str()).collect::<Vec<_>>().join(", ")
    };
    Err(RegistryError::NotFound { name: name.to_owned(), dir: dir.to_owned(), known })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("corral-registry-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn scans_gguf_files_by_stem() {
        let d = tmpdir("scan");
        std::fs::write(d.join("b-model.Q4_0.gguf"), b"x").unwrap();
        std::fs::write(d.join("a.gguf"), b"xy").unwrap();
        std::fs::write(d.join("notes.txt"), b"").unwrap();
        std::fs::write(d.join("bad name.gguf"), b"").unwrap();
        std::fs::create_dir(d.join("dir.gguf")).unwrap();
        let ids: Vec<String> = scan(&d).unwrap().into_iter().map(|e| e.id.to_string()).collect();
        assert_eq!(ids, vec!["a", "b-model.Q4_0"]);
        assert!(scan(&d.join("missing")).unwrap().is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn resolves_paths_and_ids() {
        let d = tmpdir("resolve");
        let f = d.join("m1.gguf");
        std::fs::write(&f, b"abc").unwrap();
        assert_eq!(resolve(f.to_str().unwrap(), Path::new("/nonexistent")).unwrap().bytes, 3);
        assert_eq!(resolve("m1", &d).unwrap().path, f);
        let err = resolve("nope", &d).unwrap_err().to_string();
        assert!(err.contains("m1"), "{err}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
