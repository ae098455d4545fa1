//! Reading a harmony output back, incrementally: `analysis` messages are reasoning,
//! `final` (and a `commentary` message to no one, a preamble) are the answer, and a
//! message addressed to `functions.NAME` is a call of that tool whose body is its
//! arguments.
//!
//! `HarmonyStream` takes the output as it is released. A header is held until its
//! `<|message|>`; a body is released as it comes, less a tail that could be the start of
//! the marker that ends it. Under the grammar (`enforced`) a call's arguments stream as
//! generated; otherwise they are held until the message ends and must parse as a JSON
//! object, or the body is answer text. Text that never forms a header (a model that does
//! not write harmony) is answer text, never dropped.

use super::{CALL, CHANNEL, CONSTRAIN, END, FUNCTIONS, MESSAGE, RETURN, START};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Reasoning(String),
    Text(String),
    CallStart { index: usize, name: String },
    CallArgs { index: usize, fragment: String },
}

/// The longest header kept waiting for its `<|message|>`: past it, the output is not
/// harmony and is released as text.
const MAX_HEADER: usize = 256;

/// What ends a message body: its end, a call or return (if a tokenizer shows them), or a
/// new message started without an end.
const BODY_ENDS: [&str; 4] = [END, CALL, RETURN, START];

#[derive(Clone, Debug, PartialEq, Eq)]
enum Body {
    Reasoning,
    Text,
    /// A call whose arguments stream (the grammar fixed its layout).
    Call(usize),
    /// A call held whole until it ends (not enforced): the tool's name.
    Held(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Header,
    Body(Body),
    /// After a message's end, before the next `<|start|>`.
    Between,
    /// Not harmony: everything is text.
    Plain,
}

pub struct HarmonyStream {
    /// Calls are read out (the request offered tools).
    tools: bool,
    enforced: bool,
    state: State,
    held: String,
    calls: usize,
}

impl HarmonyStream {
    pub fn new(tools: bool, enforced: bool) -> Self {
        Self { tools, enforced, state: State::Header, held: String::new(), calls: 0 }
    }

    /// How many calls have started.
    pub fn calls(&self) -> usize {
        self.calls
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out, false) {}
        out
    }

