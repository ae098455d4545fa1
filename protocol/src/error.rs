//! Error kinds that cross the wire, with their HTTP status and stable strings.
//!
//! The body follows OpenAI's shape, `{"error":{"message","type","param","code"}}`:
//! `type` is the OpenAI category (`invalid_request_error`, `rate_limit_error`,
//! `server_error`) and `code` names the exact condition. Both strings are API: they
//! never change meaning once shipped.
//!
//! Rendering is here too, once per API shape (`ApiShape`): the status, headers and body
//! of an error response, and the terminal event of a stream that fails after it started.
//! Each server wraps `ApiError::render` in a few lines of its own HTTP types; nothing else
//! turns an error into bytes.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The body is not valid JSON (or not UTF-8).
    InvalidJson,
    /// A field is missing, has the wrong type, or is out of range.
    InvalidRequest,
    /// The prompt alone does not fit the context.
    ContextLengthExceeded,
    /// The prompt's KV cannot fit the engine's KV budget, even alone.
    ContextOverBudget,
    /// The body is over the size limit.
    PayloadTooLarge,
    /// No such route.
    NotFound,
    /// The route exists, the method does not.
    MethodNotAllowed,
    /// The Host header does not name this server (DNS rebinding, `docs/api.md`).
    HostNotAllowed,
    /// A state-changing browser request from another origin.
    OriginNotAllowed,
    /// No Host header.
    MissingHost,
    /// The gateway has an API key and the request carries none, or another one.
    InvalidApiKey,
    /// The client stopped sending its request body (nothing for the body timeout).
    RequestTimeout,
    /// The request names a model this server does not have.
    ModelNotFound,
    /// The engine's request queue is full.
    QueueFull,
    /// The engine is draining (about to stop); retry against its successor.
    EngineDraining,
    /// The engine died or the connection to it broke.
    EngineUnavailable,
    /// Every engine slot is busy and none could be freed in time.
    Overloaded,
    /// The model's engine keeps crashing; not retried until a cooldown passes.
    EngineCrashLoop,
    /// The model's engine refused its configuration (bad file, unsupported model).
    EngineConfig,
    /// The model's engine died while loading.
    EngineStartFailed,
    /// The model's engine did not become ready in time.
    EngineTimeout,
    /// The server is shutting down.
    ShuttingDown,
    /// A bug or an unexpected failure inside the server.
    Internal,
    /// The model cannot be reached through this API (an upstream that does not offer it).
    NotImplemented,
}

impl ErrorKind {
    pub fn status(self) -> u16 {
        use ErrorKind::*;
        match self {
            InvalidJson | InvalidRequest | ContextLengthExceeded | ContextOverBudget | MissingHost => 400,
            InvalidApiKey => 401,
            HostNotAllowed | OriginNotAllowed => 403,
            NotFound | ModelNotFound => 404,
            MethodNotAllowed => 405,
            RequestTimeout => 408,
            PayloadTooLarge => 413,
            QueueFull => 429,
            Internal => 500,
            NotImplemented => 501,
            EngineUnavailable => 502,
            EngineDraining | Overloaded | EngineCrashLoop | EngineConfig | EngineStartFailed | ShuttingDown => 503,
            EngineTimeout => 504,
        }
    }

