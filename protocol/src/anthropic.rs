//! Anthropic Messages API shapes (`POST /v1/messages`, `/v1/messages/count_tokens`):
//! the request as clients send it (polymorphic fields kept as raw JSON, checked by the
//! engine with the field named in its 400) and the message, content blocks and stream
//! events the engine answers with.

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct MessagesRequest {
    pub model: Option<String>,
    /// Required by Anthropic; a missing one is a 400.
    pub max_tokens: Option<i64>,
    pub messages: Option<Vec<MessageParam>>,
    /// A string or a list of `{"type":"text","text":…}` blocks.
    pub system: Option<Value>,
    pub stop_sequences: Option<Vec<String>>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub stream: Option<bool>,
    pub tools: Option<Vec<ToolParam>>,
    pub tool_choice: Option<Value>,
    /// `{"type": "enabled", "budget_tokens": N}` or `{"type": "disabled"}`.
    pub thinking: Option<Value>,
    /// Accepted (`user_id`); not used.
    pub metadata: Option<Value>,
    /// corral/vLLM extension, as on chat completions.
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// corral's: `off` or `ngram`, overriding `--speculate` for this request.
    pub speculate: Option<String>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct MessageParam {
    pub role: String,
    /// A string or a list of content blocks.
    pub content: Value,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct ToolParam {
    pub name: String,
    pub description: Option<String>,
    pub input_schema: Option<Value>,
    /// Server tools (`web_search_…`, …) carry a type; function tools have none or `custom`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
}

/// A content block of a response (and of a streamed `content_block_start`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Text { text: String },
    ToolUse { id: String, name: String, input: Value },
    Thinking { thinking: String, signature: String },
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Usage {
    pub input_tokens: usize,
    pub output_tokens: usize,
    /// Prompt tokens served from the prompt cache.
    pub cache_read_input_tokens: usize,
    pub cache_creation_input_tokens: usize,
    /// corral's: `serial` or `batch` (see the OpenAI usage).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lane: Option<String>,
    /// corral's (see the OpenAI usage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculation: Option<crate::openai::Speculation>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Message {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub role: String,
    pub model: String,
    pub content: Vec<ContentBlock>,
    /// `end_turn | max_tokens | stop_sequence | tool_use` (null while streaming).
    pub stop_reason: Option<String>,
    pub stop_sequence: Option<String>,
    pub usage: Usage,
}

/// A streamed delta of one content block.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockDelta {
    TextDelta { text: String },
    InputJsonDelta { partial_json: String },
    ThinkingDelta { thinking: String },
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MessageDelta {
    pub stop_reason: Option<String>,
    pub stop_sequence: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DeltaUsage {
    pub output_tokens: usize,
}

/// The events of a streamed message, each sent as `event: <type>` + `data: <json>`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    MessageStart { message: Message },
    ContentBlockStart { index: usize, content_block: ContentBlock },
    ContentBlockDelta { index: usize, delta: BlockDelta },
    ContentBlockStop { index: usize },
    MessageDelta { delta: MessageDelta, usage: DeltaUsage },
    MessageStop,
    Ping,
}

impl StreamEvent {
    /// The SSE `event:` name.
    pub fn name(&self) -> &'static str {
        match self {
            StreamEvent::MessageStart { .. } => "message_start",
            StreamEvent::ContentBlockStart { .. } => "content_block_start",
            StreamEvent::ContentBlockDelta { .. } => "content_block_delta",
            StreamEvent::ContentBlockStop { .. } => "content_block_stop",
            StreamEvent::MessageDelta { .. } => "message_delta",
            StreamEvent::MessageStop => "message_stop",
            StreamEvent::Ping => "ping",
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TokenCount {
    pub input_tokens: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_and_events_have_anthropic_tags() {
        let b = ContentBlock::ToolUse { id: "toolu_1".into(), name: "f".into(), input: serde_json::json!({"a": 1}) };
        assert_eq!(serde_json::to_value(&b).unwrap()["type"], "tool_use");
        let e =
            StreamEvent::ContentBlockDelta { index: 1, delta: BlockDelta::InputJsonDelta { partial_json: "{".into() } };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(
            (v["type"].as_str(), v["delta"]["type"].as_str()),
            (Some("content_block_delta"), Some("input_json_delta"))
        );
        assert_eq!(e.name(), "content_block_delta");
        assert_eq!(
            serde_json::to_value(StreamEvent::MessageStop).unwrap(),
            serde_json::json!({"type": "message_stop"})
        );
    }

    #[test]
    fn requests_take_string_or_block_content() {
        let r: MessagesRequest = serde_json::from_str(
            r#"{"model":"m","max_tokens":5,"system":[{"type":"text","text":"s"}],
                "messages":[{"role":"user","content":"hi"},{"role":"user","content":[{"type":"text","text":"x"}]}],
                "tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"any"}}"#,
        )
        .unwrap();
        assert_eq!(r.messages.unwrap().len(), 2);
        assert!(r.system.unwrap().is_array());
    }
}
