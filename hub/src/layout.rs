//! Where things live in the Hugging Face cache, as `huggingface_hub`, `hf download` and
//! llama.cpp lay it out, so a file any of them downloaded is found here and ours are
//! found by them:
//!
//! ```text
//! <root>/models--<org>--<name>/
//!     blobs/<etag>                      the bytes (etag = sha256 for LFS files)
//!     blobs/<etag>.incomplete           a download in progress (resumed with Range)
//!     snapshots/<commit>/<path>         relative symlink to ../../blobs/<etag>
//!     refs/<revision>                   the commit the revision pointed at
//! <root>/.locks/models--<org>--<name>/<etag>.lock   one writer per blob (flock)
//! ```
//!
//! Pure path arithmetic: nothing here touches the disk.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::repo::{RepoId, RepoPath, Revision};

/// The environment variables that place the cache and the token, read once.
#[derive(Clone, Debug, Default)]
pub struct Env {
    pub hf_hub_cache: Option<OsString>,
    /// The older name of `HF_HUB_CACHE`, still honoured by `huggingface_hub`.
    pub huggingface_hub_cache: Option<OsString>,
    pub hf_home: Option<OsString>,
    pub hf_token_path: Option<OsString>,
    pub xdg_cache_home: Option<OsString>,
    pub home: Option<OsString>,
}

impl Env {
    pub fn from_process() -> Self {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        Self {
            hf_hub_cache: var("HF_HUB_CACHE"),
            huggingface_hub_cache: var("HUGGINGFACE_HUB_CACHE"),
            hf_home: var("HF_HOME"),
            hf_token_path: var("HF_TOKEN_PATH"),
            xdg_cache_home: var("XDG_CACHE_HOME"),
            home: var("HOME"),
        }
    }

    /// `HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface` (on
    /// macOS too: that is where the Python library puts it).
    pub fn hf_home(&self) -> PathBuf {
        if let Some(h) = &self.hf_home {
            return PathBuf::from(h);
        }
        let cache = match (&self.xdg_cache_home, &self.home) {
            (Some(x), _) => PathBuf::from(x),
            (None, Some(h)) => Path::new(h).join(".cache"),
            (None, None) => PathBuf::from(".cache"),
        };
        cache.join("huggingface")
    }

    /// The hub cache: `HF_HUB_CACHE`, else `HUGGINGFACE_HUB_CACHE`, else `<HF_HOME>/hub`.
    pub fn cache_root(&self) -> PathBuf {
        match self.hf_hub_cache.as_ref().or(self.huggingface_hub_cache.as_ref()) {
            Some(d) => PathBuf::from(d),
            None => self.hf_home().join("hub"),
        }
    }

    /// The file `hf auth login` writes: `HF_TOKEN_PATH`, else `<HF_HOME>/token`.
    pub fn token_path(&self) -> PathBuf {
        match &self.hf_token_path {
            Some(p) => PathBuf::from(p),
            None => self.hf_home().join("token"),
        }
    }
}

/// `models--org--name`: the repository's folder in the cache.
pub fn repo_folder(repo: &RepoId) -> String {
    format!("models--{}--{}", repo.org(), repo.name())
}

/// The repository a cache folder belongs to, if it is a model repository's folder.
pub fn repo_of_folder(folder: &str) -> Option<RepoId> {
    let rest = folder.strip_prefix("models--")?;
    let (org, name) = rest.split_once("--")?;
    RepoId::parse(&format!("{org}/{name}")).ok()
}

