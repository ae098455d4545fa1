//! HTTP/1.1 to an engine's unix socket: one connection per request (unix connects are
//! cheap and a fresh connection makes failures unambiguous: a connect error means
//! nothing reached the engine).

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

#[derive(Debug, thiserror::Error)]
pub enum UnixHttpError {
    /// Nothing was sent: the socket is missing or refused the connection.
    #[error("connect {socket}: {source}")]
    Connect { socket: String, source: std::io::Error },
    /// The request may have reached the engine; the exchange failed after that.
    #[error("exchange with {socket}: {source}")]
    Exchange { socket: String, source: hyper::Error },
    #[error("timed out talking to {0}")]
    Timeout(String),
}

/// Open a connection and hand back the request sender (the connection is driven by a
/// background task that ends when the sender and any response body are dropped).
pub async fn connect<B>(socket: &Path) -> Result<SendRequest<B>, UnixHttpError>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let name = socket.display().to_string();
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|source| UnixHttpError::Connect { socket: name.clone(), source })?;
    let (tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|source| UnixHttpError::Exchange { socket: name, source })?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "engine connection ended");
        }
    });
    Ok(tx)
}

/// A small request with a whole-body response, bounded by `timeout`.
pub async fn call(
    socket: &Path,
    method: &str,
    path: &str,
    body: Bytes,
    timeout: Duration,
) -> Result<(u16, Bytes), UnixHttpError> {
    let name = socket.display().to_string();
    let fut = async {
        let mut tx = connect::<Full<Bytes>>(socket).await?;
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, "engine")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .expect("static request parts are valid");
        let resp: Response<Incoming> =
            tx.send_request(req).await.map_err(|source| UnixHttpError::Exchange { socket: name.clone(), source })?;
        let status = resp.status().as_u16();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|source| UnixHttpError::Exchange { socket: name.clone(), source })?
            .to_bytes();
        Ok((status, bytes))
    };
    tokio::time::timeout(timeout, fut).await.map_err(|_| UnixHttpError::Timeout(socket.display().to_string()))?
}
