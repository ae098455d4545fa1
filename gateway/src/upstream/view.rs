//! What `/engine` and `/stats` show of an upstream: its state, each replica's health,
//! requests in flight, counts and time to a response head. Never its key (only whether
//! it has one) and never a URL's credentials (refused at parsing).

use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::Upstream;
use super::health::State;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ReplicaView {
    pub url: String,
    /// `unknown` (not checked yet), `up` or `down`.
    pub health: String,
    /// Seconds since the health last changed.
    pub health_for_s: u64,
    pub last_error: Option<String>,
    pub in_flight: usize,
    /// Exchanges that got a response head.
    pub requests: u64,
    /// Exchanges that failed (before the head, a timeout, mid-body).
    pub failures: u64,
    /// Time to the response head: the last one and a running mean, milliseconds.
    pub latency_ms: Option<f64>,
    pub mean_latency_ms: Option<f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct UpstreamView {
    pub model: String,
    /// `ready` (a replica is up), `unknown` (none checked yet) or `down` (none takes
    /// requests).
    pub state: String,
    /// The name the upstream knows the model by.
    pub upstream_model: String,
    pub aliases: Vec<String>,
    /// Whether requests carry an API key for it (the key itself is never shown).
    pub api_key: bool,
    pub in_flight: usize,
    /// Requests sent on to another replica after one failed before answering.
    pub retries: u64,
    pub replicas: Vec<ReplicaView>,
}

/// An upstream's state from its replicas' health.
pub fn state(healths: impl IntoIterator<Item = State>) -> &'static str {
    let (mut up, mut unknown) = (false, false);
    for h in healths {
        up |= h == State::Up;
        unknown |= h == State::Unknown;
    }
    match (up, unknown) {
        (true, _) => "ready",
        (false, true) => "unknown",
        (false, false) => "down",
    }
}

pub fn of(u: &Upstream) -> UpstreamView {
    let replicas: Vec<ReplicaView> = u
        .replicas
        .iter()
        .map(|r| {
            let h = r.health();
            let l = r.latency();
            ReplicaView {
                url: r.base.to_string(),
                health: h.state.as_str().to_owned(),
                health_for_s: h.since.elapsed().as_secs(),
                last_error: h.last_error,
                in_flight: r.in_flight(),
                requests: r.answered.load(Ordering::Relaxed),
                failures: r.failed.load(Ordering::Relaxed),
                latency_ms: l.last_ms,
                mean_latency_ms: l.mean_ms,
            }
        })
        .collect();
    UpstreamView {
        model: u.id().to_owned(),
        state: state(u.replicas.iter().map(|r| r.health().state)).to_owned(),
        upstream_model: u.spec.remote_name().to_owned(),
        aliases: u.spec.aliases.clone(),
        api_key: u.key().is_some(),
        in_flight: replicas.iter().map(|r| r.in_flight).sum(),
        retries: u.retries.load(Ordering::Relaxed),
        replicas,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upstream_is_ready_while_one_replica_is_up() {
        assert_eq!(state([State::Down, State::Up]), "ready");
        assert_eq!(state([State::Down, State::Unknown]), "unknown");
        assert_eq!(state([State::Down, State::Down]), "down");
        assert_eq!(state([]), "down");
    }
}
