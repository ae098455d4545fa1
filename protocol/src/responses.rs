//! OpenAI Responses API shapes (`POST /v1/responses`): the request (polymorphic fields
//! as raw JSON, checked by the engine), the response object with its output items, and
//! the streamed events (each carries a `sequence_number`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The header the gateway sets (value `expanded`) when it has replaced a request's
/// `input` with the whole conversation of its `previous_response_id`; an engine refuses
/// a `previous_response_id` without it.
pub const HISTORY_HEADER: &str = "x-corral-history";

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    /// A string, or a list of items (messages, `function_call`, `function_call_output`).
    pub input: Option<Value>,
    pub instructions: Option<String>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// `{"format": {"type": "text" | "json_object" | "json_schema", …}}`.
    pub text: Option<Value>,
    /// `{"effort": "none" | "minimal" | "low" | "medium" | "high"}`.
    pub reasoning: Option<Value>,
    pub max_output_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub stream: Option<bool>,
    /// Default true: the gateway keeps the response for `previous_response_id`.
    pub store: Option<bool>,
    pub metadata: Option<Value>,
    pub previous_response_id: Option<String>,
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// corral's: `off` or `ngram`, overriding `--speculate` for this request.
    pub speculate: Option<String>,
}

/// One item of `output` (and of a stored conversation's history).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    Message { id: String, status: String, role: String, content: Vec<OutputContent> },
    FunctionCall { id: String, call_id: String, name: String, arguments: String, status: String },
    Reasoning { id: String, summary: Vec<Value>, content: Vec<ReasoningContent>, status: String },
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputContent {
    OutputText { text: String, annotations: Vec<Value> },
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ReasoningContent {
    ReasoningText { text: String },
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct InputTokensDetails {
    pub cached_tokens: usize,
    pub cache_write_tokens: usize,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: usize,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ResponseUsage {
    pub input_tokens: usize,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: usize,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: usize,
    /// corral's: `serial` or `batch` (see the OpenAI usage).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lane: Option<String>,
    /// corral's (see the OpenAI usage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculation: Option<crate::openai::Speculation>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct IncompleteDetails {
    pub reason: String,
}

/// The response object (`object: "response"`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Response {
    pub id: String,
    pub object: String,
    pub created_at: u64,
    /// `in_progress | completed | incomplete | failed`.
    pub status: String,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub usage: Option<ResponseUsage>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub error: Option<Value>,
    pub instructions: Option<String>,
    pub previous_response_id: Option<String>,
    pub metadata: Value,
    pub store: bool,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub max_output_tokens: Option<i64>,
    pub parallel_tool_calls: bool,
    pub tool_choice: Value,
    pub tools: Vec<Value>,
    pub text: Value,
    pub reasoning: Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_carry_their_types() {
        let m = OutputItem::Message {
            id: "msg_1".into(),
            status: "completed".into(),
            role: "assistant".into(),
            content: vec![OutputContent::OutputText { text: "hi".into(), annotations: vec![] }],
        };
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!((v["type"].as_str(), v["content"][0]["type"].as_str()), (Some("message"), Some("output_text")));
        let r = OutputItem::Reasoning {
            id: "rs_1".into(),
            summary: vec![],
            content: vec![ReasoningContent::ReasoningText { text: "t".into() }],
            status: "completed".into(),
        };
        assert_eq!(serde_json::to_value(&r).unwrap()["content"][0]["type"], "reasoning_text");
    }
}
