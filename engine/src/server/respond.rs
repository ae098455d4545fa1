//! The small things every response is made of: an error in one API's shape, a JSON
//! body, object ids and timestamps. Rendering itself is `protocol`'s and `corral-net`'s;
//! this is the engine's one door to it.

use bytes::Bytes;
use corral_protocol::{ApiError, ApiShape};
use http::Response;

use super::body::Body;

/// An error response in OpenAI's shape.
pub fn error_response(e: &ApiError) -> Response<Body> {
    error_response_in(e, ApiShape::OpenAi)
}

/// An error response in one API's shape.
pub fn error_response_in(e: &ApiError, shape: ApiShape) -> Response<Body> {
    corral_net::respond::error_response(e, shape)
}

pub fn json_response(body: impl Into<Bytes>) -> Response<Body> {
    corral_net::respond::json_response(body)
}

/// An object id in the style of the APIs: `<prefix>_<24 hex digits>`.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{:016x}{:08x}", rand::random::<u64>(), rand::random::<u32>())
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
