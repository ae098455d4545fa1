//! OpenAI chat completions and completions (`POST /v1/chat/completions`,
//! `/v1/completions`) built from generation events: the JSON bodies of non-streaming
//! requests and the SSE chunks of streaming ones (`OpenAiRender`). The Responses API is
//! `responses_api.rs`, Anthropic Messages `anthropic.rs`.

use std::collections::HashMap;

use bytes::Bytes;
use corral_protocol::openai::{
    AssistantMessage, ChatChoice, ChatCompletion, ChatCompletionChunk, ChoiceLogprobs, ChunkChoice, Completion,
    CompletionChoice, CompletionLogprobs, Delta, FunctionCall, FunctionCallDelta, TokenLogprob, ToolCall,
    ToolCallDelta, TopLogprob, Usage,
};
use serde::Serialize;

use super::answer::Answer;
use super::respond::{new_id, unix_now};
use crate::generate::{FinishReason, Outcome, TokenOut};
use crate::tokenizer::Tokenizer;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Chat,
    Completion,
}

/// Identity of one response: every chunk of a stream repeats it.
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub route: Route,
}

impl Meta {
    pub fn new(route: Route, model: &str) -> Self {
        let prefix = match route {
            Route::Chat => "chatcmpl",
            Route::Completion => "cmpl",
        };
        let id = format!("{prefix}-{:016x}{:08x}", rand::random::<u64>(), rand::random::<u32>());
        Self { id, created: unix_now(), model: model.to_owned(), route }
    }
}

pub fn usage(o: &Outcome) -> Usage {
    Usage {
        lane: Some(o.lane().into()),
        speculation: speculation(o),
        ..Usage::new(o.prompt_tokens, o.completion_tokens(), o.cached_tokens)
    }
}

/// `usage.speculation` (every API shape's), when the request speculated.
pub fn speculation(o: &Outcome) -> Option<corral_protocol::openai::Speculation> {
    o.speculation.map(|c| corral_protocol::openai::Speculation { drafted: c.drafted, accepted: c.accepted })
}

/// `stop` / `length` / `tool_calls` (a cancelled request has no client to tell).
pub fn finish_str(o: &Outcome, made_calls: bool) -> String {
    match o.finish {
        FinishReason::Length => "length",
        FinishReason::Stop if made_calls => "tool_calls",
        FinishReason::Stop | FinishReason::Cancelled => "stop",
    }
    .to_owned()
}

/// The first streamed delta of a call: its id, type and name.
pub fn call_start(index: usize, name: &str) -> ToolCallDelta {
    ToolCallDelta {
        index,
        id: Some(new_id("call")),
        kind: Some("function".into()),
        function: FunctionCallDelta { name: Some(name.to_owned()), arguments: Some(String::new()) },
    }
}

/// A later delta of a call: more of its arguments.
pub fn call_args(index: usize, fragment: &str) -> ToolCallDelta {
    ToolCallDelta {
        index,
        id: None,
        kind: None,
        function: FunctionCallDelta { name: None, arguments: Some(fragment.to_owned()) },
    }
}

fn piece(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let b = tok.piece(id).to_vec();
    (String::from_utf8_lossy(&b).into_owned(), b)
}

pub fn chat_logprobs(tok: &Tokenizer, toks: &[TokenOut]) -> Option<ChoiceLogprobs> {
    if toks.first().is_none_or(|t| t.logprob.is_none()) {
        return None;
    }
    let content = toks
        .iter()
        .map(|t| {
            let (token, bytes) = piece(tok, t.id);
            let top_logprobs = t
                .top
                .iter()
                .map(|&(id, lp)| {
                    let (token, bytes) = piece(tok, id);
                    TopLogprob { token, logprob: lp, bytes }
                })
                .collect();
            TokenLogprob { token, logprob: t.logprob.unwrap_or(f32::NEG_INFINITY), bytes, top_logprobs }
        })
        .collect();
    Some(ChoiceLogprobs { content })
}

