//! Where a request's `model` goes: a local model (the pool's) or an upstream. The rule
//! of `docs/gateway.md` ("Routing") over both: a name that is an id or alias goes there;
//! with exactly one model in all, everything goes to it; otherwise 404 listing every id.
//! Without upstreams the pool decides alone, as it always has.

use std::sync::Arc;

use corral_pool::LeaseError;

use crate::app::App;
use crate::upstream::Upstream;

/// What the names matched, and how many models there are of each kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Names {
    pub local_match: bool,
    pub upstream_match: Option<usize>,
    pub locals: usize,
    pub upstreams: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Local,
    Upstream(usize),
    Unknown,
}

/// Pure: the decision from the matches and counts.
pub fn decide(n: Names) -> Decision {
    match n {
        Names { upstream_match: Some(i), .. } => Decision::Upstream(i),
        Names { local_match: true, .. } => Decision::Local,
        Names { upstreams: 0, .. } => Decision::Local,
        Names { locals: 0, upstreams: 1, .. } => Decision::Upstream(0),
        _ => Decision::Unknown,
    }
}

pub enum Target {
    Local,
    Upstream(Arc<Upstream>),
}

/// The target of a request naming `requested` (or nothing).
pub fn resolve(app: &App, requested: Option<&str>) -> Result<Target, LeaseError> {
    let ups = &app.upstreams;
    let upstream_match =
        requested.and_then(|name| ups.find(name)).and_then(|f| ups.0.iter().position(|u| Arc::ptr_eq(u, f)));
    let local_ids = app.pool.ids();
    let names = Names {
        local_match: requested.is_some_and(|name| app.pool.has(name)),
        upstream_match,
        locals: local_ids.len(),
        upstreams: ups.len(),
    };
    match decide(names) {
        Decision::Local => Ok(Target::Local),
        Decision::Upstream(i) => Ok(Target::Upstream(ups.0[i].clone())),
        Decision::Unknown => Err(LeaseError::UnknownModel {
            requested: requested.map(str::to_owned),
            known: local_ids.into_iter().chain(ups.ids().map(str::to_owned)).collect(),
        }),
    }
}

/// The model a request without `model` goes to, when there is exactly one in all.
pub fn default_model(app: &App) -> Option<String> {
    match (app.pool.ids().as_slice(), app.upstreams.len()) {
        ([only], 0) => Some(only.clone()),
        ([], 1) => app.upstreams.ids().next().map(str::to_owned),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(local_match: bool, upstream_match: Option<usize>, locals: usize, upstreams: usize) -> Names {
        Names { local_match, upstream_match, locals, upstreams }
    }

    #[test]
    fn names_then_the_only_model_then_unknown() {
        assert_eq!(decide(n(false, Some(1), 3, 2)), Decision::Upstream(1));
        assert_eq!(decide(n(true, None, 3, 2)), Decision::Local);
        // Without upstreams the pool has its say (its own default and its own 404).
        assert_eq!(decide(n(false, None, 3, 0)), Decision::Local);
        assert_eq!(decide(n(false, None, 0, 0)), Decision::Local);
        // Exactly one model in all takes every request.
        assert_eq!(decide(n(false, None, 0, 1)), Decision::Upstream(0));
        // One local and one upstream: a name is needed.
        assert_eq!(decide(n(false, None, 1, 1)), Decision::Unknown);
        assert_eq!(decide(n(false, None, 0, 2)), Decision::Unknown);
    }
}
