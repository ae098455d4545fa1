//! The accept loop of both servers (after mini-redis's `Listener`).
//!
//! - A semaphore caps open connections: a permit is taken *before* `accept`, so at the
//!   cap new clients wait in the kernel's backlog instead of being refused, and the permit
//!   goes back when the connection's task ends.
//! - Every connection is a task on the caller's `TaskTracker`, so shutdown can wait for
//!   them; when `stop` is cancelled the loop returns and each connection is told to
//!   finish its current response and close (`graceful_shutdown`).
//! - Accept errors (EMFILE, ENFILE, ECONNABORTED) are logged and retried after a backoff
//!   (10 ms doubling to 1 s, reset on success): a server never exits because of them.
//! - hyper gets a timer, a header-read timeout and header limits (`protocol::http_limits`);
//!   without a timer its header timeout is silently off.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use corral_protocol::http_limits;
use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Something connections come from.
pub trait Listener: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept(&self) -> impl Future<Output = std::io::Result<Self::Io>> + Send;
}

impl Listener for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;

    async fn accept(&self) -> std::io::Result<Self::Io> {
        let (s, _) = tokio::net::TcpListener::accept(self).await?;
        // Streamed tokens must not wait for Nagle.
        let _ = s.set_nodelay(true);
        Ok(s)
    }
}

impl Listener for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;

    async fn accept(&self) -> std::io::Result<Self::Io> {
        Ok(tokio::net::UnixListener::accept(self).await?.0)
    }
}

/// What the loop needs besides the listener and the handler.
#[derive(Clone)]
pub struct Server {
    /// Open connections allowed at once.
    pub max_connections: usize,
    /// Cancelled to stop accepting and close connections gracefully.
    pub stop: CancellationToken,
    /// Connection tasks are spawned here.
    pub tasks: TaskTracker,
}

/// Accept until `server.stop` is cancelled, serving each connection with `handler`.
pub async fn serve<L, H, Fut, B>(listener: L, server: Server, handler: H)
where
    L: Listener,
    H: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let limit = Arc::new(Semaphore::new(server.max_connections.max(1)));
    let mut backoff = Duration::ZERO;
    loop {
        let permit = tokio::select! {
            p = limit.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            _ = server.stop.cancelled() => return,
        };
        let io = tokio::select! {
            r = listener.accept() => r,
            _ = server.stop.cancelled() => return,
        };
        let io = match io {
            Ok(io) => {
                backoff = Duration::ZERO;
                io
            }
            Err(e) => {
                backoff = (backoff * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
                tracing::warn!(error = %e, retry_ms = backoff.as_millis() as u64, "accept failed");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => continue,
                    _ = server.stop.cancelled() => return,
                }
            }
        };
        let (handler, stop) = (handler.clone(), server.stop.clone());
        server.tasks.spawn(async move {
            connection(io, handler, stop).await;
            drop(permit);
        });
    }
}

async fn connection<I, H, Fut, B>(io: I, handler: H, stop: CancellationToken)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let svc = hyper::service::service_fn(move |req| {
        let fut = handler(req);
        async move { Ok::<_, Infallible>(fut.await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(http_limits::HEADER_READ_TIMEOUT)
        .max_headers(http_limits::MAX_HEADERS)
        .max_buf_size(http_limits::MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = stop.cancelled() => {
            // Finish the response in progress (if any), then close.
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::Full;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: std::net::SocketAddr) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn connections_over_the_cap_wait_and_stop_closes_gracefully() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let server = Server { max_connections: 1, stop: CancellationToken::new(), tasks: TaskTracker::new() };
        let gate = Arc::new(tokio::sync::Notify::new());
        let g = gate.clone();
        let handler = move |_req: Request<Incoming>| {
            let g = g.clone();
            async move {
                g.notified().await;
                Response::new(Full::new(Bytes::from_static(b"done")))
            }
        };
        let loop_task = tokio::spawn(serve(l, server.clone(), handler));
        let first = tokio::spawn(get(addr));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let second = tokio::spawn(get(addr));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(server.tasks.len(), 1, "the second connection waits for a permit");
        gate.notify_one();
        let out = tokio::time::timeout(Duration::from_secs(5), first).await.expect("first served").unwrap();
        assert!(out.ends_with("done"), "{out}");
        assert!(!second.is_finished());
        gate.notify_one();
        let out = tokio::time::timeout(Duration::from_secs(5), second).await.expect("then the second").unwrap();
        assert!(out.ends_with("done"), "{out}");
        server.stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), loop_task).await.expect("loop stops").unwrap();
        server.tasks.close();
        tokio::time::timeout(Duration::from_secs(5), server.tasks.wait()).await.expect("connections end");
    }
}