pub fn completion_logprobs(tok: &Tokenizer, toks: &[TokenOut], offset0: usize) -> Option<CompletionLogprobs> {
    if toks.first().is_none_or(|t| t.logprob.is_none()) {
        return None;
    }
    let mut out =
        CompletionLogprobs { tokens: vec![], token_logprobs: vec![], top_logprobs: vec![], text_offset: vec![] };
    let mut offset = offset0;
    for t in toks {
        let (s, b) = piece(tok, t.id);
        out.tokens.push(s);
        out.token_logprobs.push(t.logprob.unwrap_or(f32::NEG_INFINITY));
        out.top_logprobs.push(t.top.iter().map(|&(id, lp)| (piece(tok, id).0, lp)).collect::<HashMap<_, _>>());
        out.text_offset.push(offset);
        offset += b.len();
    }
    Some(out)
}

/// The whole non-streaming response: for chat, the answer read back (reasoning, text,
/// tool calls); for completions, the text as generated.
pub fn final_body(
    meta: &Meta,
    text: String,
    answer: Answer,
    o: &Outcome,
    lp_tokens: &[TokenOut],
    tok: &Tokenizer,
) -> String {
    match meta.route {
        Route::Chat => {
            let tool_calls: Vec<ToolCall> = answer
                .calls
                .into_iter()
                .map(|c| ToolCall {
                    id: new_id("call"),
                    kind: "function".into(),
                    function: FunctionCall { name: c.name, arguments: c.arguments },
                })
                .collect();
            let made_calls = !tool_calls.is_empty();
            json(&ChatCompletion {
                id: meta.id.clone(),
                object: "chat.completion".into(),
                created: meta.created,
                model: meta.model.clone(),
                choices: vec![ChatChoice {
                    index: 0,
                    message: AssistantMessage {
                        role: "assistant".into(),
                        content: if made_calls { answer.text } else { Some(answer.text.unwrap_or_default()) },
                        reasoning_content: answer.reasoning,
                        tool_calls: made_calls.then_some(tool_calls),
                    },
                    finish_reason: finish_str(o, made_calls),
                    logprobs: chat_logprobs(tok, lp_tokens),
                }],
                usage: usage(o),
            })
        }
        Route::Completion => json(&Completion {
            id: meta.id.clone(),
            object: "text_completion".into(),
            created: meta.created,
            model: meta.model.clone(),
            choices: vec![CompletionChoice {
                index: 0,
                text,
                finish_reason: Some(finish_str(o, false)),
                logprobs: completion_logprobs(tok, lp_tokens, 0),
            }],
            usage: Some(usage(o)),
        }),
    }
}

/// One SSE event carrying a content delta (and optionally this token's logprobs), the
/// final `finish_reason`, or the usage.
pub enum ChunkKind<'a> {
    Role,
    Text { text: &'a str, lp: Option<&'a TokenOut>, offset: usize },
    Reasoning(&'a str),
    Call(ToolCallDelta),
    Finish(String),
    Usage(Usage),
}

pub fn chunk(meta: &Meta, kind: ChunkKind<'_>, tok: &Tokenizer) -> Bytes {
    let body = match meta.route {
        Route::Chat => {
            let (choices, usage) = match kind {
                ChunkKind::Role => (
                    vec![ChunkChoice {
                        index: 0,
                        delta: Delta {
                            role: Some("assistant".into()),
                            content: Some(String::new()),
                            ..Delta::default()
                        },
                        finish_reason: None,
                        logprobs: None,
                    }],
                    None,
                ),
                ChunkKind::Text { text, lp, .. } => (
                    vec![ChunkChoice {
                        index: 0,
                        delta: Delta { content: Some(text.to_owned()), ..Delta::default() },
                        finish_reason: None,
                        logprobs: lp.and_then(|t| chat_logprobs(tok, std::slice::from_ref(t))),
                    }],
                    None,
                ),
                ChunkKind::Reasoning(text) => (
                    vec![ChunkChoice {
                        index: 0,
                        delta: Delta { reasoning_content: Some(text.to_owned()), ..Delta::default() },
                        finish_reason: None,
                        logprobs: None,
                    }],
                    None,
                ),
                ChunkKind::Call(d) => (
                    vec![ChunkChoice {
                        index: 0,
                        delta: Delta { tool_calls: Some(vec![d]), ..Delta::default() },
                        finish_reason: None,
                        logprobs: None,
                    }],
                    None,
                ),
                ChunkKind::Finish(f) => (
                    vec![ChunkChoice { index: 0, delta: Delta::default(), finish_reason: Some(f), logprobs: None }],
                    None,
                ),
                ChunkKind::Usage(u) => (vec![], Some(u)),
            };
            json(&ChatCompletionChunk {
                id: meta.id.clone(),
                object: "chat.completion.chunk".into(),
                created: meta.created,
                model: meta.model.clone(),
                choices,
                usage,
            })
        }
        Route::Completion => {
            let (choices, usage) = match kind {
                ChunkKind::Role | ChunkKind::Call(_) | ChunkKind::Reasoning(_) => (vec![], None),
                ChunkKind::Text { text, lp, offset } => (
                    vec![CompletionChoice {
                        index: 0,
                        text: text.to_owned(),
                        finish_reason: None,
                        logprobs: lp.and_then(|t| completion_logprobs(tok, std::slice::from_ref(t), offset)),
                    }],
                    None,
                ),
                ChunkKind::Finish(f) => (
                    vec![CompletionChoice { index: 0, text: String::new(), finish_reason: Some(f), logprobs: None }],
                    None,
                ),
                ChunkKind::Usage(u) => (vec![], Some(u)),
            };
            json(&Completion {
                id: meta.id.clone(),
                object: "text_completion".into(),
                created: meta.created,
                model: meta.model.clone(),
                choices,
                usage,
            })
        }
    };
    sse(&body)
}

