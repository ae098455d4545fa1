//! OpenAI-compatible request and response bodies (`/v1/chat/completions`,
//! `/v1/completions`, `/v1/models`). Requests keep every field optional and loosely
//! typed so the engine can validate them with clear messages; unknown fields are
//! ignored, as OpenAI clients send many we do not use.

mod structured;
mod tools;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

pub use structured::{ConstraintFields, JsonSchemaFormat, ResponseFormat, StructuredOutputs};
pub use tools::{
    FunctionCall, FunctionCallDelta, FunctionCallIn, FunctionDef, NamedToolChoice, Tool, ToolCall, ToolCallDelta,
    ToolCallIn, ToolChoice, ToolName,
};

/// `"stop": "x"` or `"stop": ["x", "y"]`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum StopSpec {
    One(String),
    Many(Vec<String>),
}

impl StopSpec {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopSpec::One(s) => vec![s],
            StopSpec::Many(v) => v,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// Sampling and length fields shared by both generation routes.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct SamplingFields {
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<StopSpec>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    /// vLLM's name; `repeat_penalty` is llama.cpp's.
    #[serde(alias = "repeat_penalty")]
    pub repetition_penalty: Option<f64>,
    pub logit_bias: Option<HashMap<String, f64>>,
    pub ignore_eos: Option<bool>,
    /// corral's: `off` or `ngram`, overriding `--speculate` for this request.
    pub speculate: Option<String>,
    pub n: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
}

/// One content part of a message (`{"type":"text","text":"..."}`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct MessageIn {
    pub role: String,
    /// May be null on an assistant message that carries `tool_calls`.
    pub content: Option<Content>,
    /// Assistant turns: the calls it made.
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// `role: "tool"`: which call this is the result of.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
    /// Assistant turns: the reasoning this API returned with it (fed back to templates
    /// that render it, as gpt-oss's does before a call).
    #[serde(default)]
    pub reasoning_content: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct ChatCompletionRequest {
    pub model: Option<String>,
    pub messages: Option<Vec<MessageIn>>,
    /// Chat: return log probabilities of the chosen tokens.
    pub logprobs: Option<bool>,
    /// Chat: with `logprobs`, also the N most likely alternatives (0..=20; -1 = unset).
    pub top_logprobs: Option<i64>,
    pub tools: Option<Vec<Tool>>,
    pub tool_choice: Option<ToolChoice>,
    pub parallel_tool_calls: Option<bool>,
    /// `none | minimal | low | medium | high`: whether the model reasons.
    pub reasoning_effort: Option<String>,
    /// Extra variables for the chat template (vLLM/llama.cpp), e.g. `enable_thinking`.
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    #[serde(flatten)]
    pub constraints: ConstraintFields,
}

/// `prompt`: text, one-element list of text, token ids, or one list of token ids.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<i64>),
    TokenLists(Vec<Vec<i64>>),
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Option<Prompt>,
    /// Completions: number of alternatives per token to return (0..=20).
    pub logprobs: Option<i64>,
    pub echo: Option<bool>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    #[serde(flatten)]
    pub constraints: ConstraintFields,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
    /// `serial` (every forward pass was this request's alone) or `batch` (it shared a
    /// pass with other requests).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lane: Option<String>,
    /// corral's: draft tokens verified and kept, when the request speculated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculation: Option<Speculation>,
}

/// `usage.speculation`: draft tokens a request's passes verified, and how many of them
/// the model's own sampling kept (every kept token is one the request would have
/// generated anyway).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Speculation {
    pub drafted: usize,
    pub accepted: usize,
}

