//! Every model this machine has, for `serve`, `ls`, `run` and `bench`: the `.gguf` files
//! of the models directory and the GGUF files of the Hugging Face cache (`corral pull`,
//! `hf download`, llama.cpp's `-hf`). The rules — ids, clashes, queries — are the
//! registry's (`corral_pool::registry`); the cache's layout is `corral_hub`'s.

use std::path::{Path, PathBuf};

use anyhow::Result;
use corral_pool::registry::{self, HubFile, ModelEntry};

/// A model and where it came from.
pub struct Known {
    pub entry: ModelEntry,
    /// `org/name` for a file of the Hugging Face cache; `None` for the models directory.
    pub repo: Option<String>,
}

/// `HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`.
pub fn hf_cache_root() -> PathBuf {
    corral_hub::layout::Env::from_process().cache_root()
}

/// The models directory's models (they keep their file stems), then the Hugging Face
/// cache's, sorted by id.
pub fn discover(models_dir: &Path) -> Result<Vec<Known>> {
    let local = registry::scan(models_dir)?;
    let cached = corral_hub::scan::scan(&hf_cache_root());
    let files: Vec<HubFile> = cached
        .iter()
        .map(|c| HubFile {
            org: c.repo.org().to_owned(),
            name: c.repo.name().to_owned(),
            file: c.file.to_string(),
            path: c.path.clone(),
        })
        .collect();
    let taken: Vec<_> = local.iter().map(|e| e.id.clone()).collect();
    let ids = registry::hub_ids(&taken, &files);
    let mut out: Vec<Known> = local.into_iter().map(|entry| Known { entry, repo: None }).collect();
    for (file, id) in files.into_iter().zip(ids) {
        let repo = format!("{}/{}", file.org, file.name);
        let Some(id) = id else {
            tracing::warn!(repo = %repo, file = %file.file, "skipping a cached model: its name makes no valid model id");
            continue;
        };
        match registry::entry_as(&file.path, id) {
            Ok(entry) => out.push(Known { entry, repo: Some(repo) }),
            Err(e) => tracing::warn!(repo = %repo, error = %e, "skipping a cached model"),
        }
    }
    out.sort_by(|a, b| a.entry.id.cmp(&b.entry.id));
    Ok(out)
}

/// A model named on the command line: a file path, or the id of a known model.
pub fn resolve(name: &str, models_dir: &Path) -> Result<ModelEntry> {
    let p = Path::new(name);
    if p.exists() {
        return Ok(registry::entry(p)?);
    }
    let known: Vec<ModelEntry> = discover(models_dir)?.into_iter().map(|k| k.entry).collect();
    Ok(registry::lookup(name, &known, models_dir)?)
}