pub fn sse(data: &str) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

pub fn sse_done() -> Bytes {
    Bytes::from_static(b"data: [DONE]\n\n")
}

fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|e| format!(r#"{{"error":{{"message":"serialization failed: {e}"}}}}"#))
}

/// Chat completions and completions, as `stream::Render`.
pub struct OpenAiRender {
    pub meta: Meta,
    pub engine: std::sync::Arc<crate::Engine>,
    pub include_usage: bool,
    /// Completions: byte offset of the next text in the output (for logprobs).
    offset: usize,
}

impl OpenAiRender {
    pub fn new(meta: Meta, engine: std::sync::Arc<crate::Engine>, include_usage: bool) -> Self {
        Self { meta, engine, include_usage, offset: 0 }
    }
}

impl super::stream::Render for OpenAiRender {
    fn shape(&self) -> corral_protocol::ApiShape {
        corral_protocol::ApiShape::OpenAi
    }

    fn open(&mut self) -> Vec<Bytes> {
        match self.meta.route {
            Route::Chat => vec![chunk(&self.meta, ChunkKind::Role, &self.engine.tokenizer)],
            Route::Completion => Vec::new(),
        }
    }

    /// A token's logprobs ride on its first text chunk, or on an empty one when the
    /// token released no text yet.
    fn pieces(&mut self, pieces: Vec<super::answer::AnswerPiece>, lp: Option<&TokenOut>) -> Vec<Bytes> {
        use super::answer::AnswerPiece;
        let tok = &self.engine.tokenizer;
        let mut lp = lp;
        let mut frames = Vec::with_capacity(pieces.len() + 1);
        for p in &pieces {
            frames.push(match p {
                AnswerPiece::Text(text) => {
                    let c = chunk(&self.meta, ChunkKind::Text { text, lp: lp.take(), offset: self.offset }, tok);
                    self.offset += text.len();
                    c
                }
                AnswerPiece::Reasoning(text) => chunk(&self.meta, ChunkKind::Reasoning(text), tok),
                AnswerPiece::CallStart { index, name } => {
                    chunk(&self.meta, ChunkKind::Call(call_start(*index, name)), tok)
                }
                AnswerPiece::CallArgs { index, fragment } => {
                    chunk(&self.meta, ChunkKind::Call(call_args(*index, fragment)), tok)
                }
            });
        }
        if let Some(t) = lp {
            frames.push(chunk(&self.meta, ChunkKind::Text { text: "", lp: Some(t), offset: self.offset }, tok));
        }
        frames
    }

    fn close(&mut self, o: &Outcome, made_calls: bool) -> Vec<Bytes> {
        let tok = &self.engine.tokenizer;
        let mut frames = vec![chunk(&self.meta, ChunkKind::Finish(finish_str(o, made_calls)), tok)];
        if self.include_usage {
            frames.push(chunk(&self.meta, ChunkKind::Usage(usage(o)), tok));
        }
        frames.push(sse_done());
        frames
    }

    fn whole(&mut self, text: &str, answer: Answer, o: &Outcome, lp_tokens: &[TokenOut]) -> String {
        final_body(&self.meta, text.to_owned(), answer, o, lp_tokens, &self.engine.tokenizer)
    }
}
