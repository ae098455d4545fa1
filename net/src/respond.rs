//! The hyper side of `protocol`'s error rendering: an `ApiError` as a response, for any
//! body type that can be made from bytes. Both servers call this and nothing else to
//! turn an error into a response.

use bytes::Bytes;
use corral_protocol::{ApiError, ApiShape};
use http::{HeaderName, HeaderValue, Response, StatusCode, header};

pub fn error_response<B: From<Bytes>>(e: &ApiError, shape: ApiShape) -> Response<B> {
    let r = e.render(shape);
    let mut resp = Response::new(B::from(Bytes::from(r.body)));
    *resp.status_mut() = StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (name, value) in r.headers {
        if let Ok(v) = HeaderValue::from_str(&value) {
            resp.headers_mut().insert(HeaderName::from_static(name), v);
        }
    }
    resp
}

pub fn json_response<B: From<Bytes>>(body: impl Into<Bytes>) -> Response<B> {
    let mut r = Response::new(B::from(body.into()));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_protocol::ErrorKind;
    use http_body_util::Full;

    #[test]
    fn status_and_headers_come_from_the_error() {
        let r: Response<Full<Bytes>> =
            error_response(&ApiError::new(ErrorKind::EngineCrashLoop, "x"), ApiShape::OpenAi);
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["retry-after"], "60");
        assert_eq!(r.headers()["content-type"], "application/json");
    }
}
