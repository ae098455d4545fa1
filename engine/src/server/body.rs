//! Response bodies: a whole buffer, or a stream of chunks fed by a task. The stream's
//! sender can wait for the client to go away (`closed()`), which is how a request
//! notices a disconnect even while nothing is being sent (during prefill). While a
//! stream is quiet (a long prefill) it sends an SSE comment every `HEARTBEAT`, so a
//! proxy's stall timer (the gateway's `--stall-timeout`) never mistakes work for a hang.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::mpsc;

pub enum Body {
    Full(Option<Bytes>),
    Stream(Box<Stream>),
}

pub struct Stream {
    rx: mpsc::Receiver<Bytes>,
    beat: Pin<Box<tokio::time::Sleep>>,
}

/// Quiet time after which a stream sends `: keep-alive`.
pub const HEARTBEAT: Duration = Duration::from_secs(10);

impl From<Bytes> for Body {
    fn from(b: Bytes) -> Self {
        Body::Full(Some(b))
    }
}

impl Body {
    /// A streaming body and the sender that feeds it (bounded: a slow client applies
    /// back-pressure all the way to the generation thread).
    pub fn channel(cap: usize) -> (mpsc::Sender<Bytes>, Self) {
        let (tx, rx) = mpsc::channel(cap);
        (tx, Body::Stream(Box::new(Stream { rx, beat: Box::pin(tokio::time::sleep(HEARTBEAT)) })))
    }
}

impl HttpBody for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Body::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Body::Stream(s) => match s.rx.poll_recv(cx) {
                Poll::Ready(item) => {
                    s.beat.as_mut().reset(tokio::time::Instant::now() + HEARTBEAT);
                    Poll::Ready(item.map(|b| Ok(Frame::data(b))))
                }
                Poll::Pending => {
                    if s.beat.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    s.beat.as_mut().reset(tokio::time::Instant::now() + HEARTBEAT);
                    Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b": keep-alive\n\n")))))
                }
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Body::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Body::Full(None) => SizeHint::with_exact(0),
            Body::Stream(_) => SizeHint::default(),
        }
    }
}
