//! Reading tool calls out of generated text, incrementally.
//!
//! `ToolStream` takes the output as it is released and yields content, the start of
//! each call (its name) and pieces of its arguments. Streams forward these as they
//! come; a whole response is the same pieces collected (`parse`), so the two never
//! disagree.
//!
//! When the call was decoded under the grammar (`enforced`), its layout is exact, so
//! arguments stream as they are generated, holding back only what could be the call's
//! closing text. Without the grammar (the degrade path) a call is buffered until it is
//! complete and then parsed leniently; text that does not parse as a call is content,
//! never dropped.

use serde_json::Value;

use super::ParsedCall;
use super::format::{HERMES_CLOSE, HERMES_OPEN, Syntax, ToolFormat};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Content(String),
    /// A new call: its index among this answer's calls and the tool's name.
    CallStart {
        index: usize,
        name: String,
    },
    /// More of a call's arguments (JSON text; the fragments concatenate).
    CallArgs {
        index: usize,
        fragment: String,
    },
}

enum State {
    /// Nothing but whitespace yet (held back): the first real character decides,
    /// for the syntaxes whose calls are the whole answer.
    Start,
    Text,
    /// Inside a call (Hermes: after the opener; Llama 3 / Mistral: the answer is JSON).
    Call {
        streaming: Option<usize>,
    },
}

pub struct ToolStream {
    fmt: ToolFormat,
    enforced: bool,
    state: State,
    /// Text not yet decided on.
    held: String,
    calls: usize,
    /// A call has ended and nothing but whitespace has been released since: whitespace
    /// here may be the separator before another call.
    after_call: bool,
    /// Arguments of the call being streamed, as sent so far.
    sent_args: String,
}

impl ToolStream {
    pub fn new(fmt: ToolFormat, enforced: bool) -> Self {
        let state = match fmt.syntax {
            // Harmony output is read by `crate::harmony::parse`, never here.
            Syntax::Hermes | Syntax::Harmony => State::Text,
            Syntax::Llama3 | Syntax::Mistral => State::Start,
        };
        Self { fmt, enforced, state, held: String::new(), calls: 0, after_call: false, sent_args: String::new() }
    }

    /// How many calls have started.
    pub fn calls(&self) -> usize {
        self.calls
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        self.advance(&mut out, false);
        out
    }

