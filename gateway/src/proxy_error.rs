//! What can go wrong while proxying, as data (the pingora model): each kind says on which
//! side it happened, whether the request may be retried, whether the engine is to blame
//! (and is recycled: killed, respawned on demand), and what the client sees. The proxy
//! and the pass-through body follow this table mechanically.
//!
//! | kind | side | retried | engine recycled | client sees |
//! |---|---|---|---|---|
//! | `Connect` | upstream | once (nothing reached the engine) | no (a dead engine is seen by the pool) | 502 `engine_unavailable` |
//! | `Build` | internal | no | **no** (the engine never saw it) | 500 `internal_error` |
//! | `Send` | upstream | no (it may have reached the engine) | no | 502 `engine_unavailable` |
//! | `BadHead` | upstream | no | yes (it answered garbage) | 502 `engine_unavailable` |
//! | `HeadTimeout` | upstream | no | yes (it is hung) | 504 `engine_timeout` |
//! | `Body` | upstream | no | no | terminal SSE error event / cut body |
//! | `Stall` | upstream | no | yes (it is hung) | terminal SSE error event / cut body |
//! | `ClientGone` | downstream | no | no | nothing (the client left) |
//!
//! An upstream model (`upstream/`) follows the same table with replicas for engines: a
//! failure before the head that may not have reached a generation (`Connect`, `Send`)
//! is sent on to another replica, each replica at most once; nothing is recycled (the
//! replica's health counts the failure instead).

use corral_protocol::{ApiError, ErrorKind};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Upstream,
    Downstream,
    Internal,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The engine's socket refused or is missing.
    Connect,
    /// The gateway could not form the request to the engine.
    Build,
    /// The exchange broke before a response head (the engine may have died).
    Send,
    /// The engine answered something that is not HTTP.
    BadHead,
    /// No response head within `--engine-timeout`.
    HeadTimeout,
    /// The response broke after its head.
    Body,
    /// No body bytes for `--stall-timeout` after the head.
    Stall,
    /// The client went away.
    ClientGone,
}

impl Kind {
    pub fn side(self) -> Side {
        match self {
            Kind::Build => Side::Internal,
            Kind::ClientGone => Side::Downstream,
            _ => Side::Upstream,
        }
    }

    /// Whether the request may go to an engine again: only if nothing reached one.
    pub fn retry(self) -> bool {
        self == Kind::Connect
    }

    /// Whether the engine is to blame and must be replaced.
    /// Whether an upstream request may go on to another replica: nothing reached the
    /// client yet, and the replica refused it or broke before answering.
    pub fn retry_on_another_replica(self) -> bool {
        matches!(self, Kind::Connect | Kind::Send)
    }

    pub fn recycles_engine(self) -> bool {
        matches!(self, Kind::BadHead | Kind::HeadTimeout | Kind::Stall)
    }

    /// The error the client gets (`None`: there is no client to tell).
    fn api_kind(self) -> Option<ErrorKind> {
        match self {
            Kind::Connect | Kind::Send | Kind::BadHead | Kind::Body => Some(ErrorKind::EngineUnavailable),
            Kind::HeadTimeout | Kind::Stall => Some(ErrorKind::EngineTimeout),
            Kind::Build => Some(ErrorKind::Internal),
            Kind::ClientGone => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind:?}: {detail}")]
pub struct ProxyError {
    pub kind: Kind,
    pub detail: String,
    /// Who the client is told failed: `the engine` or `the upstream`.
    pub who: &'static str,
}

pub const ENGINE: &str = "the engine";
pub const UPSTREAM: &str = "the upstream";

impl ProxyError {
    pub fn new(kind: Kind, detail: impl std::fmt::Display) -> Self {
        Self { kind, detail: detail.to_string(), who: ENGINE }
    }

    /// The same failure, told as `who`'s.
    pub fn by(mut self, who: &'static str) -> Self {
        self.who = who;
        self
    }

    pub fn to_api(&self) -> Option<ApiError> {
        let what = match self.kind {
            Kind::Connect => "is unreachable",
            Kind::Build => {
                return Some(ApiError::new(
                    ErrorKind::Internal,
                    format!("the gateway could not forward the request: {}", self.detail),
                ));
            }
            Kind::Send => "failed before answering",
            Kind::BadHead => "sent a malformed response",
            Kind::HeadTimeout => "did not answer in time",
            Kind::Body => "failed mid-response",
            Kind::Stall => "stalled mid-response",
            Kind::ClientGone => return None,
        };
        Some(ApiError::new(self.kind.api_kind()?, format!("{} {what}: {}", self.who, self.detail)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Kind; 8] = [
        Kind::Connect,
        Kind::Build,
        Kind::Send,
        Kind::BadHead,
        Kind::HeadTimeout,
        Kind::Body,
        Kind::Stall,
        Kind::ClientGone,
    ];

    /// The table in the module comment, row by row.
    #[test]
    fn the_table() {
        let row =
            |k: Kind| (k.side(), k.retry(), k.recycles_engine(), k.api_kind().map(|e| ApiError::new(e, "").status()));
        assert_eq!(row(Kind::Connect), (Side::Upstream, true, false, Some(502)));
        assert_eq!(row(Kind::Build), (Side::Internal, false, false, Some(500)));
        assert_eq!(row(Kind::Send), (Side::Upstream, false, false, Some(502)));
        assert_eq!(row(Kind::BadHead), (Side::Upstream, false, true, Some(502)));
        assert_eq!(row(Kind::HeadTimeout), (Side::Upstream, false, true, Some(504)));
        assert_eq!(row(Kind::Body), (Side::Upstream, false, false, Some(502)));
        assert_eq!(row(Kind::Stall), (Side::Upstream, false, true, Some(504)));
        assert_eq!(row(Kind::ClientGone), (Side::Downstream, false, false, None));
    }

    #[test]
    fn only_upstream_faults_blame_the_engine() {
        for k in ALL {
            if k.recycles_engine() {
                assert_eq!(k.side(), Side::Upstream, "{k:?}");
            }
        }
        assert_eq!(ProxyError::new(Kind::ClientGone, "x").to_api(), None);
        assert!(ProxyError::new(Kind::Build, "bad header").to_api().unwrap().message.contains("bad header"));
        let e = ProxyError::new(Kind::Connect, "refused").to_api().unwrap();
        assert_eq!(e.message, "the engine is unreachable: refused");
        let e = ProxyError::new(Kind::Stall, "nothing for 5 ms").by(UPSTREAM).to_api().unwrap();
        assert_eq!(e.message, "the upstream stalled mid-response: nothing for 5 ms");
    }

    #[test]
    fn only_failures_before_an_answer_go_on_to_another_replica() {
        let on: Vec<Kind> = ALL.into_iter().filter(|k| k.retry_on_another_replica()).collect();
        assert_eq!(on, [Kind::Connect, Kind::Send]);
    }
}
