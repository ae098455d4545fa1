//! A generated answer read as its parts, the same for every API: reasoning (split out
//! of `<think>…</think>` when the model reasons), answer text, and tool calls (when
//! the request offered tools). Each API renders these parts in its own shape; streams
//! render them as they come, whole responses render them collected, so the two never
//! disagree.

use crate::harmony::parse::{HarmonyStream, Piece as HarmonyPiece};
use crate::reasoning::{Part, ThinkSplit};
use crate::tools::ParsedCall;
use crate::tools::format::ToolFormat;
use crate::tools::stream::{Piece, ToolStream};

/// How to read a request's answer back.
#[derive(Clone, Debug, Default)]
pub struct Reading {
    /// Tool calls are to be read out of the output.
    pub tools: Option<ToolOutput>,
    /// The model reasons in `<think>` tags: `Some(true)` when the prompt already opened
    /// one, so the output starts as reasoning.
    pub think: Option<bool>,
    /// The output is harmony messages (gpt-oss): read by `crate::harmony::parse`, which
    /// finds reasoning and calls itself.
    pub harmony: bool,
}

/// How tool calls were written.
#[derive(Clone, Debug)]
pub struct ToolOutput {
    pub format: ToolFormat,
    /// Decoded under the grammar (exact layout).
    pub enforced: bool,
}

impl Reading {
    pub fn stream(&self) -> AnswerStream {
        if self.harmony {
            let (tools, enforced) = self.tools.as_ref().map_or((false, false), |t| (true, t.enforced));
            return AnswerStream { think: None, tools: None, harmony: Some(HarmonyStream::new(tools, enforced)) };
        }
        AnswerStream::new(
            self.think.map(ThinkSplit::new),
            self.tools.as_ref().map(|t| ToolStream::new(t.format.clone(), t.enforced)),
        )
    }

