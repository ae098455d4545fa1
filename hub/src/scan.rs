//! Reading the cache: the GGUF files its snapshots hold, whoever downloaded them
//! (`corral pull`, `hf download`, `huggingface_hub`, llama.cpp's `-hf`). One entry per
//! file of a repository: the snapshot `refs/main` points at when it has the file, else
//! the newest snapshot that has it. Links whose blob is missing (a download another tool
//! left unfinished), split GGUFs and vision projectors are left out: no engine loads them.

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use crate::choose::{is_gguf, is_projector, is_split};
use crate::layout::repo_of_folder;
use crate::repo::{RepoId, RepoPath};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedFile {
    pub repo: RepoId,
    /// The file's path inside the repository.
    pub file: RepoPath,
    /// `snapshots/<commit>/<file>`: a link to the blob, ending in the file's own name.
    pub path: PathBuf,
    pub commit: String,
    /// When the snapshot link was made (unix seconds).
    pub added: u64,
}

/// Folders below a snapshot's root that are searched for files.
const MAX_DEPTH: usize = 8;

/// Every usable GGUF in the cache at `root`, oldest first (then by repository and path).
/// A missing cache is empty; unreadable parts are skipped with a debug line.
pub fn scan(root: &Path) -> Vec<CachedFile> {
    let Ok(rd) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for ent in rd.flatten() {
        let Some(repo) = ent.file_name().to_str().and_then(repo_of_folder) else {
            continue;
        };
        scan_repo(&ent.path(), &repo, &mut out);
    }
    out.sort_by(|a, b| (a.added, &a.repo, &a.file).cmp(&(b.added, &b.repo, &b.file)));
    out
}

fn scan_repo(dir: &Path, repo: &RepoId, out: &mut Vec<CachedFile>) {
    let main = std::fs::read_to_string(dir.join("refs").join("main")).ok().map(|c| c.trim().to_owned());
    let Ok(rd) = std::fs::read_dir(dir.join("snapshots")) else {
        return;
    };
    // (file, entry, snapshot rank): the refs/main snapshot first, then the newest.
    let mut found: Vec<(CachedFile, (bool, u64))> = Vec::new();
    for snap in rd.flatten() {
        let Some(commit) = snap.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let rank = (main.as_deref() == Some(commit.as_str()), mtime(&snap.path(), true));
        let mut files = Vec::new();
        walk(&snap.path(), "", 0, &mut files);
        for (rel, path) in files {
            let Ok(file) = RepoPath::parse(&rel) else {
                continue;
            };
            if !std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
                tracing::debug!(path = %path.display(), "skipping a snapshot file without its blob");
                continue;
            }
            let entry =
                CachedFile { repo: repo.clone(), file, added: mtime(&path, false), path, commit: commit.clone() };
            match found.iter_mut().find(|(f, _)| f.file == entry.file) {
                Some(slot) if slot.1 < rank => *slot = (entry, rank),
                Some(_) => {}
                None => found.push((entry, rank)),
            }
        }
    }
    out.extend(found.into_iter().map(|(f, _)| f));
}

/// GGUF files under `dir` as (path relative to the snapshot, full path).
fn walk(dir: &Path, prefix: &str, depth: usize, out: &mut Vec<(String, PathBuf)>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for ent in rd.flatten() {
        let Some(name) = ent.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let rel = if prefix.is_empty() { name.clone() } else { format!("{prefix}/{name}") };
        let path = ent.path();
        // A real folder (not a link) holds more of the snapshot; links are files.
        if ent.file_type().is_ok_and(|t| t.is_dir()) {
            if depth < MAX_DEPTH {
                walk(&path, &rel, depth + 1, out);
            }
        } else if is_gguf(&name) && !is_split(&name) && !is_projector(&name) {
            out.push((rel, path));
        }
    }
}

/// Modification time in unix seconds: of the link itself, or of what it points at.
fn mtime(path: &Path, follow: bool) -> u64 {
    let meta = if follow { std::fs::metadata(path) } else { std::fs::symlink_metadata(path) };
    meta.and_then(|m| m.modified()).ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{RepoDir, link_target};

    const C1: &str = "1111111111111111111111111111111111111111";
    const C2: &str = "2222222222222222222222222222222222222222";

    fn put(repo: &RepoDir, commit: &str, file: &str, etag: Option<&str>) {
        let f = RepoPath::parse(file).unwrap();
        let link = repo.snapshot(commit, &f);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        let etag = etag.unwrap_or("missing");
        std::os::unix::fs::symlink(link_target(&f, etag), &link).unwrap();
    }

    #[test]
    fn finds_loadable_ggufs_once_per_repository_file() {
        let root = std::env::temp_dir().join(format!("corral-hub-scan-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let a = RepoDir::new(&root, &RepoId::parse("org/a-GGUF").unwrap());
        std::fs::create_dir_all(a.blobs()).unwrap();
        std::fs::write(a.blob("e1"), b"one").unwrap();
        std::fs::write(a.blob("e2"), b"two").unwrap();
        put(&a, C1, "m-Q4_K_M.gguf", Some("e1"));
        put(&a, C2, "m-Q4_K_M.gguf", Some("e2"));
        put(&a, C2, "sub/n-Q8_0.gguf", Some("e2"));
        put(&a, C2, "gone.gguf", None);
        put(&a, C2, "mmproj-f16.gguf", Some("e1"));
        put(&a, C2, "s-00001-of-00002.gguf", Some("e1"));
        put(&a, C2, "README.md", Some("e1"));
        std::fs::create_dir_all(a.dir().join("refs")).unwrap();
        std::fs::write(a.dir().join("refs/main"), C1).unwrap();
        std::fs::create_dir_all(root.join("datasets--org--d/snapshots")).unwrap();
        std::fs::create_dir_all(root.join(".locks")).unwrap();

        let found = scan(&root);
        let mut got: Vec<(String, String, String)> =
            found.iter().map(|f| (f.repo.to_string(), f.file.to_string(), f.commit.clone())).collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                ("org/a-GGUF".into(), "m-Q4_K_M.gguf".into(), C1.into()),
                ("org/a-GGUF".into(), "sub/n-Q8_0.gguf".into(), C2.into()),
            ]
        );
        let m = found.iter().find(|f| f.file.as_str() == "m-Q4_K_M.gguf").unwrap();
        assert_eq!(std::fs::read(&m.path).unwrap(), b"one", "refs/main's snapshot wins");
        assert!(m.added > 0);
        assert!(scan(&root.join("nothing")).is_empty());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
