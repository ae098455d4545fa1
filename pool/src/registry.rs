//! The model registry: which models this machine has and what they are called.
//!
//! A model is a `.gguf` file; its id is the file stem (`SmolLM2-135M-Instruct.Q4_1`)
//! unless aliased. Ids are validated (`ModelId`) because they become socket and cache
//! directory names. Files whose stem is not a valid id are skipped with a warning.
//!
//! Files from the Hugging Face cache (found by `corral-hub`, handed in as `HubFile`s)
//! get ids here too (`hub_ids`): the file stem when it is free, else the stem qualified
//! by the repository. A query (`corral serve smollm`) keeps the models whose id contains
//! it (`select`).

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
    #[error("no model id contains {query:?}; known: {known}")]
    NoMatch { query: String, known: String },
}

/// A GGUF file in the Hugging Face cache, before it has an id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubFile {
    pub org: String,
    pub name: String,
    /// The file's path inside the repository.
    pub file: String,
    /// Where it is on disk (the snapshot link).
    pub path: PathBuf,
}

/// `$CORRAL_MODELS_DIR`, else `~/.cache/corral/models` (where `scripts/models/fetch` puts them).
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
    let stem = path.file_stem().and_then(|s| s.to_str()).ok_or_else(|| bad("file name is not UTF-8".into()))?;
    let id = ModelId::new(stem).map_err(|e| bad(e.to_string()))?;
    entry_as(path, id)
}

/// The entry for one model file under a given id.
pub fn entry_as(path: &Path, id: ModelId) -> Result<ModelEntry, RegistryError> {
    let bad = |reason: String| RegistryError::BadFile { path: path.to_owned(), reason };
    let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    if !meta.is_file() {
        return Err(bad("not a regular file".into()));
    }
    let modified =
        meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_secs());
    Ok(ModelEntry { id, path: path.to_owned(), bytes: meta.len(), modified })
}

/// The model with id `name` among `known` (found in `dir` and elsewhere).
pub fn lookup(name: &str, known: &[ModelEntry], dir: &Path) -> Result<ModelEntry, RegistryError> {
    if let Some(e) = known.iter().find(|e| e.id.as_str() == name) {
        return Ok(e.clone());
    }
    Err(RegistryError::NotFound {
        name: name.to_owned(),
        dir: dir.to_owned(),
        known: known_ids(known.iter().map(|e| &e.id)),
    })
}

fn known_ids<'a>(ids: impl Iterator<Item = &'a ModelId>) -> String {
    let ids: Vec<&str> = ids.map(ModelId::as_str).collect();
    if ids.is_empty() { "none; run scripts/models/fetch or corral pull ORG/REPO".to_owned() } else { ids.join(", ") }
}

/// Ids for files of the Hugging Face cache, given the ids already taken (the models
/// directory's). Each file takes the first free and valid one of: its file stem
/// (`SmolLM2-135M-Instruct-Q4_K_M`); `<org>--<stem>`; `<org>--<name>--<path>` (the path
/// inside the repository with `/` as `--`, no `.gguf`), which no other file can have.
/// Files are taken in the order given — the cache scan's, oldest first — so a model
/// pulled later never takes an id from one that was there before. `None`: no valid id
/// (a name too long, or with characters an id cannot hold).
pub fn hub_ids(taken: &[ModelId], files: &[HubFile]) -> Vec<Option<ModelId>> {
    let mut used: std::collections::HashSet<String> = taken.iter().map(|i| i.as_str().to_owned()).collect();
    files
        .iter()
        .map(|f| {
            let strip = |p: &str| match p.len().checked_sub(5) {
                Some(n) if p.is_char_boundary(n) && p[n..].eq_ignore_ascii_case(".gguf") => p[..n].to_owned(),
                _ => p.to_owned(),
            };
            let stem = strip(f.file.rsplit('/').next().unwrap_or(&f.file));
            let tries = [
                stem.clone(),
                format!("{}--{stem}", f.org),
                format!("{}--{}--{}", f.org, f.name, strip(&f.file).replace('/', "--")),
            ];
            let id = tries.into_iter().filter_map(|t| ModelId::new(t).ok()).find(|id| !used.contains(id.as_str()))?;
            used.insert(id.as_str().to_owned());
            Some(id)
        })
        .collect()
}

/// The items whose id contains `query`, ignoring case; none is an error naming them all.
pub fn select<T>(items: Vec<T>, id: impl Fn(&T) -> &ModelId, query: &str) -> Result<Vec<T>, RegistryError> {
    let q = query.to_lowercase();
    let known = known_ids(items.iter().map(&id));
    let kept: Vec<T> = items.into_iter().filter(|i| id(i).as_str().to_lowercase().contains(&q)).collect();
    if kept.is_empty() {
        return Err(RegistryError::NoMatch { query: query.to_owned(), known });
    }
    Ok(kept)
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

    fn hub(org: &str, name: &str, file: &str) -> HubFile {
        HubFile { org: org.into(), name: name.into(), file: file.into(), path: PathBuf::from(file) }
    }

    #[test]
    fn hub_files_take_their_stem_else_a_qualified_id() {
        let taken = [ModelId::new("m-Q4_K_M").unwrap()];
        let files = [
            hub("a", "m-GGUF", "m-Q4_K_M.gguf"),
            hub("b", "x-GGUF", "x-Q8_0.gguf"),
            hub("b", "m-GGUF", "m-Q4_K_M.gguf"),
            hub("b", "m2-GGUF", "q4/m-Q4_K_M.gguf"),
            hub("c", "y", "Q4_K_M/x-Q8_0.GGUF"),
            hub("d", "z", &format!("{}.gguf", "w".repeat(200))),
            hub("e", "s", "bad name.gguf"),
        ];
        let ids: Vec<Option<String>> = hub_ids(&taken, &files).into_iter().map(|i| i.map(|i| i.to_string())).collect();
        assert_eq!(
            ids,
            vec![
                Some("a--m-Q4_K_M".into()),
                Some("x-Q8_0".into()),
                Some("b--m-Q4_K_M".into()),
                Some("b--m2-GGUF--q4--m-Q4_K_M".into()),
                Some("c--x-Q8_0".into()),
                None,
                None,
            ]
        );
    }

    #[test]
    fn queries_keep_ids_containing_them() {
        let ids: Vec<ModelId> = ["SmolLM2-135M", "gemma-3-270m", "smollm3"].map(|s| ModelId::new(s).unwrap()).to_vec();
        let got = select(ids.clone(), |i| i, "SMOLLM").unwrap();
        assert_eq!(got.iter().map(|i| i.as_str()).collect::<Vec<_>>(), ["SmolLM2-135M", "smollm3"]);
        assert_eq!(select(ids.clone(), |i| i, "270").unwrap().len(), 1);
        let err = select(ids, |i| i, "qwen").unwrap_err().to_string();
        assert!(err.contains("\"qwen\"") && err.contains("gemma-3-270m") && err.contains("smollm3"), "{err}");
        let err = select(Vec::<ModelId>::new(), |i| i, "x").unwrap_err().to_string();
        assert!(err.contains("corral pull"), "{err}");
    }

    #[test]
    fn looks_ids_up() {
        let d = tmpdir("resolve");
        let f = d.join("m1.gguf");
        std::fs::write(&f, b"abc").unwrap();
        let known = scan(&d).unwrap();
        assert_eq!(lookup("m1", &known, &d).unwrap().path, f);
        assert_eq!(entry_as(&f, ModelId::new("other").unwrap()).unwrap().bytes, 3);
        let err = lookup("nope", &known, &d).unwrap_err().to_string();
        assert!(err.contains("m1"), "{err}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
