//! The one mapping from the engine's typed errors to API errors: what a request asked for
//! that cannot be done is a 4xx naming the reason; anything else is a 500.

use corral_protocol::{ApiError, ErrorKind};

use crate::Error;

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
}