    /// The end of the output: everything still held is decided.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        self.advance(&mut out, true);
        out
    }

    fn advance(&mut self, out: &mut Vec<Piece>, last: bool) {
        loop {
            let progressed = match self.state {
                State::Start => self.start(out, last),
                State::Text => self.text(out, last),
                State::Call { streaming } => self.call(out, streaming, last),
            };
            if !progressed {
                return;
            }
        }
    }

    fn start(&mut self, out: &mut Vec<Piece>, last: bool) -> bool {
        let opener = if self.fmt.syntax == Syntax::Llama3 { '{' } else { '[' };
        match self.held.trim_start().chars().next() {
            Some(c) if c == opener => {
                self.held = self.held.trim_start().to_owned();
                self.state = State::Call { streaming: None };
                true
            }
            Some(_) => {
                self.state = State::Text;
                true
            }
            None if last => {
                emit_content(out, std::mem::take(&mut self.held));
                false
            }
            None => false,
        }
    }

    fn text(&mut self, out: &mut Vec<Piece>, last: bool) -> bool {
        if self.fmt.syntax != Syntax::Hermes {
            emit_content(out, std::mem::take(&mut self.held));
            return false;
        }
        if let Some(at) = self.held.find(HERMES_OPEN) {
            let before: String = self.held.drain(..at + HERMES_OPEN.len()).collect();
            self.content_between_calls(out, &before[..at], true);
            self.state = State::Call { streaming: None };
            return true;
        }
        // Hold back a tail that could be the start of the opener. At the end, a
        // started opener after grammar-decoded calls is a call cut short, not content.
        if last
            && self.enforced
            && self.after_call
            && partial_suffix(self.held.trim(), HERMES_OPEN) == self.held.trim().len()
        {
            self.held.clear();
        }
        let keep = if last { 0 } else { partial_suffix(&self.held, HERMES_OPEN) };
        let ready: String = self.held.drain(..self.held.len() - keep).collect();
        self.content_between_calls(out, &ready, last);
        false
    }

    /// Content; right after a call, whitespace alone (the separator between calls) is
    /// not. Whitespace after content is content, however the text was split.
    fn content_between_calls(&mut self, out: &mut Vec<Piece>, text: &str, decided: bool) {
        if self.after_call && text.trim().is_empty() {
            if !decided {
                // Might still be followed by real text: keep it in front of `held`.
                self.held.insert_str(0, text);
            }
            return;
        }
        self.after_call &= text.is_empty();
        emit_content(out, text.to_owned());
    }

    /// The text that ends a call: Hermes' closer, the object's brace, the array's bracket.
    fn closer(&self) -> String {
        match self.fmt.syntax {
            Syntax::Hermes | Syntax::Harmony => format!("}}\n{HERMES_CLOSE}"),
            Syntax::Llama3 => "}".into(),
            Syntax::Mistral => "}]".into(),
        }
    }

    fn call(&mut self, out: &mut Vec<Piece>, streaming: Option<usize>, last: bool) -> bool {
        let closer = self.closer();
        match streaming {
            None if self.enforced && self.fmt.syntax != Syntax::Mistral => {
                // The exact layout: `\n{"name": "f", "arguments": ` (Hermes) or
                // `{"name": "f", "parameters": ` (Llama 3), then the arguments.
                let body = self.held.strip_prefix('\n').unwrap_or(&self.held);
                let Some((name, head_len)) = self.head(body) else {
                    if !last && self.head_pending(body) {
                        // Not all there yet (the name may even hold a closer).
                        return false;
                    }
                    return self.unparsed_call(out, last);
                };
                let skip = self.held.len() - body.len() + head_len;
                self.held.drain(..skip);
                let index = self.calls;
                self.calls += 1;
                self.after_call = true;
                out.push(Piece::CallStart { index, name });
                self.sent_args.clear();
                self.state = State::Call { streaming: Some(index) };
                true
            }
            None => self.unparsed_call(out, last),
            Some(index) => {
                // Hermes: the block's closer ends the arguments. Llama 3: the answer's
                // last `}` does, so a `}` is held back until more text follows it.
                if self.fmt.syntax == Syntax::Hermes
                    && let Some(at) = self.held.find(&closer)
                {
                    let rest: String = self.held.drain(..at + closer.len()).collect();
                    emit_args(out, index, &rest[..at]);
                    self.state = State::Text;
                    return true;
                }
                if last {
                    // Cut short (or Llama 3's end): the arguments end with the JSON
                    // value they start with, when it is complete.
                    let held = std::mem::take(&mut self.held);
                    let whole = format!("{}{held}", self.sent_args);
                    let end = json_prefix_len(&whole).map_or(held.len(), |n| n.saturating_sub(self.sent_args.len()));
                    self.send_args(out, index, &held[..end.min(held.len())]);
                    self.state = State::Text;
                    return false;
                }
                let keep = partial_suffix(&self.held, &closer);
                let ready: String = self.held.drain(..self.held.len() - keep).collect();
                self.send_args(out, index, &ready);
                false
            }
        }
    }

    fn send_args(&mut self, out: &mut Vec<Piece>, index: usize, fragment: &str) {
        self.sent_args.push_str(fragment);
        emit_args(out, index, fragment);
    }

    /// `"name": "f", "<arguments key>": ` at the start of `body` (after `{`): the name
    /// and the length of that head, once it is all there.
    fn head(&self, body: &str) -> Option<(String, usize)> {
        let prefix = "{\"name\": \"";
        let rest = body.strip_prefix(prefix)?;
        let end = rest.find('"')?;
        let name = rest[..end].to_owned();
        let head = self.fmt.call_head(&name);
        body.starts_with(&head).then_some((name, head.len()))
    }

    /// Whether `body` could still grow into the exact head (`head` found none yet): a
    /// prefix of `{"name": "`, a name not closed yet, or a prefix of that name's head.
    fn head_pending(&self, body: &str) -> bool {
        let prefix = "{\"name\": \"";
        match body.strip_prefix(prefix) {
            None => prefix.starts_with(body),
            Some(rest) => rest.find('"').is_none_or(|end| self.fmt.call_head(&rest[..end]).starts_with(body)),
        }
    }

    /// A call that is not (yet) in the exact layout: wait for its end, then parse it
    /// leniently; what does not parse is content.
    fn unparsed_call(&mut self, out: &mut Vec<Piece>, last: bool) -> bool {
        let (raw, rest) = match self.fmt.syntax {
            Syntax::Hermes | Syntax::Harmony => match self.held.find(HERMES_CLOSE) {
                Some(at) => (self.held[..at].to_owned(), self.held[at + HERMES_CLOSE.len()..].to_owned()),
                None if last => (std::mem::take(&mut self.held), String::new()),
                None => return false,
            },
            // The whole answer is the call(s).
            Syntax::Llama3 | Syntax::Mistral if last => (std::mem::take(&mut self.held), String::new()),
            Syntax::Llama3 | Syntax::Mistral => return false,
        };
        match lenient_calls(&self.fmt, &raw) {
            Some(calls) => {
                for c in calls {
                    let index = self.calls;
                    self.calls += 1;
                    self.after_call = true;
                    out.push(Piece::CallStart { index, name: c.name });
                    emit_args(out, index, &c.arguments);
                }
            }
            None => {
                let text = match self.fmt.syntax {
                    Syntax::Hermes if rest.is_empty() && last && !raw.contains(HERMES_CLOSE) => {
                        format!("{HERMES_OPEN}{raw}")
                    }
                    Syntax::Hermes | Syntax::Harmony => format!("{HERMES_OPEN}{raw}{HERMES_CLOSE}"),
                    _ => raw,
                };
                self.after_call = false;
                emit_content(out, text);
            }
        }
        self.held = rest;
        self.state = State::Text;
        true
    }
}

