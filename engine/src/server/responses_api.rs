//! OpenAI Responses (`POST /v1/responses`): the request read into the common
//! `ChatInput`, and the answer written as a response object with output items
//! (reasoning, message, function calls), or as the Responses event stream, every event
//! numbered. Stored responses and `previous_response_id` live in the gateway: it sends
//! the whole history as `input` and marks the request (`x-corral-history: expanded`);
//! a `previous_response_id` without that mark is refused here, never ignored.

use bytes::Bytes;
use corral_protocol::openai::SamplingFields;
use corral_protocol::responses::{
    IncompleteDetails, InputTokensDetails, OutputContent, OutputItem, OutputTokensDetails, ReasoningContent, Response,
    ResponseUsage, ResponsesRequest,
};
use corral_protocol::{ApiError, ApiShape, bounds};
use serde_json::{Value, json};

use super::answer::{Answer, AnswerPiece};
use super::conversation::Turn;
use super::input::{ChatInput, effort};
use super::respond::{new_id, unix_now};
use super::stream::{Render, named_event};
use super::structured::{ToolSpec, tool_set};
use crate::generate::{FinishReason, Outcome, TokenOut};
use crate::grammar::Constraint;
use crate::tools::{ParsedCall, ToolMode, ToolRequest};

pub fn input(req: &ResponsesRequest, history_expanded: bool) -> Result<ChatInput, ApiError> {
    if req.previous_response_id.is_some() && !history_expanded {
        return Err(ApiError::invalid(
            "previous_response_id",
            "previous_response_id needs corral serve: stored responses live in the gateway, not in an engine",
        ));
    }
    let mut turns = Vec::new();
    if let Some(i) = req.instructions.as_deref().filter(|i| !i.is_empty()) {
        turns.push(turn("system", i.to_owned()));
    }
    match req.input.as_ref() {
        None => return Err(ApiError::invalid("input", "input is required")),
        Some(Value::String(s)) => turns.push(turn("user", s.clone())),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                input_item(i, item, &mut turns)?;
            }
        }
        Some(_) => return Err(ApiError::invalid("input", "input must be a string or a list of items")),
    }
    // Checked under its own name here (the sampling check would call it max_tokens),
    // with the message the gateway gives.
    if let Some(n) = req.max_output_tokens {
        bounds::output_tokens("max_output_tokens", n)?;
    }
    let reasoning = req.reasoning.as_ref().and_then(|r| r.get("effort")).and_then(Value::as_str);
    let sampling = SamplingFields {
        max_tokens: req.max_output_tokens,
        temperature: req.temperature,
        top_p: req.top_p,
        stream: req.stream,
        speculate: req.speculate.clone(),
        ..SamplingFields::default()
    };
    Ok(ChatInput {
        turns,
        tools: tools(req)?,
        constraint: text_format(req)?,
        sampling,
        logprobs: None,
        template_kwargs: req.chat_template_kwargs.clone().unwrap_or_default(),
        effort: effort("reasoning.effort", reasoning)?,
        effort_field: "reasoning.effort",
        warnings: Vec::new(),
    })
}

fn turn(role: &'static str, text: String) -> Turn {
    Turn { role, text, calls: Vec::new(), tool_call_id: None, reasoning: None }
}