    /// The end of the output: what is held is decided.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        while self.step(&mut out, true) {}
        out
    }

    /// One move of the state machine; `false` when it needs more text.
    fn step(&mut self, out: &mut Vec<Piece>, last: bool) -> bool {
        match self.state.clone() {
            State::Plain => {
                emit(out, Piece::Text(std::mem::take(&mut self.held)));
                false
            }
            State::Header => match self.held.find(MESSAGE) {
                Some(at) => {
                    let header: String = self.held.drain(..at + MESSAGE.len()).collect();
                    self.state = State::Body(self.open(&header[..at], out));
                    true
                }
                // Cut short inside a header: nothing of the message was written yet.
                None if last && (self.held.contains(CHANNEL) || self.held.trim_start().starts_with("to=")) => {
                    self.held.clear();
                    false
                }
                None if last || self.held.len() > MAX_HEADER => {
                    self.state = State::Plain;
                    true
                }
                None => false,
            },
            State::Between => match self.held.find(START) {
                Some(at) => {
                    self.held.drain(..at + START.len());
                    self.state = State::Header;
                    true
                }
                None => {
                    // Only a started `<|start|>` is worth keeping.
                    let keep = partial_suffix(&self.held, &[START]);
                    self.held.drain(..self.held.len() - keep);
                    false
                }
            },
            State::Body(body) => self.body(body, out, last),
        }
    }

    /// A header read: what its body is.
    fn open(&mut self, header: &str, out: &mut Vec<Piece>) -> Body {
        let h = Header::read(header);
        match h.recipient.as_deref().and_then(|r| r.strip_prefix(FUNCTIONS)) {
            Some(name) if self.tools && !name.is_empty() => {
                if self.enforced {
                    let index = self.calls;
                    self.calls += 1;
                    out.push(Piece::CallStart { index, name: name.to_owned() });
                    Body::Call(index)
                } else {
                    Body::Held(name.to_owned())
                }
            }
            _ if h.channel.as_deref() == Some("analysis") => Body::Reasoning,
            _ => Body::Text,
        }
    }

    fn body(&mut self, body: Body, out: &mut Vec<Piece>, last: bool) -> bool {
        let end = BODY_ENDS.iter().filter_map(|m| self.held.find(m).map(|at| (at, *m))).min();
        // After the end marker: a new header (a message started without an end) or the
        // gap before the next message.
        let next = |marker: &str| if marker == START { State::Header } else { State::Between };
        if let Body::Held(name) = body {
            let args = match end {
                Some((at, marker)) => {
                    let args: String = self.held.drain(..at).collect();
                    self.held.drain(..marker.len());
                    self.state = next(marker);
                    args
                }
                None if last => {
                    self.state = State::Between;
                    std::mem::take(&mut self.held)
                }
                None => return false,
            };
            self.held_call(name, args, out);
            return end.is_some();
        }
        let (ready, ended) = match end {
            Some((at, marker)) => {
                let text: String = self.held.drain(..at).collect();
                self.held.drain(..marker.len());
                self.state = next(marker);
                (text, true)
            }
            None if last => (std::mem::take(&mut self.held), false),
            None => {
                let keep = partial_suffix(&self.held, &BODY_ENDS);
                (self.held.drain(..self.held.len() - keep).collect(), false)
            }
        };
        match body {
            Body::Reasoning => emit(out, Piece::Reasoning(ready)),
            Body::Text => emit(out, Piece::Text(ready)),
            Body::Call(index) if !ready.is_empty() => out.push(Piece::CallArgs { index, fragment: ready }),
            Body::Call(_) | Body::Held(_) => {}
        }
        ended
    }

    /// A whole call that was not decoded under the grammar: a JSON object as arguments
    /// makes it a call; anything else is answer text.
    fn held_call(&mut self, name: String, args: String, out: &mut Vec<Piece>) {
        match serde_json::from_str::<serde_json::Value>(args.trim()) {
            Ok(v @ serde_json::Value::Object(_)) => {
                let index = self.calls;
                self.calls += 1;
                out.push(Piece::CallStart { index, name });
                out.push(Piece::CallArgs { index, fragment: v.to_string() });
            }
            _ => emit(out, Piece::Text(args)),
        }
    }
}

/// A message header: `ROLE to=RECIPIENT<|channel|>CHANNEL <|constrain|>TYPE`, in any of
/// the orders models write (the recipient may also follow the channel).
#[derive(Debug, Default, PartialEq, Eq)]
struct Header {
    channel: Option<String>,
    recipient: Option<String>,
}

impl Header {
    fn read(header: &str) -> Self {
        let mut h = Header::default();
        let spaced = header.replace(CHANNEL, " \u{0}channel ").replace(CONSTRAIN, " \u{0}constrain ");
        let mut words = spaced.split_whitespace();
        while let Some(w) = words.next() {
            if w == "\u{0}channel" {
                h.channel = words.next().map(str::to_owned);
            } else if let Some(r) = w.strip_prefix("to=") {
                h.recipient = Some(r.to_owned());
            }
        }
        h
    }
}

fn emit(out: &mut Vec<Piece>, p: Piece) {
    match (out.last_mut(), p) {
        (_, Piece::Reasoning(t) | Piece::Text(t)) if t.is_empty() => {}
        (Some(Piece::Reasoning(a)), Piece::Reasoning(b)) | (Some(Piece::Text(a)), Piece::Text(b)) => a.push_str(&b),
        (_, p) => out.push(p),
    }
}

/// The longest tail of `s` that is a proper prefix of one of `markers`.
fn partial_suffix(s: &str, markers: &[&str]) -> usize {
    markers
        .iter()
        .map(|m| {
            (1..m.len().min(s.len() + 1))
                .rev()
                .find(|&n| s.is_char_boundary(s.len() - n) && m.starts_with(&s[s.len() - n..]))
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
