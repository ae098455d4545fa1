//! Reading a request body up to a byte limit: a `Content-Length` over the limit is
//! refused before any body byte is read, a chunked body when it crosses the limit.

use bytes::Bytes;
use corral_protocol::{ApiError, ErrorKind};
use http::{Request, header};
use http_body_util::BodyExt;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BodyError {
    #[error("the request body is over {limit} bytes")]
    TooLarge { limit: usize },
    /// The client stopped sending or sent a broken body.
    #[error("reading the body: {0}")]
    Read(String),
}

impl From<BodyError> for ApiError {
    fn from(e: BodyError) -> Self {
        let kind = match e {
            BodyError::TooLarge { .. } => ErrorKind::PayloadTooLarge,
            BodyError::Read(_) => ErrorKind::InvalidJson,
        };
        ApiError::new(kind, e.to_string())
    }
}

/// The whole body of `req`, at most `limit` bytes, and the request's head.
pub async fn read_limited<B>(req: Request<B>, limit: usize) -> Result<(http::request::Parts, Bytes), BodyError>
where
    B: hyper::body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge { limit });
    }
    let (parts, body) = req.into_parts();
    let bytes = http_body_util::Limited::new(body, limit).collect().await.map_err(|e| {
        if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
            BodyError::TooLarge { limit }
        } else {
            BodyError::Read(e.to_string())
        }
    })?;
    Ok((parts, bytes.to_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;

    fn req(body: &'static [u8], declared: Option<usize>) -> Request<Full<Bytes>> {
        let mut b = Request::builder().method("POST").uri("/");
        if let Some(n) = declared {
            b = b.header(header::CONTENT_LENGTH, n);
        }
        b.body(Full::new(Bytes::from_static(body))).unwrap()
    }

    #[tokio::test]
    async fn limits() {
        assert_eq!(read_limited(req(b"abc", None), 3).await.unwrap().1, Bytes::from_static(b"abc"));
        assert_eq!(read_limited(req(b"abcd", None), 3).await.unwrap_err(), BodyError::TooLarge { limit: 3 });
        assert_eq!(read_limited(req(b"", Some(10)), 3).await.unwrap_err(), BodyError::TooLarge { limit: 3 });
        let e: ApiError = BodyError::TooLarge { limit: 3 }.into();
        assert_eq!(e.status(), 413);
    }
}