impl Usage {
    pub fn new(prompt: usize, completion: usize, cached: usize) -> Self {
        Self {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: cached },
            lane: None,
            speculation: None,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ChoiceLogprobs {
    pub content: Vec<TokenLogprob>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AssistantMessage {
    pub role: String,
    /// Null when the answer is only tool calls.
    pub content: Option<String>,
    /// The model's reasoning (`<think>…</think>`), when it reasons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ChatChoice {
    pub index: usize,
    pub message: AssistantMessage,
    pub finish_reason: String,
    pub logprobs: Option<ChoiceLogprobs>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ChatCompletion {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ChunkChoice {
    pub index: usize,
    pub delta: Delta,
    pub finish_reason: Option<String>,
    pub logprobs: Option<ChoiceLogprobs>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// Legacy completions logprobs.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<HashMap<String, f32>>,
    pub text_offset: Vec<usize>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub finish_reason: Option<String>,
    pub logprobs: Option<CompletionLogprobs>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Completion {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GenDefaults {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub min_p: f32,
    /// `None`: until end of generation or the context is full.
    pub max_tokens: Option<usize>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Capabilities {
    pub chat_completions: bool,
    pub text_completions: bool,
    pub anthropic_messages: bool,
    pub responses: bool,
    pub streaming: bool,
    pub logprobs: bool,
    pub tools: bool,
    pub structured_output: bool,
    pub vision: bool,
    pub embeddings: bool,
    pub audio: bool,
}

impl Capabilities {
    /// What corral's engine offers for a model: the chat APIs (and tools, which go
    /// through the chat template) need a chat template; the rest works for every model
    /// the engine loads. No vision, audio or embeddings yet.
    pub fn of_engine(has_chat_template: bool) -> Self {
        Capabilities {
            chat_completions: has_chat_template,
            text_completions: true,
            anthropic_messages: has_chat_template,
            responses: has_chat_template,
            streaming: true,
            logprobs: true,
            tools: has_chat_template,
            structured_output: true,
            vision: false,
            embeddings: false,
            audio: false,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ModelCard {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub owned_by: String,
    /// Tokens per request (the gateway reads it from the model file's header).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_window: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Capabilities>,
    /// `capabilities`' most asked-for flags at the top level, where some clients look.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub structured_output: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vision: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub embeddings: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gen_defaults: Option<GenDefaults>,
    /// `continuous` (requests share forward passes, `--batch` > 1) or `serial`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_mode: Option<String>,
    /// Whether an engine for it is running (gateway listing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resident: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
}

impl ModelCard {
    /// A card with nothing known beyond its id and date.
    pub fn new(id: impl Into<String>, created: u64) -> Self {
        ModelCard { id: id.into(), object: "model".into(), created, owned_by: "corral".into(), ..Default::default() }
    }

    /// Sets `capabilities` and the top-level flags that mirror it.
    pub fn with_capabilities(mut self, c: Capabilities) -> Self {
        (self.tools, self.structured_output, self.vision, self.embeddings) =
            (Some(c.tools), Some(c.structured_output), Some(c.vision), Some(c.embeddings));
        self.capabilities = Some(c);
        self
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ModelList {
    pub object: String,
    pub data: Vec<ModelCard>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_request_accepts_openai_shapes_and_ignores_unknowns() {
        let r: ChatCompletionRequest = serde_json::from_str(
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],
                "stop":"x","max_completion_tokens":5,"repeat_penalty":1.1,"stream":true,
                "stream_options":{"include_usage":true},"user":"ignored","tools":[]}"#,
        )
        .unwrap();
        assert_eq!(r.sampling.stop, Some(StopSpec::One("x".into())));
        assert_eq!(r.sampling.max_completion_tokens, Some(5));
        assert_eq!(r.sampling.repetition_penalty, Some(1.1));
        assert!(matches!(r.messages.unwrap()[0].content, Some(Content::Parts(_))));
    }

    #[test]
    fn prompt_forms() {
        let p = |s: &str| serde_json::from_str::<CompletionRequest>(s).unwrap().prompt.unwrap();
        assert_eq!(p(r#"{"prompt":"a"}"#), Prompt::Text("a".into()));
        assert_eq!(p(r#"{"prompt":["a"]}"#), Prompt::Texts(vec!["a".into()]));
        assert_eq!(p(r#"{"prompt":[1,2]}"#), Prompt::Tokens(vec![1, 2]));
        assert_eq!(p(r#"{"prompt":[[1,2]]}"#), Prompt::TokenLists(vec![vec![1, 2]]));
    }
}
