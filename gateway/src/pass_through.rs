//! A response on its way back to the client, from an engine (`proxy.rs`) or an upstream
//! server (`upstream::forward`): hop-by-hop headers stripped, the body passed through
//! frame by frame holding the request's claim and in-flight guard (`body::ProxyBody`),
//! a successful Responses answer captured on its way out. Both forwarders use it; it
//! uses neither.

use std::sync::Arc;

use corral_net::gauge::Guard;
use corral_protocol::ApiShape;
use http::{HeaderMap, HeaderName, Response, header};
use hyper::body::Incoming;

use crate::app::App;
use crate::body::{Body, Claim, Ending, OnFailure, ProxyBody, Tap};
use crate::stored_routes::Capture;

/// Headers that describe one hop, not the message.
const HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::HOST,
];

pub(crate) fn strip_hop(h: &mut HeaderMap) {
    for name in HOP.iter() {
        h.remove(name);
    }
}

/// A response on its way back: what its body holds until it ends, and how it ends.
pub(crate) struct Forwarded {
    /// The pool lease or the upstream replica's claim.
    pub claim: Claim,
    pub guard: Guard,
    pub sse_wanted: bool,
    pub shape: ApiShape,
    /// Stored Responses capture their answer on its way out.
    pub capture: Option<Capture>,
    /// Told about a failure after the head.
    pub on_failure: OnFailure,
    /// Who a terminal error names.
    pub who: &'static str,
}

pub(crate) fn pass_through(app: &Arc<App>, resp: Response<Incoming>, f: Forwarded) -> Response<Body> {
    let (mut parts, upstream) = resp.into_parts();
    strip_hop(&mut parts.headers);
    let sse_answer = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let sse = f.sse_wanted || sse_answer;
    // Only a successful answer is stored.
    let tap = f.capture.filter(|_| parts.status.is_success()).map(|mut c| {
        let len = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
        c.expect_len(if sse_answer { None } else { Some(len.unwrap_or(usize::MAX)) });
        Box::new(c) as Box<dyn Tap>
    });
    let ending = Ending { sse, shape: f.shape, stall: app.cfg.stall_timeout, on_failure: f.on_failure, who: f.who };
    let body = ProxyBody::new(upstream, f.claim, f.guard, ending, tap);
    Response::from_parts(parts, Body::Proxy(Box::new(body)))
}