fn input_item(i: usize, item: &Value, turns: &mut Vec<Turn>) -> Result<(), ApiError> {
    let at = format!("input[{i}]");
    let field = |k: &str| item.get(k).and_then(Value::as_str);
    match field("type") {
        None | Some("message") => {
            let role = match field("role") {
                Some("user") => "user",
                Some("assistant") => "assistant",
                Some("system" | "developer") => "system",
                other => return Err(ApiError::invalid(&format!("{at}.role"), format!("unknown role {other:?}"))),
            };
            let text = content_text(&format!("{at}.content"), item.get("content"))?;
            turns.push(turn(role, text));
        }
        Some("function_call") => {
            let name = field("name")
                .ok_or_else(|| ApiError::invalid(&format!("{at}.name"), "a function_call needs a name"))?;
            let args = field("arguments").unwrap_or("{}");
            let parsed: Value = serde_json::from_str(args).map_err(|e| {
                ApiError::invalid(&format!("{at}.arguments"), format!("arguments are not valid JSON: {e}"))
            })?;
            let call = (
                field("call_id").map(str::to_owned),
                ParsedCall { name: name.to_owned(), arguments: parsed.to_string() },
            );
            // Calls join the assistant turn they follow.
            match turns.last_mut() {
                Some(t) if t.role == "assistant" => t.calls.push(call),
                _ => turns.push(Turn { calls: vec![call], ..turn("assistant", String::new()) }),
            }
        }
        Some("function_call_output") => {
            let output = match item.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(v @ Value::Array(_)) => content_text(&format!("{at}.output"), Some(v))?,
                _ => return Err(ApiError::invalid(&format!("{at}.output"), "a function_call_output needs output")),
            };
            turns.push(Turn { tool_call_id: field("call_id").map(str::to_owned), ..turn("tool", output) });
        }
        // Past reasoning is not fed back (as OpenAI's own models do without encryption).
        Some("reasoning") => {}
        Some(other) => {
            return Err(ApiError::invalid(
                &format!("{at}.type"),
                format!("input items of type {other:?} are not supported"),
            ));
        }
    }
    Ok(())
}

/// Message content: a string, or text parts (`input_text`, `output_text`).
fn content_text(param: &str, content: Option<&Value>) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("input_text" | "output_text" | "text"), Some(t)) => out.push_str(t),
                    (Some(kind @ ("input_image" | "input_file" | "input_audio")), _) => {
                        return Err(ApiError::invalid(
                            &format!("{param}[{j}].type"),
                            format!("{kind} is not supported: this server has no vision or audio models yet"),
                        ));
                    }
                    (kind, _) => {
                        return Err(ApiError::invalid(
                            &format!("{param}[{j}].type"),
                            format!("unsupported content part {kind:?}"),
                        ));
                    }
                }
            }
            Ok(out)
        }
        Some(_) => Err(ApiError::invalid(param, "content must be a string or a list of parts")),
    }
}

fn tools(req: &ResponsesRequest) -> Result<Option<ToolRequest>, ApiError> {
    let list = req.tools.as_deref().unwrap_or_default();
    let mode = match req.tool_choice.as_ref() {
        None => (!list.is_empty()).then_some(ToolMode::Auto),
        Some(Value::String(m)) => match m.as_str() {
            "auto" => (!list.is_empty()).then_some(ToolMode::Auto),
            "none" => None,
            "required" => Some(ToolMode::Required),
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("tool_choice must be auto, none or required (got {other:?})"),
                ));
            }
        },
        Some(v) => match (v.get("type").and_then(Value::as_str), v.get("name").and_then(Value::as_str)) {
            (Some("function"), Some(name)) => Some(ToolMode::Named(name.to_owned())),
            _ => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "tool_choice must name a function: {\"type\":\"function\",\"name\":…}",
                ));
            }
        },
    };
    let specs = list
        .iter()
        .enumerate()
        .map(|(i, t)| match (t.get("type").and_then(Value::as_str), t.get("name").and_then(Value::as_str)) {
            (Some("function"), Some(name)) => Ok(ToolSpec {
                name,
                description: t.get("description").and_then(Value::as_str),
                schema: t.get("parameters"),
                at: format!("tools[{i}]"),
                schema_key: "parameters",
            }),
            (Some("function"), None) => {
                Err(ApiError::invalid(&format!("tools[{i}].name"), "a function tool needs a name"))
            }
            (kind, _) => Err(ApiError::invalid(
                &format!("tools[{i}].type"),
                format!("only function tools are supported (got {kind:?})"),
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    tool_set(specs, mode, req.parallel_tool_calls.unwrap_or(false), ("tool_choice", "tool_choice.name"))
}

/// `text.format`: `text`, `json_object`, or `json_schema` (flat: `name`, `schema`, `strict`).
fn text_format(req: &ResponsesRequest) -> Result<Option<Constraint>, ApiError> {
    let Some(format) = req.text.as_ref().and_then(|t| t.get("format")) else { return Ok(None) };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Constraint::JsonObject)),
        Some("json_schema") => match format.get("schema") {
            Some(s @ (Value::Object(_) | Value::Bool(true))) => Ok(Some(Constraint::JsonSchema(s.clone()))),
            None => Ok(Some(Constraint::JsonObject)),
            Some(_) => Err(ApiError::invalid("text.format.schema", "text.format.schema must be a JSON Schema object")),
        },
        other => Err(ApiError::invalid(
            "text.format.type",
            format!("text.format.type must be text, json_object or json_schema (got {other:?})"),
        )),
    }
}