/// Calls in the JSON of one Hermes block or of a whole Llama 3 / Mistral answer.
fn lenient_calls(fmt: &ToolFormat, raw: &str) -> Option<Vec<ParsedCall>> {
    let v: Value = serde_json::from_str(raw.trim()).ok()?;
    let objects = match v {
        Value::Array(items) if fmt.syntax == Syntax::Mistral => items,
        v @ Value::Object(_) => vec![v],
        _ => return None,
    };
    objects
        .into_iter()
        .map(|o| {
            let name = o.get("name")?.as_str()?.to_owned();
            let args = o
                .get("arguments")
                .or_else(|| o.get("parameters"))
                .cloned()
                .unwrap_or(Value::Object(Default::default()));
            // Some models write the arguments as a JSON string.
            let args = match args {
                Value::String(s) => serde_json::from_str::<Value>(&s).ok().filter(Value::is_object)?,
                Value::Object(_) => args,
                _ => return None,
            };
            Some(ParsedCall { name, arguments: args.to_string() })
        })
        .collect()
}

/// The length of the complete JSON value at the start of `s`, if there is one.
fn json_prefix_len(s: &str) -> Option<usize> {
    let mut values = serde_json::Deserializer::from_str(s).into_iter::<serde::de::IgnoredAny>();
    match values.next() {
        Some(Ok(_)) => Some(values.byte_offset()),
        _ => None,
    }
}

fn emit_content(out: &mut Vec<Piece>, text: String) {
    if text.is_empty() {
        return;
    }
    match out.last_mut() {
        Some(Piece::Content(c)) => c.push_str(&text),
        _ => out.push(Piece::Content(text)),
    }
}

fn emit_args(out: &mut Vec<Piece>, index: usize, fragment: &str) {
    if !fragment.is_empty() {
        out.push(Piece::CallArgs { index, fragment: fragment.to_owned() });
    }
}

/// The length of the longest tail of `s` that is a proper prefix of `pat` (for a
/// one-character `pat`, the character itself).
fn partial_suffix(s: &str, pat: &str) -> usize {
    let longest = if pat.len() == 1 { 1 } else { pat.len() - 1 };
    (1..=longest.min(s.len()))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && pat.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

/// A whole output: its content (None when there is none) and its calls.
pub fn parse(fmt: &ToolFormat, enforced: bool, text: &str) -> (Option<String>, Vec<ParsedCall>) {
    let mut s = ToolStream::new(fmt.clone(), enforced);
    let mut pieces = s.push(text);
    pieces.extend(s.finish());
    collect(pieces)
}

/// Pieces back into content and calls.
pub fn collect(pieces: Vec<Piece>) -> (Option<String>, Vec<ParsedCall>) {
    let mut content = String::new();
    let mut calls: Vec<ParsedCall> = Vec::new();
    for p in pieces {
        match p {
            Piece::Content(t) => content.push_str(&t),
            Piece::CallStart { name, .. } => calls.push(ParsedCall { name, arguments: String::new() }),
            Piece::CallArgs { index, fragment } => {
                if let Some(c) = calls.get_mut(index) {
                    c.arguments.push_str(&fragment);
                }
            }
        }
    }
    for c in &mut calls {
        if c.arguments.is_empty() {
            c.arguments = "{}".into();
        }
    }
    ((!content.is_empty()).then_some(content), calls)
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
