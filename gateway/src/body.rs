//! Gateway response bodies: a whole buffer, or an engine's (or upstream's) response
//! passed through frame by frame. The pass-through holds the request's pool lease or
//! upstream replica claim (released when the body ends or the client goes away, which
//! also drops the connection so the engine or upstream cancels), and turns a failure
//! mid-body into the documented ending: for SSE a final `data: {"error":…}` event and
//! then an aborted body (no `[DONE]`, no terminating chunk); otherwise an aborted body.
//! The terminal event is written in the route's API shape. It also holds the request's
//! in-flight guard, so shutdown waits until the last byte is out, and an optional `Tap`
//! that sees every data frame before the client does (stored Responses capture their
//! answer with it).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use corral_net::gauge::Guard;
use corral_protocol::ApiShape;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};

use crate::proxy_error::{Kind, ProxyError};

/// How long the terminal error event gets to reach the socket before the body is cut.
const FLUSH_GRACE: Duration = Duration::from_millis(20);

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub enum Body {
    Full(Option<Bytes>),
    Proxy(Box<ProxyBody>),
}

impl From<Bytes> for Body {
    fn from(b: Bytes) -> Self {
        Body::Full(Some(b))
    }
}

/// Sees each data frame of a pass-through body before it is handed on, and its clean
/// end.
pub trait Tap: Send {
    fn data(&mut self, chunk: &Bytes);
    fn end(&mut self);
}

/// Told about a failure after the head (the proxy applies `proxy_error`'s table: count
/// it, recycle the engine if it is to blame).
pub type OnFailure = Box<dyn FnOnce(&ProxyError) + Send>;

/// What a pass-through body holds until it ends: an engine's pool lease, or an upstream
/// replica's in-flight count. Dropping it gives it back.
pub type Claim = Box<dyn Send>;

pub struct ProxyBody {
    upstream: Incoming,
    /// Released when the body ends, fails or is dropped (the client went away).
    lease: Option<Claim>,
    guard: Option<Guard>,
    sse: bool,
    shape: ApiShape,
    stall: Duration,
    on_failure: Option<OnFailure>,
    who: &'static str,
    tap: Option<Box<dyn Tap>>,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    state: PassState,
}

#[derive(PartialEq)]
enum PassState {
    Open,
    /// The terminal error event went out; abort on the next poll.
    ErrorSent,
    Done,
}

/// How a pass-through body ends when the engine fails mid-body.
pub struct Ending {
    /// The client asked for (or got) an event stream: a terminal error event first.
    pub sse: bool,
    /// The API shape of that event.
    pub shape: ApiShape,
    pub stall: Duration,
    pub on_failure: OnFailure,
    /// Who is named in the terminal error (`proxy_error::ENGINE` or `UPSTREAM`).
    pub who: &'static str,
}

impl ProxyBody {
    pub fn new(upstream: Incoming, claim: Claim, guard: Guard, ending: Ending, tap: Option<Box<dyn Tap>>) -> Self {
        Self {
            upstream,
            lease: Some(claim),
            guard: Some(guard),
            sse: ending.sse,
            shape: ending.shape,
            stall: ending.stall,
            on_failure: Some(ending.on_failure),
            who: ending.who,
            tap,
            timer: None,
            state: PassState::Open,
        }
    }

    fn finish(&mut self) {
        self.state = PassState::Done;
        self.lease.take();
        self.guard.take();
    }

    fn fail(&mut self, err: ProxyError) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let err = err.by(self.who);
        if let Some(f) = self.on_failure.take() {
            f(&err);
        }
        self.lease.take();
        let api = err.to_api();
        if self.sse
            && let Some(api) = api
        {
            self.state = PassState::ErrorSent;
            self.timer = None;
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(api.sse_event(self.shape))))))
        } else {
            self.finish();
            Poll::Ready(Some(Err(err.to_string().into())))
        }
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
            PassState::Done => return Poll::Ready(None),
            PassState::ErrorSent => {
                // hyper drops unflushed bytes when a body errors, so give it a moment
                // (a pending poll makes it flush) before cutting the chunked body.
                let timer = p.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(FLUSH_GRACE)));
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                p.finish();
                return Poll::Ready(Some(Err("engine failed mid-stream".into())));
            }
            PassState::Open => {}
        }
        match Pin::new(&mut p.upstream).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                p.timer = None;
                if let (Some(tap), Some(data)) = (p.tap.as_mut(), frame.data_ref()) {
                    tap.data(data);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => p.fail(ProxyError::new(Kind::Body, e)),
            Poll::Ready(None) => {
                if let Some(tap) = p.tap.as_mut() {
                    tap.end();
                }
                p.finish();
                Poll::Ready(None)
            }
            Poll::Pending => {
                let stall = p.stall;
                let timer = p.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
                if timer.as_mut().poll(cx).is_ready() {
                    return p.fail(ProxyError::new(Kind::Stall, format!("nothing for {} ms", stall.as_millis())));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Full(b) => b.is_none(),
            Body::Proxy(p) => p.state == PassState::Done,
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