    /// OpenAI's `type` field.
    pub fn type_str(self) -> &'static str {
        if self == ErrorKind::NotImplemented {
            // Not the server's fault: the request asks for what this model does not offer.
            return "invalid_request_error";
        }
        match self.status() {
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        }
    }

    /// The stable `code` field.
    pub fn code(self) -> &'static str {
        use ErrorKind::*;
        match self {
            InvalidJson => "invalid_json",
            InvalidRequest => "invalid_value",
            ContextLengthExceeded => "context_length_exceeded",
            ContextOverBudget => "context_over_budget",
            PayloadTooLarge => "payload_too_large",
            NotFound => "not_found",
            MethodNotAllowed => "method_not_allowed",
            HostNotAllowed => "host_not_allowed",
            OriginNotAllowed => "origin_not_allowed",
            MissingHost => "missing_host",
            InvalidApiKey => "invalid_api_key",
            RequestTimeout => "request_timeout",
            ModelNotFound => "model_not_found",
            QueueFull => "queue_full",
            EngineDraining => "engine_draining",
            EngineUnavailable => "engine_unavailable",
            Overloaded => "overloaded",
            EngineCrashLoop => "engine_crash_loop",
            EngineConfig => "engine_config",
            EngineStartFailed => "engine_start_failed",
            EngineTimeout => "engine_timeout",
            ShuttingDown => "shutting_down",
            Internal => "internal_error",
            NotImplemented => "not_implemented",
        }
    }

    /// Anthropic's error `type` for this kind.
    pub fn anthropic_type(self) -> &'static str {
        if self == ErrorKind::NotImplemented {
            return "invalid_request_error";
        }
        match self.status() {
            401 => "authentication_error",
            403 => "permission_error",
            404 | 405 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            503 => "overloaded_error",
            _ => "api_error",
        }
    }

    /// Whether a client may retry later (sent as `Retry-After`).
    pub fn retry_after_secs(self) -> Option<u64> {
        use ErrorKind::*;
        match self {
            QueueFull | Overloaded | EngineDraining | EngineUnavailable | EngineStartFailed | ShuttingDown => Some(1),
            EngineTimeout => Some(5),
            EngineCrashLoop | EngineConfig => Some(60),
            _ => None,
        }
    }
}

/// An error as the API returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into(), param: None }
    }

    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self { kind: ErrorKind::InvalidRequest, message: message.into(), param: Some(param.to_owned()) }
    }

    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                message: self.message.clone(),
                r#type: self.kind.type_str().to_owned(),
                param: self.param.clone(),
                code: Some(self.kind.code().to_owned()),
            },
        }
    }

    /// The OpenAI-shaped body.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.body()).unwrap_or_else(|_| r#"{"error":{"message":"error"}}"#.to_owned())
    }

    pub fn status(&self) -> u16 {
        self.kind.status()
    }

    /// Headers every response carrying this error gets: `Retry-After`, and the scheme a
    /// refused client should authenticate with (RFC 9110 §11.6.1: a 401 must say).
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut h: Vec<_> = self.kind.retry_after_secs().map(|s| ("retry-after", s.to_string())).into_iter().collect();
        if self.kind == ErrorKind::InvalidApiKey {
            h.push(("www-authenticate", "Bearer".to_owned()));
        }
        h
    }

    /// The whole error response in `shape`.
    /// Anthropic's shape: `{"type":"error","error":{"type","message"}}`.
    pub fn to_anthropic_json(&self) -> String {
        #[derive(Serialize)]
        struct Detail<'a> {
            r#type: &'a str,
            message: &'a str,
        }
        #[derive(Serialize)]
        struct Body<'a> {
            r#type: &'a str,
            error: Detail<'a>,
        }
        let body =
            Body { r#type: "error", error: Detail { r#type: self.kind.anthropic_type(), message: &self.message } };
        serde_json::to_string(&body).unwrap_or_else(|_| r#"{"type":"error","error":{"type":"api_error"}}"#.to_owned())
    }

    pub fn render(&self, shape: ApiShape) -> Rendered {
        let body = match shape {
            ApiShape::OpenAi | ApiShape::Responses => self.to_json(),
            ApiShape::Anthropic => self.to_anthropic_json(),
        };
        let mut headers = self.headers();
        headers.push(("content-type", "application/json".to_owned()));
        Rendered { status: self.status(), headers, body }
    }

    /// The terminal SSE event of a stream that fails after it started (no `[DONE]`
    /// follows it).
    pub fn sse_event(&self, shape: ApiShape) -> String {
        match shape {
            ApiShape::OpenAi => format!("data: {}\n\n", self.to_json()),
            ApiShape::Anthropic => format!("event: error\ndata: {}\n\n", self.to_anthropic_json()),
            ApiShape::Responses => {
                #[derive(Serialize)]
                struct Event<'a> {
                    r#type: &'a str,
                    code: &'a str,
                    message: &'a str,
                    param: &'a Option<String>,
                    sequence_number: u64,
                }
                let e = Event {
                    r#type: "error",
                    code: self.kind.code(),
                    message: &self.message,
                    param: &self.param,
                    sequence_number: 0,
                };
                format!("event: error\ndata: {}\n\n", serde_json::to_string(&e).unwrap_or_default())
            }
        }
    }
}

