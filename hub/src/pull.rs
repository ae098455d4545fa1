//! `pull`: one GGUF file of a repository into the cache. List the repository's files,
//! choose one (`choose.rs`), ask the resolve route for its commit, blob name, size and
//! location, and unless the blob is already there: take the blob's lock, check the disk
//! has room, fetch the missing bytes into `.incomplete` (resuming what an earlier run
//! left), check the SHA-256, publish the blob; then link the snapshot and write the ref.

use std::path::PathBuf;

use crate::api::{FileMeta, Hub};
use crate::choose::{Why, choose};
use crate::download::{Partial, Progress};
use crate::error::HubError;
use crate::layout::RepoDir;
use crate::repo::{RepoId, RepoPath, Revision, is_commit};
use crate::store;
use crate::transfer::{self, Accept, Start};

pub struct PullRequest {
    pub repo: RepoId,
    pub revision: Revision,
    /// `--file`: a path, a file name, a quantization tag or a part of a path.
    pub file: Option<String>,
    /// `HF_ENDPOINT`, e.g. `https://huggingface.co`.
    pub endpoint: String,
    pub token: Option<String>,
    pub cache_root: PathBuf,
}

#[derive(Debug)]
pub struct Pulled {
    pub file: RepoPath,
    /// `snapshots/<commit>/<file>`, a link to the blob.
    pub path: PathBuf,
    pub commit: String,
    pub size: u64,
    /// Bytes transferred by this run; `None`: the blob was in the cache already.
    pub fetched: Option<u64>,
    pub why: Why,
    /// Whether this run checked the bytes against a SHA-256 from the hub (it always does
    /// for the LFS files GGUFs are stored as).
    pub checked: bool,
}

pub fn pull(req: &PullRequest, progress: &dyn Progress) -> Result<Pulled, HubError> {
    let hub = Hub::new(&req.endpoint, req.token.clone())?;
    let listing = hub.list(&req.repo, &req.revision)?;
    let (chosen, why) = choose(&req.repo.to_string(), &listing.files, req.file.as_deref())?;
    let file = RepoPath::parse(&chosen.path)?;
    let meta = hub.file_meta(&req.repo, &req.revision, &file)?;
    let commit = meta.commit.clone().or(listing.commit).filter(|c| is_commit(c)).ok_or_else(|| HubError::Answer {
        url: meta.location.clone(),
        reason: "no commit id (X-Repo-Commit)".to_owned(),
    })?;
    if chosen.size.is_some_and(|s| s != meta.size) {
        tracing::warn!(file = %file, listed = chosen.size, resolved = meta.size, "the hub gives two sizes; using the resolved one");
    }
    let expected = expected_sha256(&meta, chosen.sha256.as_deref());
    let repo_dir = RepoDir::new(&req.cache_root, &req.repo);
    let blob = repo_dir.blob(&meta.etag);
    let span = tracing::info_span!("pull", repo = %req.repo, file = %file, commit = %commit);
    let _enter = span.enter();
    let fetched = if store::blob_present(&blob, meta.size) {
        tracing::info!(blob = %blob.display(), "already in the cache");
        None
    } else {
        let job = Job { hub: &hub, repo: &req.repo, dir: &repo_dir, meta: &meta, file: &file, expected: &expected };
        let result = job.fetch(progress);
        progress.finish();
        Some(result?)
    };
    let path = store::link_snapshot(&repo_dir, &commit, &file, &meta.etag)?;
    store::write_ref(&repo_dir, &req.revision, &commit)?;
    Ok(Pulled { file, path, commit, size: meta.size, fetched, why, checked: fetched.is_some() && expected.is_some() })
}

/// The SHA-256 the bytes must have. An LFS file's blob is named by its SHA-256 (the
/// etag), and every tool sharing the cache trusts that name, so it is what is checked;
/// the listing's `lfs.sha256` is the fallback.
fn expected_sha256(meta: &FileMeta, listed: Option<&str>) -> Option<String> {
    let is_sha = |s: &str| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
    let from_etag = (meta.lfs && is_sha(&meta.etag)).then(|| meta.etag.clone());
    if let (Some(e), Some(l)) = (&from_etag, listed)
        && !e.eq_ignore_ascii_case(l)
    {
        tracing::warn!(etag = %e, listed = %l, "the hub gives two SHA-256 for one file; checking the etag's");
    }
    from_etag.or_else(|| listed.filter(|l| is_sha(l)).map(str::to_ascii_lowercase))
}

