//! Writing into the cache. Nothing ever appears under a final name half-written: bytes
//! go to `blobs/<etag>.incomplete`, are fsynced, renamed to `blobs/<etag>` and the folder
//! fsynced; a snapshot link and a ref are created under a temporary name and renamed
//! over the final one. One writer per blob, by `flock` on the lock file
//! `huggingface_hub` uses for the same blob, so the two never write it at once.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::error::HubError;
use crate::layout::{RepoDir, link_target};
use crate::repo::{RepoPath, Revision};

/// Held while a blob is being written; released on drop.
pub struct BlobLock {
    _lock: Flock<File>,
}

pub fn lock_blob(path: &Path) -> Result<BlobLock, HubError> {
    create_dir(path.parent().unwrap_or(Path::new(".")))?;
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(HubError::io("opening lock file", path))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(BlobLock { _lock: lock }),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(HubError::Busy { lock: path.to_owned() }),
        Err((_, e)) => Err(HubError::Io { op: "locking", path: path.to_owned(), cause: e.into() }),
    }
}

pub fn create_dir(dir: &Path) -> Result<(), HubError> {
    std::fs::create_dir_all(dir).map_err(HubError::io("creating", dir))
}

/// Bytes available to this user on the filesystem that holds `dir` (or, when it does not
/// exist yet, its nearest existing ancestor).
pub fn free_space(dir: &Path) -> Result<u64, HubError> {
    let mut probe = dir;
    while !probe.exists() {
        match probe.parent() {
            Some(p) if !p.as_os_str().is_empty() => probe = p,
            _ => {
                probe = Path::new(".");
                break;
            }
        }
    }
    let st = nix::sys::statvfs::statvfs(probe).map_err(|e| HubError::Io {
        op: "statvfs",
        path: probe.to_owned(),
        cause: e.into(),
    })?;
    Ok((st.blocks_available() as u64).saturating_mul(st.fragment_size() as u64))
}

/// The blob is there, with the size the hub announced.
pub fn blob_present(blob: &Path, size: u64) -> bool {
    std::fs::metadata(blob).is_ok_and(|m| m.is_file() && m.len() == size)
}

/// `.incomplete` → final name, durably.
pub fn publish_blob(partial: &Path, blob: &Path) -> Result<(), HubError> {
    File::open(partial).and_then(|f| f.sync_all()).map_err(HubError::io("syncing", partial))?;
    std::fs::rename(partial, blob).map_err(HubError::io("renaming", partial))?;
    sync_dir(blob.parent().unwrap_or(Path::new(".")))
}

/// `snapshots/<commit>/<path>` → `../../blobs/<etag>`, replacing whatever link was there.
pub fn link_snapshot(repo: &RepoDir, commit: &str, file: &RepoPath, etag: &str) -> Result<PathBuf, HubError> {
    let link = repo.snapshot(commit, file);
    let dir = link.parent().unwrap_or(Path::new(".")).to_owned();
    create_dir(&dir)?;
    let target = link_target(file, etag);
    if std::fs::read_link(&link).is_ok_and(|t| t == target) {
        return Ok(link);
    }
    let tmp = dir.join(format!(".{}.{}.tmp", file.file_name(), std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&target, &tmp).map_err(HubError::io("creating link", &tmp))?;
    std::fs::rename(&tmp, &link).map_err(HubError::io("renaming", &tmp))?;
    sync_dir(&dir)?;
    Ok(link)
}

/// `refs/<revision>` holds the commit it resolved to (no newline, as `huggingface_hub`
/// writes it). A commit revision needs no ref.
pub fn write_ref(repo: &RepoDir, revision: &Revision, commit: &str) -> Result<(), HubError> {
    if revision.is_commit() {
        return Ok(());
    }
    let path = repo.ref_file(revision);
    if std::fs::read_to_string(&path).is_ok_and(|c| c.trim() == commit) {
        return Ok(());
    }
    let dir = path.parent().unwrap_or(Path::new(".")).to_owned();
    create_dir(&dir)?;
    let tmp = dir.join(format!(".ref.{}.tmp", std::process::id()));
    let mut f = File::create(&tmp).map_err(HubError::io("creating", &tmp))?;
    f.write_all(commit.as_bytes()).and_then(|_| f.sync_all()).map_err(HubError::io("writing", &tmp))?;
    std::fs::rename(&tmp, &path).map_err(HubError::io("renaming", &tmp))?;
    sync_dir(&dir)
}

fn sync_dir(dir: &Path) -> Result<(), HubError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(HubError::io("syncing", dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repo::RepoId;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("corral-hub-store-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn publishes_links_and_refs_that_resolve() {
        let root = tmp("publish");
        let repo = RepoDir::new(&root, &RepoId::parse("o/r").unwrap());
        create_dir(&repo.blobs()).unwrap();
        std::fs::write(repo.partial("e1"), b"bytes").unwrap();
        publish_blob(&repo.partial("e1"), &repo.blob("e1")).unwrap();
        assert!(
            !repo.partial("e1").exists() && blob_present(&repo.blob("e1"), 5) && !blob_present(&repo.blob("e1"), 6)
        );
        let c = "0123456789abcdef0123456789abcdef01234567";
        let file = RepoPath::parse("q/m.gguf").unwrap();
        let link = link_snapshot(&repo, c, &file, "e1").unwrap();
        assert_eq!(std::fs::read(&link).unwrap(), b"bytes");
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        // Again, and over a link to another blob: replaced in place.
        link_snapshot(&repo, c, &file, "e1").unwrap();
        std::fs::write(repo.blob("e2"), b"other").unwrap();
        link_snapshot(&repo, c, &file, "e2").unwrap();
        assert_eq!(std::fs::read(&link).unwrap(), b"other");
        write_ref(&repo, &Revision::default(), c).unwrap();
        assert_eq!(std::fs::read_to_string(root.join("models--o--r/refs/main")).unwrap(), c);
        write_ref(&repo, &Revision::parse(c).unwrap(), c).unwrap();
        assert!(!root.join(format!("models--o--r/refs/{c}")).exists());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn one_writer_per_blob() {
        let root = tmp("lock");
        let path = root.join(".locks/x/e.lock");
        let held = lock_blob(&path).unwrap();
        assert!(matches!(lock_blob(&path), Err(HubError::Busy { .. })));
        drop(held);
        assert!(lock_blob(&path).is_ok());
        assert!(free_space(&root.join("not/yet/there")).unwrap() > 0);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