/// A blob's name is its etag: hex for the hub's files; anything that could step out of
/// `blobs/` is refused.
pub fn valid_etag(etag: &str) -> bool {
    !etag.is_empty() && etag.len() <= 128 && etag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// One repository's folder and the paths inside it.
#[derive(Clone, Debug)]
pub struct RepoDir {
    dir: PathBuf,
    locks: PathBuf,
}

impl RepoDir {
    pub fn new(root: &Path, repo: &RepoId) -> Self {
        let folder = repo_folder(repo);
        Self { dir: root.join(&folder), locks: root.join(".locks").join(folder) }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn blobs(&self) -> PathBuf {
        self.dir.join("blobs")
    }

    pub fn blob(&self, etag: &str) -> PathBuf {
        self.blobs().join(etag)
    }

    pub fn partial(&self, etag: &str) -> PathBuf {
        self.blobs().join(format!("{etag}.incomplete"))
    }

    pub fn lock(&self, etag: &str) -> PathBuf {
        self.locks.join(format!("{etag}.lock"))
    }

    pub fn snapshots(&self) -> PathBuf {
        self.dir.join("snapshots")
    }

    pub fn snapshot(&self, commit: &str, file: &RepoPath) -> PathBuf {
        self.snapshots().join(commit).join(file.as_str())
    }

    pub fn ref_file(&self, revision: &Revision) -> PathBuf {
        self.dir.join("refs").join(revision.as_str())
    }
}

/// What a snapshot link holds: the blob, relative to the link's own folder
/// (`snapshots/<commit>/<folders…>/`), so the cache can be moved as a whole.
pub fn link_target(file: &RepoPath, etag: &str) -> PathBuf {
    let mut p = PathBuf::new();
    for _ in 0..file.depth() + 2 {
        p.push("..");
    }
    p.join("blobs").join(etag)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Env {
        let get = |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| OsString::from(v));
        Env {
            hf_hub_cache: get("HF_HUB_CACHE"),
            huggingface_hub_cache: get("HUGGINGFACE_HUB_CACHE"),
            hf_home: get("HF_HOME"),
            hf_token_path: get("HF_TOKEN_PATH"),
            xdg_cache_home: get("XDG_CACHE_HOME"),
            home: get("HOME"),
        }
    }

    #[test]
    fn the_cache_root_follows_huggingface_hub() {
        let home = [("HOME", "/home/u")];
        assert_eq!(env(&home).cache_root(), Path::new("/home/u/.cache/huggingface/hub"));
        assert_eq!(env(&home).token_path(), Path::new("/home/u/.cache/huggingface/token"));
        let xdg = [("HOME", "/home/u"), ("XDG_CACHE_HOME", "/x")];
        assert_eq!(env(&xdg).cache_root(), Path::new("/x/huggingface/hub"));
        let hf_home = [("HOME", "/home/u"), ("XDG_CACHE_HOME", "/x"), ("HF_HOME", "/hf")];
        assert_eq!(env(&hf_home).cache_root(), Path::new("/hf/hub"));
        assert_eq!(env(&hf_home).token_path(), Path::new("/hf/token"));
        let legacy = [("HF_HOME", "/hf"), ("HUGGINGFACE_HUB_CACHE", "/old")];
        assert_eq!(env(&legacy).cache_root(), Path::new("/old"));
        let both = [("HF_HUB_CACHE", "/new"), ("HUGGINGFACE_HUB_CACHE", "/old"), ("HF_TOKEN_PATH", "/t")];
        assert_eq!(env(&both).cache_root(), Path::new("/new"));
        assert_eq!(env(&both).token_path(), Path::new("/t"));
    }

    #[test]
    fn repo_paths() {
        let repo = RepoId::parse("org/Model-GGUF").unwrap();
        let d = RepoDir::new(Path::new("/c"), &repo);
        assert_eq!(d.dir(), Path::new("/c/models--org--Model-GGUF"));
        assert_eq!(d.blob("abc"), Path::new("/c/models--org--Model-GGUF/blobs/abc"));
        assert_eq!(d.partial("abc"), Path::new("/c/models--org--Model-GGUF/blobs/abc.incomplete"));
        assert_eq!(d.lock("abc"), Path::new("/c/.locks/models--org--Model-GGUF/abc.lock"));
        let f = RepoPath::parse("q4/m.gguf").unwrap();
        assert_eq!(d.snapshot("c0", &f), Path::new("/c/models--org--Model-GGUF/snapshots/c0/q4/m.gguf"));
        let rev = Revision::parse("refs/pr/1").unwrap();
        assert_eq!(d.ref_file(&rev), Path::new("/c/models--org--Model-GGUF/refs/refs/pr/1"));
        assert_eq!(repo_of_folder("models--org--Model-GGUF"), Some(repo));
        assert_eq!(repo_of_folder("datasets--org--x"), None);
        assert_eq!(repo_of_folder("models--gpt2"), None);
    }

    #[test]
    fn links_climb_out_of_the_snapshot() {
        let top = RepoPath::parse("m.gguf").unwrap();
        assert_eq!(link_target(&top, "e1"), Path::new("../../blobs/e1"));
        let nested = RepoPath::parse("a/b/m.gguf").unwrap();
        assert_eq!(link_target(&nested, "e1"), Path::new("../../../../blobs/e1"));
        // Resolved from the link's folder, it lands in the repository's blobs/.
        let link_dir = Path::new("/c/r/snapshots/c0/a/b");
        let resolved = link_dir.join(link_target(&nested, "e1"));
        let norm: PathBuf = resolved.components().fold(PathBuf::new(), |mut acc, c| {
            match c {
                std::path::Component::ParentDir => {
                    acc.pop();
                }
                other => acc.push(other),
            }
            acc
        });
        assert_eq!(norm, Path::new("/c/r/blobs/e1"));
    }

    #[test]
    fn etags_cannot_name_other_paths() {
        assert!(valid_etag("b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"));
        for bad in ["", "../x", "a/b", "a.b", "a b"] {
            assert!(!valid_etag(bad), "{bad:?}");
        }
    }
}
