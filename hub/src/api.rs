//! The hub's HTTP API, as much of it as a download needs:
//!
//! - `GET /api/models/<repo>/revision/<rev>?blobs=true`: the repository's files, with
//!   each LFS file's size and SHA-256, and the commit the revision points at;
//! - `HEAD /<repo>/resolve/<rev>/<path>`: the file's commit (`X-Repo-Commit`), blob name
//!   (`X-Linked-Etag`, else `ETag`; an LFS file's is its SHA-256), size
//!   (`X-Linked-Size`, else `Content-Length`) and where its bytes are (`Location`);
//! - `GET <location>` with `Range`: the bytes.
//!
//! Redirects: a relative `Location` (the hub moving a renamed repository) is followed
//! with the token; an absolute one is where the bytes are (a CDN). The token goes only to
//! the endpoint's own origin; ureq drops it on any redirect it follows.

use std::time::Duration;

use serde::Deserialize;

use crate::choose::RepoFile;
use crate::error::HubError;
use crate::repo::{RepoId, RepoPath, Revision, url_encode};

pub struct Hub {
    agent: ureq::Agent,
    /// `HF_ENDPOINT` without a trailing `/`.
    base: String,
    origin: String,
    token: Option<String>,
}

/// The repository's files at a revision.
#[derive(Debug)]
pub struct Listing {
    pub commit: Option<String>,
    pub files: Vec<RepoFile>,
}

/// What the resolve route says about one file.
#[derive(Debug)]
pub struct FileMeta {
    pub commit: Option<String>,
    pub etag: String,
    /// `X-Linked-Etag` was present: an LFS file, whose etag is the SHA-256 of its bytes.
    pub lfs: bool,
    pub size: u64,
    /// Absolute URL of the bytes.
    pub location: String,
}

#[derive(Deserialize)]
struct Info {
    sha: Option<String>,
    #[serde(default)]
    siblings: Vec<Sibling>,
}

#[derive(Deserialize)]
struct Sibling {
    rfilename: String,
    size: Option<u64>,
    lfs: Option<Lfs>,
}

#[derive(Deserialize)]
struct Lfs {
    sha256: String,
    size: Option<u64>,
}

/// Answers larger than this (the file listing, error bodies) are not read.
const MAX_JSON: u64 = 16 << 20;

impl Hub {
    pub fn new(endpoint: &str, token: Option<String>) -> Result<Self, HubError> {
        let base = endpoint.trim_end_matches('/').to_owned();
        let origin = origin(&base).ok_or_else(|| HubError::Endpoint {
            endpoint: endpoint.to_owned(),
            reason: "expected http(s)://host[:port][/path]".to_owned(),
        })?;
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .user_agent(concat!("corral/", env!("CARGO_PKG_VERSION")))
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            // A download that receives nothing for this long has stalled.
            .timeout_per_read(Some(Duration::from_secs(60)))
            .build()
            .new_agent();
        Ok(Self { agent, base, origin, token })
    }

    /// The repository's page, where a gated model's terms are accepted.
    pub fn page(&self, repo: &RepoId) -> String {
        format!("{}/{repo}", self.base)
    }

    pub fn list(&self, repo: &RepoId, rev: &Revision) -> Result<Listing, HubError> {
        let url = format!("{}/api/models/{repo}/revision/{}?blobs=true", self.base, url_encode(rev.as_str(), false));
        let req = self.authorize(self.agent.get(&url), &url);
        let mut resp = req.call().map_err(|e| transport(&url, e))?;
        self.check(&resp, &url, repo)?;
        let body = resp.body_mut().with_config().limit(MAX_JSON).read_to_vec().map_err(|e| transport(&url, e))?;
        let info: Info = serde_json::from_slice(&body)
            .map_err(|e| HubError::Answer { url: url.clone(), reason: format!("not a model-info answer: {e}") })?;
        let files = info
            .siblings
            .into_iter()
            .map(|s| RepoFile {
                size: s.lfs.as_ref().and_then(|l| l.size).or(s.size),
                sha256: s.lfs.map(|l| l.sha256.to_ascii_lowercase()),
                path: s.rfilename,
            })
            .collect();
        Ok(Listing { commit: info.sha, files })
    }

    pub fn file_meta(&self, repo: &RepoId, rev: &Revision, path: &RepoPath) -> Result<FileMeta, HubError> {
        let mut url = format!(
            "{}/{repo}/resolve/{}/{}",
            self.base,
            url_encode(rev.as_str(), false),
            url_encode(path.as_str(), true)
        );
        // Relative redirects stay on the hub (a renamed repository): follow a few.
        for _ in 0..5 {
            let req = self.authorize(self.agent.head(&url), &url).header("Accept-Encoding", "identity");
            let resp = req.config().max_redirects(0).build().call().map_err(|e| transport(&url, e))?;
            let status = resp.status().as_u16();
            let location = header(&resp, "location");
            if (300..400).contains(&status) {
                let Some(loc) = location else {
                    return Err(HubError::Answer { url, reason: format!("{status} without a Location") });
                };
                if !is_absolute(&loc) {
                    url = join(&url, &loc);
                    continue;
                }
                return meta_of(&resp, url, loc);
            }
            self.check(&resp, &url, repo)?;
            let here = url.clone();
            return meta_of(&resp, url, here);
        }
        Err(HubError::Answer { url, reason: "too many redirects".to_owned() })
    }

