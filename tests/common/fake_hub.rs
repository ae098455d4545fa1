//! A stand-in for the Hugging Face Hub on 127.0.0.1:0, for `corral pull` tests. It
//! answers the three routes a download uses, as the hub does:
//!
//! - `GET /api/models/<org>/<name>/revision/<rev>?blobs=true`: the files, with LFS sizes
//!   and SHA-256;
//! - `HEAD /<org>/<name>/resolve/<rev>/<path>`: 302 to the blob on the "CDN" —
//!   `http://localhost:<port>/blobs/<sha>`, another origin than the hub's
//!   `127.0.0.1:<port>`, so a token must not follow — with `X-Linked-Etag`,
//!   `X-Linked-Size`, `X-Repo-Commit`;
//! - `GET /blobs/<sha>`: the bytes, honouring `Range`.
//!
//! Faults on demand: a token required on the hub's routes (401 otherwise), a blob cut
//! after N bytes on its first transfer, corrupted bytes, an announced size that is not
//! the real one. Every request is recorded.

#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, channel::Channel};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use sha2::{Digest, Sha256};

pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

type Body = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

#[derive(Clone)]
pub struct HubFile {
    pub path: String,
    pub bytes: Arc<Vec<u8>>,
    pub sha256: String,
    /// What `X-Linked-Size` and the listing say (the real length unless a test lies).
    pub size: u64,
}

impl HubFile {
    pub fn new(path: &str, bytes: Vec<u8>) -> Self {
        let sha256 = sha256_hex(&bytes);
        Self { path: path.to_owned(), size: bytes.len() as u64, bytes: Arc::new(bytes), sha256 }
    }
}

#[derive(Clone, Default)]
pub struct Faults {
    /// The hub's routes answer 401 unless `Authorization: Bearer <this>` is sent.
    pub require_token: Option<String>,
    /// The first transfer of a blob stops (connection reset) after this many bytes.
    pub cut_first_at: Option<usize>,
    /// Blobs are served with one byte flipped.
    pub corrupt: bool,
}

#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub host: String,
    pub path: String,
    pub range: Option<String>,
    pub auth: Option<String>,
}

struct State {
    repo: String,
    files: Vec<HubFile>,
    faults: Faults,
    port: u16,
    seen: Vec<Seen>,
    blob_transfers: usize,
}

pub struct FakeHub {
    pub endpoint: String,
    state: Arc<Mutex<State>>,
    _server: super::loopback::Loopback,
}

pub fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect()
}

impl FakeHub {
    /// Serves `repo` (`org/name`) with `files` at revision `main` = `COMMIT`.
    pub fn start(repo: &str, files: Vec<HubFile>, faults: Faults) -> Self {
        let state = Arc::new(Mutex::new(State {
            repo: repo.to_owned(),
            files,
            faults,
            port: 0,
            seen: Vec::new(),
            blob_transfers: 0,
        }));
        let st = state.clone();
        let server = super::loopback::Loopback::start(move |stream| {
            let st = st.clone();
            async move {
                let svc = hyper::service::service_fn(move |req| answer(st.clone(), req));
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await;
            }
        });
        state.lock().unwrap().port = server.port;
        let addr = SocketAddr::from(([127, 0, 0, 1], server.port));
        Self { endpoint: format!("http://{addr}"), state, _server: server }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    /// Requests for blob bytes.
    pub fn blob_gets(&self) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.method == "GET" && s.path.starts_with("/blobs/")).collect()
    }

    pub fn set_faults(&self, faults: Faults) {
        self.state.lock().unwrap().faults = faults;
    }
}

fn full(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()).map_err(|e: Infallible| match e {}).boxed());
    *r.status_mut() = status;
    r
}