struct Job<'a> {
    hub: &'a Hub,
    repo: &'a RepoId,
    dir: &'a RepoDir,
    meta: &'a FileMeta,
    file: &'a RepoPath,
    expected: &'a Option<String>,
}

impl Job<'_> {
    /// Fetches the blob's missing bytes; returns how many were transferred.
    fn fetch(&self, progress: &dyn Progress) -> Result<u64, HubError> {
        let (size, etag) = (self.meta.size, self.meta.etag.as_str());
        store::create_dir(&self.dir.blobs())?;
        let _lock = store::lock_blob(&self.dir.lock(etag))?;
        if store::blob_present(&self.dir.blob(etag), size) {
            return Ok(0); // another process finished it a moment ago
        }
        let partial_path = self.dir.partial(etag);
        let on_disk = std::fs::metadata(&partial_path).map_or(0, |m| m.len());
        let keep = match transfer::start(on_disk, size) {
            Start::Fetch { from } => from,
            Start::Verify => size,
            Start::Discard => 0,
        };
        self.check_space(size - keep)?;
        let mut partial = Partial::open(&partial_path, keep)?;
        tracing::info!(size, from = partial.len(), "downloading");
        progress.begin(self.file.file_name(), size, partial.len());
        let mut fetched = 0;
        let mut refetched = false;
        while partial.len() < size {
            let from = partial.len();
            let resp = self.hub.fetch(self.repo, &self.meta.location, from)?;
            let content_range = resp.headers().get("content-range").and_then(|v| v.to_str().ok());
            let accept = transfer::accept(resp.status().as_u16(), content_range, from, size)
                .map_err(|cause| HubError::Reply { url: self.meta.location.clone(), cause })?;
            match accept {
                Accept::Append => {}
                Accept::Restart => {
                    tracing::info!(from, "the server sent the whole file: starting over");
                    partial.restart()?;
                    self.check_space(size)?;
                    progress.begin(self.file.file_name(), size, 0);
                }
                Accept::Refetch if !refetched => {
                    tracing::info!(from, "the server cannot resume: starting over");
                    refetched = true;
                    partial.restart()?;
                    continue;
                }
                Accept::Refetch => {
                    let cause = transfer::ReplyError::Status { status: 416 };
                    return Err(HubError::Reply { url: self.meta.location.clone(), cause });
                }
            }
            let before = partial.len();
            let result = partial.append(&mut resp.into_body().into_reader(), size, progress);
            fetched += partial.len() - before;
            result?;
        }
        let got = partial.finish()?;
        match self.expected {
            Some(want) if *want != got => {
                let _ = std::fs::remove_file(&partial_path);
                return Err(HubError::Checksum { file: self.file.to_string(), expected: want.clone(), got });
            }
            Some(_) => tracing::info!(sha256 = %got, "checksum matches"),
            None => {
                tracing::warn!(file = %self.file, "the hub gives no SHA-256 for this file (not in LFS): not checked")
            }
        }
        store::publish_blob(&partial_path, &self.dir.blob(etag))?;
        tracing::info!(fetched, "downloaded");
        Ok(fetched)
    }

    fn check_space(&self, missing: u64) -> Result<(), HubError> {
        let blobs = self.dir.blobs();
        let free = store::free_space(&blobs)?;
        Ok(transfer::check_space(&blobs.display().to_string(), missing, free)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(etag: &str, lfs: bool) -> FileMeta {
        FileMeta { commit: None, etag: etag.into(), lfs, size: 1, location: String::new() }
    }

    #[test]
    fn the_blob_name_is_what_is_checked() {
        let sha = "a".repeat(64);
        let other = "b".repeat(64);
        assert_eq!(expected_sha256(&meta(&sha, true), None), Some(sha.clone()));
        assert_eq!(expected_sha256(&meta(&sha, true), Some(&other)), Some(sha.clone()));
        assert_eq!(expected_sha256(&meta("abc", false), Some(&other.to_uppercase())), Some(other.clone()));
        assert_eq!(expected_sha256(&meta(&sha, false), None), None, "a git etag is not a SHA-256");
        assert_eq!(expected_sha256(&meta("abc", false), Some("short")), None);
    }
}
