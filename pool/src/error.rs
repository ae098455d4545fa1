//! Why the pool could not hand out a lease, in the pool's own words. The pool knows
//! nothing of HTTP: `From<LeaseError> for ApiError` is the one place these become API
//! errors (kind, status and `Retry-After` follow from the kind in `protocol`).

use corral_protocol::{ApiError, ErrorKind};

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("{}", unknown_model(requested.as_deref(), known))]
    UnknownModel { requested: Option<String>, known: Vec<String> },
    #[error("model {model} keeps crashing ({how}); last output: {line}")]
    CrashLoop { model: String, how: String, line: String },
    #[error("model {model} cannot be served: {line}")]
    Config { model: String, line: String },
    #[error("model {model} failed to start ({how}): {line}")]
    StartFailed { model: String, how: String, line: String },
    #[error("the engine of model {model} did not become ready in time")]
    LoadTimeout { model: String },
    #[error("every engine slot is busy; retry shortly")]
    Overloaded,
}

/// The message lists the known ids sorted, whatever order the pool holds them in.
fn unknown_model(requested: Option<&str>, known: &[String]) -> String {
    let mut known = known.to_vec();
    known.sort();
    match requested {
        Some(name) => format!("model {name:?} not found; available: {}", known.join(", ")),
        None => format!("the request names no model; available: {}", known.join(", ")),
    }
}

impl From<LeaseError> for ApiError {
    fn from(e: LeaseError) -> Self {
        let kind = match &e {
            LeaseError::ShuttingDown => ErrorKind::ShuttingDown,
            LeaseError::UnknownModel { .. } => ErrorKind::ModelNotFound,
            LeaseError::CrashLoop { .. } => ErrorKind::EngineCrashLoop,
            LeaseError::Config { .. } => ErrorKind::EngineConfig,
            LeaseError::StartFailed { .. } => ErrorKind::EngineStartFailed,
            LeaseError::LoadTimeout { .. } => ErrorKind::EngineTimeout,
            LeaseError::Overloaded => ErrorKind::Overloaded,
        };
        let api = ApiError::new(kind, e.to_string());
        if let LeaseError::UnknownModel { .. } = e { api.with_param("model") } else { api }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason_has_its_api_kind() {
        let api = |e: LeaseError| ApiError::from(e);
        let unknown =
            api(LeaseError::UnknownModel { requested: Some("x".into()), known: vec!["a".into(), "b".into()] });
        assert_eq!((unknown.kind, unknown.param.as_deref()), (ErrorKind::ModelNotFound, Some("model")));
        assert!(unknown.message.contains("a, b"));
        let looping = api(LeaseError::CrashLoop { model: "m".into(), how: "exit code 1".into(), line: "boom".into() });
        assert_eq!(looping.kind, ErrorKind::EngineCrashLoop);
        assert!(looping.message.contains("boom"));
        assert_eq!(api(LeaseError::Config { model: "m".into(), line: "x".into() }).kind, ErrorKind::EngineConfig);
        assert_eq!(api(LeaseError::LoadTimeout { model: "m".into() }).status(), 504);
        assert_eq!(api(LeaseError::Overloaded).status(), 503);
        assert_eq!(api(LeaseError::ShuttingDown).kind, ErrorKind::ShuttingDown);
    }
}