    /// Starts the transfer of `location`'s bytes from `from` on. The status is the
    /// caller's to judge (`transfer::accept`), except for refusals and absences.
    pub fn fetch(
        &self,
        repo: &RepoId,
        location: &str,
        from: u64,
    ) -> Result<ureq::http::Response<ureq::Body>, HubError> {
        let mut req = self.authorize(self.agent.get(location), location).header("Accept-Encoding", "identity");
        if let Some(range) = crate::transfer::range_header(from) {
            req = req.header("Range", range);
        }
        let resp = req.call().map_err(|e| transport(location, e))?;
        if matches!(resp.status().as_u16(), 401 | 403 | 404) {
            self.check(&resp, location, repo)?;
        }
        Ok(resp)
    }

    fn authorize<B>(&self, req: ureq::RequestBuilder<B>, url: &str) -> ureq::RequestBuilder<B> {
        match &self.token {
            Some(t) if origin(url).as_deref() == Some(self.origin.as_str()) => {
                req.header("Authorization", format!("Bearer {t}"))
            }
            _ => req,
        }
    }

    fn check<B>(&self, resp: &ureq::http::Response<B>, url: &str, repo: &RepoId) -> Result<(), HubError> {
        let status = resp.status().as_u16();
        let message = header(resp, "x-error-message");
        match status {
            200..=299 => Ok(()),
            401 | 403 => Err(HubError::Auth {
                status,
                url: url.to_owned(),
                repo: repo.to_string(),
                page: self.page(repo),
                token_sent: self.token.is_some(),
                message,
            }),
            404 => Err(HubError::NotFound { url: url.to_owned(), message }),
            _ => Err(HubError::Status { status, url: url.to_owned(), message }),
        }
    }
}

fn transport(url: &str, e: ureq::Error) -> HubError {
    HubError::Transport { url: url.to_owned(), cause: Box::new(e) }
}

fn header<B>(resp: &ureq::http::Response<B>, name: &str) -> Option<String> {
    resp.headers().get(name).and_then(|v| v.to_str().ok()).map(|v| v.trim().to_owned())
}

fn meta_of<B>(resp: &ureq::http::Response<B>, url: String, location: String) -> Result<FileMeta, HubError> {
    let linked = header(resp, "x-linked-etag");
    let lfs = linked.is_some();
    let etag = linked.or_else(|| header(resp, "etag")).map(|e| normalize_etag(&e));
    let size = header(resp, "x-linked-size").or_else(|| header(resp, "content-length"));
    let bad = |reason: &str| HubError::Answer { url: url.clone(), reason: reason.to_owned() };
    let etag = etag.filter(|e| crate::layout::valid_etag(e)).ok_or_else(|| bad("no usable ETag"))?;
    let size = size.and_then(|s| s.parse().ok()).ok_or_else(|| bad("no file size"))?;
    let commit = header(resp, "x-repo-commit").filter(|c| crate::repo::is_commit(c));
    Ok(FileMeta { commit, etag, lfs, size, location })
}

/// `W/"abc"` → `abc`.
pub fn normalize_etag(e: &str) -> String {
    e.trim().trim_start_matches("W/").trim_matches('"').to_ascii_lowercase()
}

/// `scheme://authority` of an absolute http(s) URL, lowercased.
pub fn origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" && scheme != "https" {
        return None;
    }
    let authority = rest.split(['/', '?', '#']).next()?;
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    Some(format!("{scheme}://{}", authority.to_ascii_lowercase()))
}

fn is_absolute(location: &str) -> bool {
    location.contains("://")
}

/// A relative `Location` against the URL that sent it.
pub fn join(url: &str, location: &str) -> String {
    if location.starts_with("//") {
        let scheme = url.split("://").next().unwrap_or("https");
        return format!("{scheme}:{location}");
    }
    if location.starts_with('/') {
        return match origin(url) {
            Some(o) => format!("{o}{location}"),
            None => location.to_owned(),
        };
    }
    let path_end = url.find(['?', '#']).unwrap_or(url.len());
    let dir_end = url[..path_end].rfind('/').map_or(path_end, |i| i + 1);
    format!("{}{location}", &url[..dir_end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_decide_where_the_token_goes() {
        assert_eq!(origin("https://huggingface.co/api/x").as_deref(), Some("https://huggingface.co"));
        assert_eq!(origin("HTTP://127.0.0.1:8000").as_deref(), Some("http://127.0.0.1:8000"));
        assert_ne!(origin("https://cdn-lfs.hf.co/x"), origin("https://huggingface.co/x"));
        assert_ne!(origin("http://localhost:1/x"), origin("http://127.0.0.1:1/x"));
        assert_ne!(origin("https://huggingface.co.evil.com/x"), origin("https://huggingface.co/x"));
        assert_eq!(origin("ftp://x/y"), None);
        assert_eq!(origin("https://user@huggingface.co/"), None);
        assert_eq!(origin("huggingface.co"), None);
    }

    #[test]
    fn relative_redirects_resolve_against_the_hub() {
        let u = "https://hf.co/org/a/resolve/main/m.gguf";
        assert_eq!(join(u, "/org/b/resolve/main/m.gguf"), "https://hf.co/org/b/resolve/main/m.gguf");
        assert_eq!(join(u, "n.gguf"), "https://hf.co/org/a/resolve/main/n.gguf");
        assert_eq!(join(u, "//cdn.example/x"), "https://cdn.example/x");
        assert!(is_absolute("https://cdn-lfs.hf.co/x") && !is_absolute("/api/x"));
    }

    #[test]
    fn etags_lose_quotes_and_weakness() {
        assert_eq!(normalize_etag("\"ABC123\""), "abc123");
        assert_eq!(normalize_etag("W/\"abc-1\""), "abc-1");
    }
}