async fn answer(state: Arc<Mutex<State>>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let h = |n: &str| req.headers().get(n).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let seen = Seen {
        method: req.method().to_string(),
        host: h("host").unwrap_or_default(),
        path: req.uri().path().to_owned(),
        range: h("range"),
        auth: h("authorization"),
    };
    let mut st = state.lock().unwrap();
    st.seen.push(seen.clone());
    let path = seen.path.clone();
    let api = format!("/api/models/{}/revision/main", st.repo);
    let resolve = format!("/{}/resolve/main/", st.repo);
    let on_hub = path == api || path.starts_with(&resolve);
    if on_hub
        && let Some(t) = &st.faults.require_token
        && seen.auth.as_deref() != Some(format!("Bearer {t}").as_str())
    {
        let mut r = full(StatusCode::UNAUTHORIZED, "");
        r.headers_mut().insert("x-error-message", "Invalid credentials in Authorization header".parse().unwrap());
        return Ok(r);
    }
    if path == api {
        let siblings: Vec<serde_json::Value> = std::iter::once(serde_json::json!({"rfilename": "README.md", "size": 12}))
            .chain(st.files.iter().map(|f| {
                serde_json::json!({"rfilename": f.path, "size": f.size, "lfs": {"sha256": f.sha256, "size": f.size, "pointerSize": 134}})
            }))
            .collect();
        let body = serde_json::json!({"id": st.repo, "sha": COMMIT, "siblings": siblings});
        return Ok(full(StatusCode::OK, body.to_string()));
    }
    if let Some(file) = path.strip_prefix(&resolve) {
        let Some(f) = st.files.iter().find(|f| f.path == file) else {
            let mut r = full(StatusCode::NOT_FOUND, "");
            r.headers_mut().insert("x-error-code", "EntryNotFound".parse().unwrap());
            return Ok(r);
        };
        let mut r = full(StatusCode::FOUND, "");
        let hs = r.headers_mut();
        hs.insert("location", format!("http://localhost:{}/blobs/{}", st.port, f.sha256).parse().unwrap());
        hs.insert("x-linked-etag", format!("\"{}\"", f.sha256).parse().unwrap());
        hs.insert("x-linked-size", f.size.to_string().parse().unwrap());
        hs.insert("x-repo-commit", COMMIT.parse().unwrap());
        hs.insert("etag", "\"0000000000000000000000000000000000000000\"".parse().unwrap());
        return Ok(r);
    }
    if let Some(sha) = path.strip_prefix("/blobs/")
        && req.method() == hyper::Method::GET
        && let Some(f) = st.files.iter().find(|f| f.sha256 == sha).cloned()
    {
        st.blob_transfers += 1;
        let cut = st.faults.cut_first_at.filter(|_| st.blob_transfers == 1);
        let mut bytes = f.bytes.as_ref().clone();
        if st.faults.corrupt {
            let mid = bytes.len() / 2;
            bytes[mid] ^= 0xff;
        }
        drop(st);
        let from =
            seen.range.as_deref().and_then(|r| r.strip_prefix("bytes=")?.strip_suffix('-')?.parse::<usize>().ok());
        let total = bytes.len();
        let (status, start) = match from {
            Some(s) if s < total => (StatusCode::PARTIAL_CONTENT, s),
            Some(_) => return Ok(full(StatusCode::RANGE_NOT_SATISFIABLE, "")),
            None => (StatusCode::OK, 0),
        };
        let rest = Bytes::from(bytes).slice(start..);
        let (mut tx, body) = Channel::<Bytes, std::io::Error>::new(4);
        let len = rest.len();
        tokio::spawn(async move {
            match cut {
                Some(n) => {
                    let _ = tx.send_data(rest.slice(..n.min(len))).await;
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    tx.abort(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "cut by the test"));
                }
                None => {
                    for chunk in rest.chunks(256 << 10) {
                        if tx.send_data(rest.slice_ref(chunk)).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let mut r = Response::new(body.boxed());
        *r.status_mut() = status;
        r.headers_mut().insert("content-length", len.to_string().parse().unwrap());
        if status == StatusCode::PARTIAL_CONTENT {
            r.headers_mut().insert("content-range", format!("bytes {start}-{}/{total}", total - 1).parse().unwrap());
        }
        return Ok(r);
    }
    Ok(full(StatusCode::NOT_FOUND, "no such route"))
}
