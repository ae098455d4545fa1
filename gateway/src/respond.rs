//! The gateway's one error → HTTP site: an `ApiError` rendered in the route's API shape
//! (OpenAI today) through `corral-net`'s adapter of `protocol`'s rendering.

use corral_protocol::{ApiError, ApiShape};
use http::Response;

use crate::body::Body;

pub fn error(e: &ApiError) -> Response<Body> {
    corral_net::respond::error_response(e, ApiShape::OpenAi)
}

pub fn json(body: impl Into<bytes::Bytes>) -> Response<Body> {
    corral_net::respond::json_response(body)
}
