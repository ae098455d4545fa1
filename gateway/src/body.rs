//! Gateway response bodies: a whole buffer, or an engine's response passed through
//! frame by frame. The pass-through holds the request's pool lease (released when the
//! body ends or the client goes away, which also drops the engine connection so the
//! engine cancels), and turns an engine failure mid-body into the documented ending:
//! for SSE a final `data: {"error":…}` event and then an aborted body (no `[DONE]`, no
//! terminating chunk); otherwise an aborted body.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use corral_pool::Lease;
use corral_protocol::{ApiError, ErrorKind};
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};

use crate::stats::GatewayStats;

/// How long the terminal error event gets to reach the socket before the body is cut.
const FLUSH_GRACE: Duration = Duration::from_millis(20);

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub enum Body {
    Full(Option<Bytes>),
    Proxy(Box<ProxyBody>),
}

impl Body {
    pub fn full(b: impl Into<Bytes>) -> Self {
        Body::Full(Some(b.into()))
    }
}

/// What ends a pass-through early, reported to the pool so a hung or broken engine is
/// recycled.
pub enum Failure {
    Broken,
    Stalled,
}

pub struct ProxyBody {
    pub upstream: Incoming,
    pub lease: Option<Lease>,
    pub sse: bool,
    pub stall: Duration,
    pub stats: Arc<GatewayStats>,
    pub on_failure: Option<Box<dyn FnOnce(Failure) + Send>>,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    state: End,
}

#[derive(PartialEq)]
enum End {
    Open,
    /// The terminal error event went out; abort on the next poll.
    ErrorSent,
    Done,
}

impl ProxyBody {
    pub fn new(
        upstream: Incoming,
        lease: Lease,
        sse: bool,
        stall: Duration,
        stats: Arc<GatewayStats>,
        on_failure: Box<dyn FnOnce(Failure) + Send>,
    ) -> Self {
        stats.in_flight.fetch_add(1, Ordering::Relaxed);
        Self {
            upstream,
            lease: Some(lease),
            sse,
            stall,
            stats,
            on_failure: Some(on_failure),
            timer: None,
            state: End::Open,
        }
    }

    fn fail(&mut self, why: Failure, msg: String) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.stats.proxy_errors.fetch_add(1, Ordering::Relaxed);
        let kind = match why {
            Failure::Broken => ErrorKind::EngineUnavailable,
            Failure::Stalled => ErrorKind::EngineTimeout,
        };
        if let Some(f) = self.on_failure.take() {
            f(why);
        }
        self.lease.take();
        if self.sse {
            self.state = End::ErrorSent;
            self.timer = None;
            let ev = format!("data: {}\n\n", ApiError::new(kind, msg).to_json());
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(ev)))))
        } else {
            self.state = End::Done;
            Poll::Ready(Some(Err(msg.into())))
        }
    }
}

impl Drop for ProxyBody {
    fn drop(&mut self) {
        self.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl HttpBody for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let p = match self.get_mut() {
            Body::Full(b) => return Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Body::Proxy(p) => p.as_mut(),
        };
        match p.state {
            End::Done => return Poll::Ready(None),
            End::ErrorSent => {
                // hyper drops unflushed bytes when a body errors, so give it a moment
                // (a pending poll makes it flush) before cutting the chunked body.
                let timer = p.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(FLUSH_GRACE)));
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                p.state = End::Done;
                return Poll::Ready(Some(Err("engine failed mid-stream".into())));
            }
            End::Open => {}
        }
        match Pin::new(&mut p.upstream).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                p.timer = None;
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => p.fail(Failure::Broken, format!("the engine failed mid-response: {e}")),
            Poll::Ready(None) => {
                p.state = End::Done;
                p.lease.take();
                Poll::Ready(None)
            }
            Poll::Pending => {
                let stall = p.stall;
                let timer = p.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
                if timer.as_mut().poll(cx).is_ready() {
                    return p.fail(Failure::Stalled, format!("the engine sent nothing for {} ms", stall.as_millis()));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Full(b) => b.is_none(),
            Body::Proxy(p) => p.state == End::Done,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Body::Full(None) => SizeHint::with_exact(0),
            Body::Proxy(p) => p.upstream.size_hint(),
        }
    }
}
