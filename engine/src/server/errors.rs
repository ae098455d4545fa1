//! The one mapping from the engine's typed errors to API errors: what a request asked for
//! that cannot be done is a 4xx naming the reason; anything else is a 500. The
//! scheduler's refusals map here too (queue full → 429, over the KV budget → 400,
//! cancelled → `engine_draining`), so it never speaks HTTP itself.

use corral_protocol::{ApiError, ErrorKind};

use crate::Error;
use crate::scheduler::SchedulerError;

impl From<&Error> for ApiError {
    fn from(e: &Error) -> Self {
        match e {
            Error::ContextExceeded { .. } => ApiError::new(ErrorKind::ContextLengthExceeded, e.to_string()),
            Error::BadToken { .. } => ApiError::invalid("prompt", e.to_string()),
            Error::Template(m) => ApiError::invalid("messages", format!("chat template: {m}")),
            _ => ApiError::new(ErrorKind::Internal, e.to_string()),
        }
    }
}

impl From<&SchedulerError> for ApiError {
    fn from(e: &SchedulerError) -> Self {
        let kind = match e {
            SchedulerError::Engine(e) => return ApiError::from(&**e),
            SchedulerError::QueueFull => ErrorKind::QueueFull,
            SchedulerError::Stopped => ErrorKind::Internal,
            SchedulerError::Cancelled => ErrorKind::EngineDraining,
            SchedulerError::OverBudget { .. } => ErrorKind::ContextOverBudget,
        };
        ApiError::new(kind, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_faults_are_4xx_the_rest_500() {
        let api = |e: Error| ApiError::from(&e);
        assert_eq!(api(Error::ContextExceeded { prompt: 9, ctx: 4 }).status(), 400);
        assert_eq!(api(Error::BadToken { id: 9, vocab: 4 }).param.as_deref(), Some("prompt"));
        assert_eq!(api(Error::Template("x".into())).param.as_deref(), Some("messages"));
        assert_eq!(api(Error::Candle("oom".into())).status(), 500);
    }

    #[test]
    fn scheduler_refusals_keep_their_kinds() {
        let api = |e: SchedulerError| ApiError::from(&e);
        assert_eq!(api(SchedulerError::QueueFull).kind, ErrorKind::QueueFull);
        assert_eq!(api(SchedulerError::Stopped).status(), 500);
        assert_eq!(api(SchedulerError::Cancelled).kind, ErrorKind::EngineDraining);
        let over =
            SchedulerError::OverBudget { prompt: 96, need: 9_700, per_token: 100, states: 0, budget: 10_000, fit: 96 };
        let e = api(over);
        assert_eq!((e.kind, e.status()), (ErrorKind::ContextOverBudget, 400));
        assert!(e.message.contains("10000 bytes") && e.message.contains("room for 96 tokens"), "{}", e.message);
        let engine = api(Error::ContextExceeded { prompt: 9, ctx: 4 }.into());
        assert_eq!(engine.kind, ErrorKind::ContextLengthExceeded);
    }
}
