//! Reading a request body up to a byte limit and with an idle deadline: a
//! `Content-Length` over the limit is refused before any body byte is read, a chunked
//! body when it crosses the limit, and a body with no bytes for `idle` is given up (a
//! client that sends its body slowly must not hold a connection forever).

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use corral_protocol::{ApiError, ErrorKind};
use http::{Request, header};
use http_body_util::BodyExt;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BodyError {
    #[error("the request body is over {limit} bytes")]
    TooLarge { limit: usize },
    #[error("no request body bytes for {} s", idle.as_secs_f64())]
    Timeout { idle: Duration },
    /// The client stopped sending or sent a broken body.
    #[error("reading the body: {0}")]
    Read(String),
}

impl From<BodyError> for ApiError {
    fn from(e: BodyError) -> Self {
        let kind = match e {
            BodyError::TooLarge { .. } => ErrorKind::PayloadTooLarge,
            BodyError::Timeout { .. } => ErrorKind::RequestTimeout,
            BodyError::Read(_) => ErrorKind::InvalidJson,
        };
        ApiError::new(kind, e.to_string())
    }
}

/// The whole body of `req`, at most `limit` bytes with no gap longer than `idle`
/// between its pieces, and the request's head.
pub async fn read_limited<B>(
    req: Request<B>,
    limit: usize,
    idle: Duration,
) -> Result<(http::request::Parts, Bytes), BodyError>
where
    B: hyper::body::Body + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge { limit });
    }
    let (parts, mut body) = req.into_parts();
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(0) as usize);
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => return Err(BodyError::Timeout { idle }),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(BodyError::Read(e.into().to_string())),
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.remaining() > limit {
                return Err(BodyError::TooLarge { limit });
            }
            buf.put(data);
        }
    }
    Ok((parts, buf.freeze()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;

    const IDLE: Duration = Duration::from_secs(30);

    fn req(body: &'static [u8], declared: Option<usize>) -> Request<Full<Bytes>> {
        let mut b = Request::builder().method("POST").uri("/");
        if let Some(n) = declared {
            b = b.header(header::CONTENT_LENGTH, n);
        }
        b.body(Full::new(Bytes::from_static(body))).unwrap()
    }

    #[tokio::test]
    async fn limits() {
        assert_eq!(read_limited(req(b"abc", None), 3, IDLE).await.unwrap().1, Bytes::from_static(b"abc"));
        assert_eq!(read_limited(req(b"abcd", None), 3, IDLE).await.unwrap_err(), BodyError::TooLarge { limit: 3 });
        assert_eq!(read_limited(req(b"", Some(10)), 3, IDLE).await.unwrap_err(), BodyError::TooLarge { limit: 3 });
        let e: ApiError = BodyError::TooLarge { limit: 3 }.into();
        assert_eq!(e.status(), 413);
    }

    type Chunks = http_body_util::channel::Channel<Bytes, std::convert::Infallible>;

    /// A body sent in pieces, as a client sends it over time.
    fn streamed() -> (http_body_util::channel::Sender<Bytes, std::convert::Infallible>, Request<Chunks>) {
        let (tx, body) = Chunks::new(4);
        (tx, Request::builder().method("POST").uri("/").body(body).unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn a_chunked_body_is_cut_when_it_crosses_the_limit_or_stalls() {
        let (mut tx, r) = streamed();
        let reader = tokio::spawn(read_limited(r, 5, IDLE));
        tx.send_data(Bytes::from_static(b"abc")).await.unwrap();
        tokio::time::sleep(IDLE / 2).await;
        tx.send_data(Bytes::from_static(b"def")).await.unwrap();
        assert_eq!(reader.await.unwrap().unwrap_err(), BodyError::TooLarge { limit: 5 });

        let (mut tx, r) = streamed();
        let start = tokio::time::Instant::now();
        let reader = tokio::spawn(read_limited(r, 100, IDLE));
        for _ in 0..3 {
            tokio::time::sleep(IDLE - Duration::from_secs(1)).await;
            tx.send_data(Bytes::from_static(b"x")).await.unwrap();
        }
        let e = reader.await.unwrap().unwrap_err();
        assert_eq!(e, BodyError::Timeout { idle: IDLE });
        assert_eq!(start.elapsed(), (IDLE - Duration::from_secs(1)) * 3 + IDLE, "each piece restarts the wait");
        assert_eq!(ApiError::from(e).status(), 408);
        drop(tx);
    }
}