    /// A whole output read at once.
    pub fn read(&self, text: &str) -> Answer {
        let mut s = self.stream();
        let mut pieces = s.push(text);
        pieces.extend(s.finish());
        Answer::collect(pieces)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AnswerPiece {
    Reasoning(String),
    Text(String),
    CallStart { index: usize, name: String },
    CallArgs { index: usize, fragment: String },
}

pub struct AnswerStream {
    think: Option<ThinkSplit>,
    tools: Option<ToolStream>,
    harmony: Option<HarmonyStream>,
}

impl AnswerStream {
    pub fn new(think: Option<ThinkSplit>, tools: Option<ToolStream>) -> Self {
        Self { think, tools, harmony: None }
    }

    pub fn push(&mut self, text: &str) -> Vec<AnswerPiece> {
        if let Some(h) = self.harmony.as_mut() {
            return h.push(text).into_iter().map(from_harmony).collect();
        }
        let parts = match self.think.as_mut() {
            Some(t) => t.push(text),
            None => vec![Part::Answer(text.to_owned())],
        };
        self.route(parts, false)
    }

    pub fn finish(&mut self) -> Vec<AnswerPiece> {
        if let Some(h) = self.harmony.as_mut() {
            return h.finish().into_iter().map(from_harmony).collect();
        }
        let parts = self.think.as_mut().map(ThinkSplit::finish).unwrap_or_default();
        self.route(parts, true)
    }

    /// How many tool calls the answer has started.
    pub fn calls(&self) -> usize {
        match &self.harmony {
            Some(h) => h.calls(),
            None => self.tools.as_ref().map_or(0, ToolStream::calls),
        }
    }

    fn route(&mut self, parts: Vec<Part>, last: bool) -> Vec<AnswerPiece> {
        let mut out = Vec::new();
        for p in parts {
            match (p, self.tools.as_mut()) {
                (Part::Reasoning(t), _) => out.push(AnswerPiece::Reasoning(t)),
                (Part::Answer(t), Some(tools)) => out.extend(tools.push(&t).into_iter().map(from_tool)),
                (Part::Answer(t), None) => out.push(AnswerPiece::Text(t)),
            }
        }
        if last && let Some(tools) = self.tools.as_mut() {
            out.extend(tools.finish().into_iter().map(from_tool));
        }
        out.retain(|p| !matches!(p, AnswerPiece::Reasoning(t) | AnswerPiece::Text(t) if t.is_empty()));
        out
    }
}

fn from_tool(p: Piece) -> AnswerPiece {
    match p {
        Piece::Content(t) => AnswerPiece::Text(t),
        Piece::CallStart { index, name } => AnswerPiece::CallStart { index, name },
        Piece::CallArgs { index, fragment } => AnswerPiece::CallArgs { index, fragment },
    }
}

fn from_harmony(p: HarmonyPiece) -> AnswerPiece {
    match p {
        HarmonyPiece::Reasoning(t) => AnswerPiece::Reasoning(t),
        HarmonyPiece::Text(t) => AnswerPiece::Text(t),
        HarmonyPiece::CallStart { index, name } => AnswerPiece::CallStart { index, name },
        HarmonyPiece::CallArgs { index, fragment } => AnswerPiece::CallArgs { index, fragment },
    }
}

/// A whole answer, collected.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    pub reasoning: Option<String>,
    pub text: Option<String>,
    pub calls: Vec<ParsedCall>,
}

impl Answer {
    pub fn collect(pieces: impl IntoIterator<Item = AnswerPiece>) -> Self {
        let mut a = Answer::default();
        for p in pieces {
            match p {
                AnswerPiece::Reasoning(t) => a.reasoning.get_or_insert_default().push_str(&t),
                AnswerPiece::Text(t) => a.text.get_or_insert_default().push_str(&t),
                AnswerPiece::CallStart { name, .. } => a.calls.push(ParsedCall { name, arguments: String::new() }),
                AnswerPiece::CallArgs { index, fragment } => {
                    if let Some(c) = a.calls.get_mut(index) {
                        c.arguments.push_str(&fragment);
                    }
                }
            }
        }
        for c in &mut a.calls {
            if c.arguments.is_empty() {
                c.arguments = "{}".into();
            }
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_then_a_call() {
        let mut s =
            AnswerStream::new(Some(ThinkSplit::new(false)), Some(ToolStream::new(ToolFormat::fallback(), true)));
        let text =
            "<think>Need weather.</think>\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": 1}}\n</tool_call>";
        let mut pieces = Vec::new();
        for ch in text.chars() {
            pieces.extend(s.push(&ch.to_string()));
        }
        pieces.extend(s.finish());
        let a = Answer::collect(pieces);
        assert_eq!(a.reasoning.as_deref(), Some("Need weather."));
        assert_eq!(a.text, None);
        assert_eq!(a.calls, vec![ParsedCall { name: "w".into(), arguments: "{\"c\": 1}".into() }]);
        assert_eq!(s.calls(), 1);
    }

    #[test]
    fn harmony_output_reads_into_the_same_parts() {
        let tools = ToolOutput { format: ToolFormat::fallback(), enforced: true };
        let reading = Reading { tools: Some(tools), think: None, harmony: true };
        let a = reading.read("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.w <|constrain|>json<|message|>{\"c\": 1}");
        assert_eq!(a.reasoning.as_deref(), Some("Need weather."));
        assert_eq!((a.text, a.calls), (None, vec![ParsedCall { name: "w".into(), arguments: "{\"c\": 1}".into() }]));
        let a = Reading { harmony: true, ..Reading::default() }.read("<|channel|>final<|message|>Hi");
        assert_eq!(a, Answer { reasoning: None, text: Some("Hi".into()), calls: vec![] });
    }

    #[test]
    fn plain_text_passes_through() {
        let mut s = AnswerStream::new(None, None);
        let mut p = s.push("Hello");
        p.extend(s.finish());
        assert_eq!(Answer::collect(p), Answer { reasoning: None, text: Some("Hello".into()), calls: vec![] });
    }
}
