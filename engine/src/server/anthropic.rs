//! Anthropic Messages (`POST /v1/messages`, `/v1/messages/count_tokens`): the request
//! read into the common `ChatInput`, and the answer written as a message with content
//! blocks, or as Anthropic's event stream. Errors use Anthropic's shape.

use bytes::Bytes;
use corral_protocol::anthropic::{
    BlockDelta, ContentBlock, DeltaUsage, Message, MessageDelta, MessageParam, MessagesRequest, StreamEvent, Usage,
};
use corral_protocol::openai::{SamplingFields, StopSpec};
use corral_protocol::{ApiError, ApiShape, bounds};
use serde_json::Value;

use super::answer::{Answer, AnswerPiece};
use super::conversation::Turn;
use super::input::ChatInput;
use super::respond::new_id;
use super::stream::{Render, named_event};
use super::structured::{ToolSpec, tool_set};
use crate::generate::{FinishReason, Outcome, TokenOut};
use crate::reasoning::Effort;
use crate::tools::{ParsedCall, ToolMode};

pub fn input(req: &MessagesRequest) -> Result<ChatInput, ApiError> {
    let max_tokens = req.max_tokens.ok_or_else(|| ApiError::invalid("max_tokens", "max_tokens is required"))?;
    let messages = req.messages.as_ref().ok_or_else(|| ApiError::invalid("messages", "messages is required"))?;
    let mut turns = Vec::new();
    if let Some(system) = &req.system {
        let text = text_blocks("system", system)?;
        if !text.is_empty() {
            turns.push(turn("system", text));
        }
    }
    for (i, m) in messages.iter().enumerate() {
        message(i, m, &mut turns)?;
    }
    // Checked under its own name here (the sampling check would call it stop), with the
    // message the gateway gives.
    if let Some(stops) = &req.stop_sequences {
        bounds::stops("stop_sequences", stops)?;
    }
    let mut warnings = Vec::new();
    let effort = match req.thinking.as_ref().map(|t| t.get("type").and_then(Value::as_str)) {
        None => None,
        Some(Some("enabled")) => {
            let budget = req.thinking.as_ref().and_then(|t| t.get("budget_tokens"));
            if budget.is_some() {
                warnings.push(
                    "thinking budget not enforced: budget_tokens is accepted, max_tokens bounds the whole answer"
                        .into(),
                );
            }
            Some(budget_effort(budget.and_then(Value::as_u64)))
        }
        Some(Some("disabled")) => Some(Effort::None),
        _ => return Err(ApiError::invalid("thinking.type", "thinking.type must be \"enabled\" or \"disabled\"")),
    };
    let sampling = SamplingFields {
        max_tokens: Some(max_tokens),
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        stop: req.stop_sequences.clone().map(StopSpec::Many),
        stream: req.stream,
        stream_options: None,
        speculate: req.speculate.clone(),
        ..SamplingFields::default()
    };
    Ok(ChatInput {
        turns,
        tools: tools(req)?,
        constraint: None,
        sampling,
        logprobs: None,
        template_kwargs: req.chat_template_kwargs.clone().unwrap_or_default(),
        effort,
        effort_field: "thinking.type",
        warnings,
    })
}

/// The effort a thinking budget stands for (models with reasoning levels, such as
/// gpt-oss's "Reasoning: low|medium|high"): up to 4,096 tokens low, up to 16,384 medium,
/// more high; no budget medium.
fn budget_effort(budget: Option<u64>) -> Effort {
    match budget {
        Some(b) if b <= 4096 => Effort::Low,
        Some(b) if b > 16_384 => Effort::High,
        _ => Effort::Medium,
    }
}

fn turn(role: &'static str, text: String) -> Turn {
    Turn { role, text, calls: Vec::new(), tool_call_id: None, reasoning: None }
}

/// A string, or text blocks joined.
fn text_blocks(param: &str, v: &Value) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = String::new();
            for (j, b) in blocks.iter().enumerate() {
                match (b.get("type").and_then(Value::as_str), b.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    (kind, _) => return Err(unsupported_block(&format!("{param}[{j}]"), kind)),
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::invalid(param, format!("{param} must be a string or a list of text blocks"))),
    }
}

fn unsupported_block(param: &str, kind: Option<&str>) -> ApiError {
    match kind {
        Some("image" | "document") => ApiError::invalid(
            &format!("{param}.type"),
            format!("{} blocks are not supported: this server has no vision models yet", kind.unwrap_or_default()),
        ),
        other => {
            ApiError::invalid(&format!("{param}.type"), format!("content block type {other:?} is not supported here"))
        }
    }
}