/// The answer as a response object and as the Responses event stream.
pub struct ResponsesRender {
    base: Response,
    seq: u64,
    /// Output items so far; the streamed one is the last.
    items: Vec<OutputItem>,
    /// Call index → output index.
    calls: Vec<usize>,
    count_reasoning: Box<dyn Fn(&str) -> usize + Send>,
}

impl ResponsesRender {
    /// `count_reasoning` counts the tokens of reasoning text (for `usage`).
    pub fn new(model: &str, req: &ResponsesRequest, count_reasoning: Box<dyn Fn(&str) -> usize + Send>) -> Self {
        let base = Response {
            id: new_id("resp"),
            object: "response".into(),
            created_at: unix_now(),
            status: "in_progress".into(),
            model: model.to_owned(),
            output: Vec::new(),
            usage: None,
            incomplete_details: None,
            error: None,
            instructions: req.instructions.clone(),
            previous_response_id: req.previous_response_id.clone(),
            metadata: req.metadata.clone().unwrap_or_else(|| json!({})),
            store: req.store.unwrap_or(true),
            temperature: req.temperature,
            top_p: req.top_p,
            max_output_tokens: req.max_output_tokens,
            parallel_tool_calls: req.parallel_tool_calls.unwrap_or(false),
            tool_choice: req.tool_choice.clone().unwrap_or_else(|| json!("auto")),
            tools: req.tools.clone().unwrap_or_default(),
            text: req.text.clone().unwrap_or_else(|| json!({"format": {"type": "text"}})),
            reasoning: req.reasoning.clone().unwrap_or_else(|| json!({"effort": null})),
        };
        Self { base, seq: 0, items: Vec::new(), calls: Vec::new(), count_reasoning }
    }

    fn event(&mut self, mut data: Value) -> Bytes {
        let name = data["type"].as_str().unwrap_or("error").to_owned();
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        named_event(&name, &data.to_string())
    }

    fn finished(&self, o: &Outcome, output: Vec<OutputItem>) -> Response {
        let reasoning_tokens = output
            .iter()
            .map(|i| match i {
                OutputItem::Reasoning { content, .. } => {
                    content.iter().map(|ReasoningContent::ReasoningText { text }| (self.count_reasoning)(text)).sum()
                }
                _ => 0,
            })
            .sum();
        let length = o.finish == FinishReason::Length;
        Response {
            status: if length { "incomplete" } else { "completed" }.into(),
            output,
            usage: Some(ResponseUsage {
                input_tokens: o.prompt_tokens,
                input_tokens_details: InputTokensDetails { cached_tokens: o.cached_tokens, cache_write_tokens: 0 },
                output_tokens: o.completion_tokens(),
                output_tokens_details: OutputTokensDetails { reasoning_tokens },
                total_tokens: o.prompt_tokens + o.completion_tokens(),
                lane: Some(o.lane().into()),
                speculation: super::openai_chat::speculation(o),
            }),
            incomplete_details: length.then(|| IncompleteDetails { reason: "max_output_tokens".into() }),
            ..self.base.clone()
        }
    }