/// The wire shapes an API error is written in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ApiShape {
    /// `{"error":{"message","type","param","code"}}` and `data: {…}` events.
    #[default]
    OpenAi,
    /// Anthropic Messages: `{"type":"error","error":{"type","message"}}`, and
    /// `event: error` with the same body in a stream.
    Anthropic,
    /// OpenAI Responses: OpenAI's body; in a stream, an `error` event
    /// (`{"type":"error","code","message","param","sequence_number"}`).
    Responses,
}

/// An error response ready to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendered {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind.code(), self.message)
    }
}

impl std::error::Error for ApiError {}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub r#type: String,
    pub param: Option<String>,
    pub code: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_openai_shape() {
        let e = ApiError::invalid("temperature", "must be >= 0");
        let v: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "invalid_value");
        assert_eq!(v["error"]["param"], "temperature");
        assert_eq!(v["error"]["message"], "must be >= 0");
    }

    #[test]
    fn statuses_and_categories() {
        assert_eq!(ErrorKind::QueueFull.status(), 429);
        assert_eq!(ErrorKind::QueueFull.type_str(), "rate_limit_error");
        assert_eq!(ErrorKind::EngineUnavailable.status(), 502);
        assert_eq!(ErrorKind::EngineDraining.type_str(), "server_error");
        assert_eq!(ErrorKind::PayloadTooLarge.status(), 413);
        assert_eq!(ErrorKind::EngineCrashLoop.retry_after_secs(), Some(60));
        let n = ErrorKind::NotImplemented;
        assert_eq!(
            (n.status(), n.code(), n.type_str(), n.anthropic_type()),
            (501, "not_implemented", "invalid_request_error", "invalid_request_error")
        );
        assert_eq!(n.retry_after_secs(), None);
    }

    #[test]
    fn rendering_carries_status_retry_after_and_the_same_body_as_the_event() {
        let e = ApiError::new(ErrorKind::Overloaded, "busy");
        let r = e.render(ApiShape::OpenAi);
        assert_eq!(r.status, 503);
        assert!(r.headers.contains(&("retry-after", "1".to_owned())));
        assert!(r.headers.contains(&("content-type", "application/json".to_owned())));
        assert_eq!(e.sse_event(ApiShape::OpenAi), format!("data: {}\n\n", r.body));
        let a = e.render(ApiShape::Anthropic);
        let v: serde_json::Value = serde_json::from_str(&a.body).unwrap();
        assert_eq!((v["type"].as_str(), v["error"]["type"].as_str()), (Some("error"), Some("overloaded_error")));
        assert!(e.sse_event(ApiShape::Anthropic).starts_with("event: error\ndata: {\"type\":\"error\""));
        assert_eq!(ApiError::invalid("x", "y").kind.anthropic_type(), "invalid_request_error");
        assert!(e.sse_event(ApiShape::Responses).contains("\"sequence_number\":0"));
        assert!(ApiError::invalid("x", "y").headers().is_empty());
    }

    #[test]
    fn a_missing_or_wrong_key_is_openais_invalid_api_key_and_anthropics_authentication_error() {
        let e = ApiError::new(ErrorKind::InvalidApiKey, "no key");
        let r = e.render(ApiShape::OpenAi);
        assert_eq!(r.status, 401);
        assert!(r.headers.contains(&("www-authenticate", "Bearer".to_owned())), "{:?}", r.headers);
        let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(
            (v["error"]["type"].as_str(), v["error"]["code"].as_str()),
            (Some("invalid_request_error"), Some("invalid_api_key"))
        );
        let a: serde_json::Value = serde_json::from_str(&e.render(ApiShape::Anthropic).body).unwrap();
        assert_eq!(a["error"]["type"], "authentication_error");
        assert_eq!(ErrorKind::RequestTimeout.status(), 408);
        assert_eq!(ErrorKind::RequestTimeout.code(), "request_timeout");
    }
}