/// One message: user text and tool results, assistant text and tool uses.
fn message(i: usize, m: &MessageParam, turns: &mut Vec<Turn>) -> Result<(), ApiError> {
    let at = format!("messages[{i}]");
    let role = match m.role.as_str() {
        "user" => "user",
        "assistant" => "assistant",
        other => {
            return Err(ApiError::invalid(
                &format!("{at}.role"),
                format!("role must be user or assistant (got {other:?})"),
            ));
        }
    };
    let blocks = match &m.content {
        Value::String(s) => {
            turns.push(turn(role, s.clone()));
            return Ok(());
        }
        Value::Array(b) => b,
        _ => return Err(ApiError::invalid(&format!("{at}.content"), "content must be a string or a list of blocks")),
    };
    let mut current = turn(role, String::new());
    for (j, b) in blocks.iter().enumerate() {
        let bat = format!("{at}.content[{j}]");
        match (role, b.get("type").and_then(Value::as_str)) {
            (_, Some("text")) => current.text.push_str(b.get("text").and_then(Value::as_str).unwrap_or_default()),
            ("assistant", Some("tool_use")) => {
                let name = b
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::invalid(&format!("{bat}.name"), "tool_use needs a name"))?;
                let input = b.get("input").cloned().unwrap_or(Value::Object(Default::default()));
                let id = b.get("id").and_then(Value::as_str).map(str::to_owned);
                current.calls.push((id, ParsedCall { name: name.to_owned(), arguments: input.to_string() }));
            }
            ("assistant", Some("thinking")) => {
                let t = b.get("thinking").and_then(Value::as_str).unwrap_or_default();
                current.reasoning.get_or_insert_default().push_str(t);
            }
            ("assistant", Some("redacted_thinking")) => {}
            ("user", Some("tool_result")) => {
                let id = b.get("tool_use_id").and_then(Value::as_str).map(str::to_owned);
                let mut text = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => text_blocks(&format!("{bat}.content"), c)?,
                };
                if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                    text = format!("Error: {text}");
                }
                if !current.text.is_empty() {
                    turns.push(std::mem::replace(&mut current, turn(role, String::new())));
                }
                turns.push(Turn { role: "tool", text, calls: Vec::new(), tool_call_id: id, reasoning: None });
            }
            (_, kind) => return Err(unsupported_block(&bat, kind)),
        }
    }
    if !current.text.is_empty() || !current.calls.is_empty() {
        turns.push(current);
    }
    Ok(())
}