    /// Close the streamed item: its done events, and it is final in `items`.
    fn close_item(&mut self, out: &mut Vec<Bytes>) {
        let Some(index) = self.items.len().checked_sub(1) else { return };
        let item = finish_item(self.items[index].clone());
        let id = item_id(&item).to_owned();
        match &item {
            OutputItem::Message { content, .. } => {
                let OutputContent::OutputText { text, .. } = &content[0];
                let e = json!({"type": "response.output_text.done", "item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []});
                out.push(self.event(e));
                let e = json!({"type": "response.content_part.done", "item_id": id, "output_index": index, "content_index": 0, "part": content[0]});
                out.push(self.event(e));
            }
            OutputItem::Reasoning { content, .. } => {
                let ReasoningContent::ReasoningText { text } = &content[0];
                let e = json!({"type": "response.reasoning_text.done", "item_id": id, "output_index": index, "content_index": 0, "text": text});
                out.push(self.event(e));
            }
            OutputItem::FunctionCall { arguments, name, .. } => {
                let e = json!({"type": "response.function_call_arguments.done", "item_id": id, "output_index": index, "arguments": arguments, "name": name});
                out.push(self.event(e));
            }
        }
        let e = json!({"type": "response.output_item.done", "output_index": index, "item": item});
        out.push(self.event(e));
        self.items[index] = item;
    }

    /// Open a new item (closing the streamed one). Messages and reasoning start with no
    /// content part; the part is added by its own event, as OpenAI streams it.
    fn open_item(&mut self, mut item: OutputItem, out: &mut Vec<Bytes>) -> usize {
        if !self.items.is_empty() {
            self.close_item(out);
        }
        let index = self.items.len();
        let part = match &mut item {
            OutputItem::Message { content, .. } => content.pop().map(|p| serde_json::to_value(p).unwrap_or_default()),
            OutputItem::Reasoning { content, .. } => content.pop().map(|p| serde_json::to_value(p).unwrap_or_default()),
            OutputItem::FunctionCall { .. } => None,
        };
        let e = json!({"type": "response.output_item.added", "output_index": index, "item": item});
        out.push(self.event(e));
        if let Some(part) = part {
            let id = item_id(&item).to_owned();
            let e = json!({"type": "response.content_part.added", "item_id": id, "output_index": index, "content_index": 0, "part": part});
            out.push(self.event(e));
            match &mut item {
                OutputItem::Message { content, .. } => {
                    content.push(OutputContent::OutputText { text: String::new(), annotations: vec![] })
                }
                OutputItem::Reasoning { content, .. } => {
                    content.push(ReasoningContent::ReasoningText { text: String::new() })
                }
                OutputItem::FunctionCall { .. } => {}
            }
        }
        self.items.push(item);
        index
    }

    fn streaming_kind(&self) -> Option<(usize, &OutputItem)> {
        self.items.last().map(|i| (self.items.len() - 1, i)).filter(|(_, i)| item_status(i) == "in_progress")
    }
}

fn item_id(i: &OutputItem) -> &str {
    match i {
        OutputItem::Message { id, .. } | OutputItem::FunctionCall { id, .. } | OutputItem::Reasoning { id, .. } => id,
    }
}

fn item_status(i: &OutputItem) -> &str {
    match i {
        OutputItem::Message { status, .. }
        | OutputItem::FunctionCall { status, .. }
        | OutputItem::Reasoning { status, .. } => status,
    }
}

fn finish_item(mut i: OutputItem) -> OutputItem {
    match &mut i {
        OutputItem::Message { status, .. }
        | OutputItem::FunctionCall { status, .. }
        | OutputItem::Reasoning { status, .. } => *status = "completed".into(),
    }
    i
}

fn message_item(text: String, status: &str) -> OutputItem {
    OutputItem::Message {
        id: new_id("msg"),
        status: status.into(),
        role: "assistant".into(),
        content: vec![OutputContent::OutputText { text, annotations: vec![] }],
    }
}

fn reasoning_item(text: String, status: &str) -> OutputItem {
    OutputItem::Reasoning {
        id: new_id("rs"),
        summary: vec![],
        content: vec![ReasoningContent::ReasoningText { text }],
        status: status.into(),
    }
}

fn call_item(name: String, arguments: String, status: &str) -> OutputItem {
    OutputItem::FunctionCall { id: new_id("fc"), call_id: new_id("call"), name, arguments, status: status.into() }
}

impl Render for ResponsesRender {
    fn shape(&self) -> ApiShape {
        ApiShape::Responses
    }

    fn open(&mut self) -> Vec<Bytes> {
        let r = serde_json::to_value(&self.base).unwrap_or_default();
        vec![
            self.event(json!({"type": "response.created", "response": r})),
            self.event(json!({"type": "response.in_progress", "response": r})),
        ]
    }

    fn pieces(&mut self, pieces: Vec<AnswerPiece>, _lp: Option<&TokenOut>) -> Vec<Bytes> {
        let mut out = Vec::new();
        for p in pieces {
            match p {
                AnswerPiece::Reasoning(t) => {
                    let index = match self.streaming_kind() {
                        Some((i, OutputItem::Reasoning { .. })) => i,
                        _ => self.open_item(reasoning_item(String::new(), "in_progress"), &mut out),
                    };
                    if let OutputItem::Reasoning { content, id, .. } = &mut self.items[index] {
                        let ReasoningContent::ReasoningText { text } = &mut content[0];
                        text.push_str(&t);
                        let id = id.clone();
                        let e = json!({"type": "response.reasoning_text.delta", "item_id": id, "output_index": index, "content_index": 0, "delta": t});
                        out.push(self.event(e));
                    }
                }
                AnswerPiece::Text(t) => {
                    let index = match self.streaming_kind() {
                        Some((i, OutputItem::Message { .. })) => i,
                        _ => self.open_item(message_item(String::new(), "in_progress"), &mut out),
                    };
                    if let OutputItem::Message { content, id, .. } = &mut self.items[index] {
                        let OutputContent::OutputText { text, .. } = &mut content[0];
                        text.push_str(&t);
                        let id = id.clone();
                        let e = json!({"type": "response.output_text.delta", "item_id": id, "output_index": index, "content_index": 0, "delta": t, "logprobs": []});
                        out.push(self.event(e));
                    }
                }
                AnswerPiece::CallStart { name, .. } => {
                    let index = self.open_item(call_item(name, String::new(), "in_progress"), &mut out);
                    self.calls.push(index);
                }
                AnswerPiece::CallArgs { index: call, fragment } => {
                    let Some(&index) = self.calls.get(call) else { continue };
                    if let OutputItem::FunctionCall { arguments, id, .. } = &mut self.items[index] {
                        arguments.push_str(&fragment);
                        let id = id.clone();
                        let e = json!({"type": "response.function_call_arguments.delta", "item_id": id, "output_index": index, "delta": fragment});
                        out.push(self.event(e));
                    }
                }
            }
        }
        out
    }

    fn close(&mut self, o: &Outcome, _made_calls: bool) -> Vec<Bytes> {
        let mut out = Vec::new();
        if self.streaming_kind().is_some() {
            self.close_item(&mut out);
        }
        let r = self.finished(o, self.items.clone());
        let kind = if r.status == "incomplete" { "response.incomplete" } else { "response.completed" };
        let e = json!({"type": kind, "response": r});
        out.push(self.event(e));
        out
    }

    fn whole(&mut self, _text: &str, answer: Answer, o: &Outcome, _lp: &[TokenOut]) -> String {
        let mut output = Vec::new();
        if let Some(t) = answer.reasoning {
            output.push(reasoning_item(t, "completed"));
        }
        if let Some(t) = answer.text {
            output.push(message_item(t, "completed"));
        }
        for c in answer.calls {
            output.push(call_item(c.name, c.arguments, "completed"));
        }
        serde_json::to_string(&self.finished(o, output)).unwrap_or_default()
    }
}
