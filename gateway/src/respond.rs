//! The gateway's one error → HTTP site: an `ApiError` rendered in the route's API shape
//! (OpenAI, Anthropic or Responses) through `corral-net`'s adapter of `protocol`'s
//! rendering.

use corral_protocol::{ApiError, ApiShape};
use http::Response;

use crate::body::Body;

pub fn error(shape: ApiShape, e: &ApiError) -> Response<Body> {
    corral_net::respond::error_response(e, shape)
}

pub fn json(body: impl Into<bytes::Bytes>) -> Response<Body> {
    corral_net::respond::json_response(body)
}

/// A whole body of another type than JSON (`/metrics`' text format).
pub fn text(content_type: &'static str, body: impl Into<bytes::Bytes>) -> Response<Body> {
    let mut r = Response::new(Body::from(body.into()));
    r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    r
}
