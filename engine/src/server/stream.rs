//! From generation events to a response, for any API: the events are read into answer
//! pieces (`answer.rs`) and an API's `Render` turns them into its frames (streams) or
//! its body (whole responses). One loop serves OpenAI chat and completions, Anthropic
//! Messages and OpenAI Responses alike, so cancellation, drain cuts, failures and the
//! end of a stream behave the same for all of them.

use bytes::Bytes;
use corral_net::gauge::Guard;
use corral_protocol::{ApiError, ApiShape, ErrorKind};
use http::{HeaderValue, Response, header};
use tokio::sync::mpsc;

use super::answer::{Answer, AnswerPiece, Reading};
use super::body::Body;
use super::respond::{error_response_in, json_response};
use crate::generate::{FinishReason, Outcome, TokenOut};
use crate::scheduler::worker::Event;

/// How one API writes an answer.
pub trait Render: Send + 'static {
    /// The error shape of this API.
    fn shape(&self) -> ApiShape;
    /// Frames before the first token.
    fn open(&mut self) -> Vec<Bytes>;
    /// Frames for answer pieces; `lp` is the token that released them, when it carries
    /// log probabilities.
    fn pieces(&mut self, pieces: Vec<AnswerPiece>, lp: Option<&TokenOut>) -> Vec<Bytes>;
    /// The last frames of a stream that ended normally.
    fn close(&mut self, o: &Outcome, made_calls: bool) -> Vec<Bytes>;
    /// The whole response body of a non-streaming request.
    fn whole(&mut self, text: &str, answer: Answer, o: &Outcome, lp_tokens: &[TokenOut]) -> String;
}

/// A request cut by a drain deadline or shutdown (a client that left sees nothing).
pub fn cut() -> ApiError {
    ApiError::new(ErrorKind::EngineDraining, "the request was cut short: the engine is stopping")
}

fn gone() -> ApiError {
    ApiError::new(ErrorKind::Internal, "the generation thread went away")
}

pub async fn whole(
    mut render: impl Render,
    mut rx: mpsc::UnboundedReceiver<Event>,
    reading: Reading,
) -> Response<Body> {
    let shape = render.shape();
    let mut text = String::new();
    let mut lp: Vec<TokenOut> = Vec::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Token(t) => {
                text.push_str(&t.text);
                if t.logprob.is_some() {
                    lp.push(t);
                }
            }
            Event::Flush(t) => text.push_str(&t),
            Event::Done(o) if o.finish == FinishReason::Cancelled => return error_response_in(&cut(), shape),
            Event::Done(o) => {
                let answer = reading.read(&text);
                return json_response(render.whole(&text, answer, &o, &lp));
            }
            Event::Failed(e) => return error_response_in(&ApiError::from(&e), shape),
        }
    }
    error_response_in(&gone(), shape)
}

pub fn streaming(
    mut render: impl Render,
    mut rx: mpsc::UnboundedReceiver<Event>,
    reading: Reading,
    work: Guard,
) -> Response<Body> {
    let (tx, body) = Body::channel(16);
    let shape = render.shape();
    tokio::spawn(async move {
        // The request counts as work until its last event is handed to the body.
        let _work = work;
        let mut answer = reading.stream();
        let mut send = render.open();
        loop {
            for frame in send.drain(..) {
                if tx.send(frame).await.is_err() {
                    return;
                }
            }
            // Waiting on both: a client that leaves during prefill closes `tx`, and
            // dropping `rx` then tells the generation thread to stop.
            let ev = tokio::select! {
                ev = rx.recv() => ev,
                _ = tx.closed() => return,
            };
            send = match ev {
                Some(Event::Token(t)) if t.text.is_empty() && t.logprob.is_none() => continue,
                Some(Event::Token(t)) => {
                    let pieces = answer.push(&t.text);
                    render.pieces(pieces, Some(&t).filter(|t| t.logprob.is_some()))
                }
                Some(Event::Flush(t)) => render.pieces(answer.push(&t), None),
                Some(Event::Done(o)) if o.finish == FinishReason::Cancelled => {
                    let _ = tx.send(Bytes::from(cut().sse_event(shape))).await;
                    return;
                }
                Some(Event::Done(o)) => {
                    let mut last = render.pieces(answer.finish(), None);
                    last.extend(render.close(&o, answer.calls() > 0));
                    for frame in last {
                        if tx.send(frame).await.is_err() {
                            return;
                        }
                    }
                    return;
                }
                Some(Event::Failed(e)) => {
                    let _ = tx.send(Bytes::from(ApiError::from(&e).sse_event(shape))).await;
                    return;
                }
                None => {
                    let _ = tx.send(Bytes::from(gone().sse_event(shape))).await;
                    return;
                }
            };
        }
    });
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

/// An SSE frame with an event name (Anthropic, Responses).
pub fn named_event(name: &str, data: &str) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}