fn tools(req: &MessagesRequest) -> Result<Option<crate::tools::ToolRequest>, ApiError> {
    let list = req.tools.as_deref().unwrap_or_default();
    let choice = req.tool_choice.as_ref();
    let kind = choice.and_then(|c| c.get("type")).and_then(Value::as_str);
    let mode = match kind {
        None | Some("auto") => (!list.is_empty()).then_some(ToolMode::Auto),
        Some("none") => None,
        Some("any") => Some(ToolMode::Required),
        Some("tool") => {
            let name = choice.and_then(|c| c.get("name")).and_then(Value::as_str);
            Some(ToolMode::Named(
                name.ok_or_else(|| ApiError::invalid("tool_choice.name", "tool_choice of type tool needs a name"))?
                    .to_owned(),
            ))
        }
        Some(other) => {
            return Err(ApiError::invalid(
                "tool_choice.type",
                format!("tool_choice.type must be auto, any, tool or none (got {other:?})"),
            ));
        }
    };
    let specs = list
        .iter()
        .enumerate()
        .map(|(i, t)| match t.kind.as_deref() {
            None | Some("custom") => Ok(ToolSpec {
                name: &t.name,
                description: t.description.as_deref(),
                schema: t.input_schema.as_ref(),
                at: format!("tools[{i}]"),
                schema_key: "input_schema",
            }),
            Some(other) => Err(ApiError::invalid(
                &format!("tools[{i}].type"),
                format!("server tool {other:?} is not available here; only custom (client) tools are"),
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Several calls per answer only when asked for (see docs/structured-output.md).
    let parallel = choice.and_then(|c| c.get("disable_parallel_tool_use")).and_then(Value::as_bool) == Some(false);
    tool_set(specs, mode, parallel, ("tool_choice", "tool_choice.name"))
}

/// `count_tokens`: the prompt this request renders to, counted.
pub fn count_request(req: &MessagesRequest) -> MessagesRequest {
    // count_tokens takes no max_tokens; any value makes the request complete.
    MessagesRequest { max_tokens: Some(1), stream: None, ..req.clone() }
}

fn stop_reason(o: &Outcome, made_calls: bool) -> (&'static str, Option<String>) {
    match (o.finish, &o.stop) {
        (FinishReason::Length, _) => ("max_tokens", None),
        (_, _) if made_calls => ("tool_use", None),
        (_, Some(s)) => ("stop_sequence", Some(s.clone())),
        _ => ("end_turn", None),
    }
}

fn usage(o: &Outcome) -> Usage {
    Usage {
        input_tokens: o.prompt_tokens - o.cached_tokens,
        output_tokens: o.completion_tokens(),
        cache_read_input_tokens: o.cached_tokens,
        cache_creation_input_tokens: 0,
        lane: Some(o.lane().into()),
        speculation: super::openai_chat::speculation(o),
    }
}

fn tool_input(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| Value::Object(Default::default()))
}

/// An answer as Anthropic writes it.
pub struct AnthropicRender {
    id: String,
    model: String,
    prompt_tokens: usize,
    /// The open content block: its index and kind.
    open: Option<(usize, Block)>,
    next_index: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    Tool(usize),
}

impl AnthropicRender {
    pub fn new(model: &str, prompt_tokens: usize) -> Self {
        Self { id: new_id("msg"), model: model.to_owned(), prompt_tokens, open: None, next_index: 0 }
    }

    fn message(&self, content: Vec<ContentBlock>, stop: Option<(&str, Option<String>)>, usage: Usage) -> Message {
        Message {
            id: self.id.clone(),
            kind: "message".into(),
            role: "assistant".into(),
            model: self.model.clone(),
            content,
            stop_reason: stop.as_ref().map(|s| s.0.to_owned()),
            stop_sequence: stop.and_then(|s| s.1),
            usage,
        }
    }

    fn event(e: &StreamEvent) -> Bytes {
        named_event(e.name(), &serde_json::to_string(e).unwrap_or_default())
    }

    /// Make `block` the open one (closing the previous), with `start` as its first form.
    fn enter(&mut self, block: Block, start: ContentBlock, out: &mut Vec<Bytes>) -> usize {
        if let Some((index, open)) = self.open {
            if open == block {
                return index;
            }
            out.push(Self::event(&StreamEvent::ContentBlockStop { index }));
        }
        let index = self.next_index;
        self.next_index += 1;
        self.open = Some((index, block));
        out.push(Self::event(&StreamEvent::ContentBlockStart { index, content_block: start }));
        index
    }
}

impl Render for AnthropicRender {
    fn shape(&self) -> ApiShape {
        ApiShape::Anthropic
    }

    fn open(&mut self) -> Vec<Bytes> {
        let usage = Usage { input_tokens: self.prompt_tokens, ..Usage::default() };
        let start = StreamEvent::MessageStart { message: self.message(Vec::new(), None, usage) };
        vec![Self::event(&start), Self::event(&StreamEvent::Ping)]
    }

    fn pieces(&mut self, pieces: Vec<AnswerPiece>, _lp: Option<&TokenOut>) -> Vec<Bytes> {
        let mut out = Vec::new();
        for p in pieces {
            let (index, delta) = match p {
                AnswerPiece::Reasoning(t) => {
                    let start = ContentBlock::Thinking { thinking: String::new(), signature: String::new() };
                    (self.enter(Block::Thinking, start, &mut out), BlockDelta::ThinkingDelta { thinking: t })
                }
                AnswerPiece::Text(t) => {
                    let i = self.enter(Block::Text, ContentBlock::Text { text: String::new() }, &mut out);
                    (i, BlockDelta::TextDelta { text: t })
                }
                AnswerPiece::CallStart { index, name } => {
                    let start =
                        ContentBlock::ToolUse { id: new_id("toolu"), name, input: Value::Object(Default::default()) };
                    self.enter(Block::Tool(index), start, &mut out);
                    continue;
                }
                AnswerPiece::CallArgs { index, fragment } => {
                    let i = match self.open {
                        Some((i, Block::Tool(c))) if c == index => i,
                        _ => continue,
                    };
                    (i, BlockDelta::InputJsonDelta { partial_json: fragment })
                }
            };
            out.push(Self::event(&StreamEvent::ContentBlockDelta { index, delta }));
        }
        out
    }

    fn close(&mut self, o: &Outcome, made_calls: bool) -> Vec<Bytes> {
        let mut out = Vec::new();
        if let Some((index, _)) = self.open.take() {
            out.push(Self::event(&StreamEvent::ContentBlockStop { index }));
        }
        let (reason, sequence) = stop_reason(o, made_calls);
        let delta = MessageDelta { stop_reason: Some(reason.into()), stop_sequence: sequence };
        out.push(Self::event(&StreamEvent::MessageDelta {
            delta,
            usage: DeltaUsage { output_tokens: o.completion_tokens() },
        }));
        out.push(Self::event(&StreamEvent::MessageStop));
        out
    }

    fn whole(&mut self, _text: &str, answer: Answer, o: &Outcome, _lp: &[TokenOut]) -> String {
        let mut content = Vec::new();
        if let Some(t) = answer.reasoning {
            content.push(ContentBlock::Thinking { thinking: t, signature: String::new() });
        }
        if let Some(t) = answer.text {
            content.push(ContentBlock::Text { text: t });
        }
        let made_calls = !answer.calls.is_empty();
        for c in answer.calls {
            content.push(ContentBlock::ToolUse { id: new_id("toolu"), input: tool_input(&c.arguments), name: c.name });
        }
        let m = self.message(content, Some(stop_reason(o, made_calls)), usage(o));
        serde_json::to_string(&m).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thinking_budget_stands_for_an_effort() {
        let e = [None, Some(1024), Some(4096), Some(4097), Some(16_384), Some(16_385)].map(budget_effort);
        assert_eq!(e, [Effort::Medium, Effort::Low, Effort::Low, Effort::Medium, Effort::Medium, Effort::High]);
    }
}
