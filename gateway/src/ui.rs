//! The web UI: hand-written HTML, CSS and JavaScript under `gateway/ui/`, compiled into
//! the binary with `include_bytes!` (no build step, nothing fetched at run time) and
//! served from memory: `GET /` is the page, `GET /ui/{file}` its scripts and styles.
//!
//! Serving is a table lookup and a copy-free body, so a page load costs the same while
//! engines generate flat out. Every answer carries a strict Content-Security-Policy (only
//! this origin's scripts, styles and connections; no inline script), so even a bug in the
//! markdown renderer could not run a model's output as code. Files are revalidated on
//! each load (`no-cache` with an `ETag` of their bytes), so a new binary's UI is never
//! mixed with an old one's cached files.

use std::sync::OnceLock;

use corral_protocol::{ApiError, ApiShape, ErrorKind};
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};

use crate::body::Body;
use crate::respond;
use crate::route::ASSET_PREFIX;

pub struct Asset {
    /// The name under `/ui/` (`index.html` is served at `/`).
    pub name: &'static str,
    pub mime: &'static str,
    pub body: &'static [u8],
}

const HTML: &str = "text/html; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const SVG: &str = "image/svg+xml";

macro_rules! asset {
    ($name:literal, $mime:expr) => {
        Asset { name: $name, mime: $mime, body: include_bytes!(concat!("../ui/", $name)) }
    };
}

/// Every file of the UI. A test checks this list against the directory and against what
/// the page and the scripts refer to.
pub const ASSETS: &[Asset] = &[
    asset!("index.html", HTML),
    asset!("icon.svg", SVG),
    asset!("base.css", CSS),
    asset!("chat.css", CSS),
    asset!("markdown.css", CSS),
    asset!("engines.css", CSS),
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("dom.js", JS),
    asset!("format.js", JS),
    asset!("markdown.js", JS),
    asset!("store.js", JS),
    asset!("models.js", JS),
    asset!("settings.js", JS),
    asset!("chat.js", JS),
    asset!("chat_send.js", JS),
    asset!("chat_render.js", JS),
    asset!("engines.js", JS),
    asset!("engine_card.js", JS),
    asset!("chart.js", JS),
];

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

/// FNV-1a of each file, computed once: the `ETag`s.
fn etags() -> &'static [String] {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    TAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| {
                let h = a
                    .body
                    .iter()
                    .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3));
                format!("\"{h:016x}\"")
            })
            .collect()
    })
}

fn serve(index: usize, headers: &HeaderMap) -> Response<Body> {
    let (a, tag) = (&ASSETS[index], &etags()[index]);
    let fresh = headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()).is_some_and(|v| v == tag);
    let mut r = if fresh {
        let mut r = Response::new(Body::Full(None));
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        r
    } else {
        Response::new(Body::from(bytes::Bytes::from_static(a.body)))
    };
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(a.mime));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(tag) {
        h.insert(header::ETAG, v);
    }
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    r
}

fn find(name: &str) -> Option<usize> {
    ASSETS.iter().position(|a| a.name == name)
}

/// `GET /`.
pub fn page(headers: &HeaderMap) -> Response<Body> {
    serve(find("index.html").expect("index.html is in the asset table"), headers)
}

/// `GET /ui/{file}`.
pub fn asset(path: &str, headers: &HeaderMap) -> Response<Body> {
    let name = path.strip_prefix(ASSET_PREFIX).unwrap_or(path);
    match find(name) {
        Some(i) => serve(i, headers),
        None => respond::error(ApiShape::OpenAi, &ApiError::new(ErrorKind::NotFound, format!("no UI file {name}"))),
    }
}

#[cfg(test)]
#[path = "ui_tests.rs"]
mod tests;
