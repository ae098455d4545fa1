//! The three request targets (`openai_request`, `anthropic_request`,
//! `responses_request`): a body through the engine's parse and validation and through the
//! gateway's bounds check (`Outline`). Input: a selector byte (the model's tool format;
//! its high bit picks an API variant), then the body.
//!
//! Asserted: nothing panics, and the gateway never refuses a body the engine would
//! accept (its check runs first, before any engine is chosen, and is meant to refuse a
//! subset of what the engine refuses, with the same messages).

use std::sync::OnceLock;

use corral_engine::chat::ChatTemplate;
use corral_engine::server::fuzzing::{self, Api, Model};
use corral_engine::tools::format::{Syntax, ToolFormat};
use corral_protocol::ApiShape;
use corral_protocol::bounds::Outline;

/// ChatML that renders tools, tool calls and tool results itself (Qwen's shape), so the
/// native tool path reaches a template too.
const TOOLS_TEMPLATE: &str = concat!(
    "{%- if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools><|im_end|>\n",
    "{%- endif %}",
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}",
    "{%- for c in m.tool_calls or [] %}<tool_call>\n{{ c.function | tojson }}\n</tool_call>{% endfor %}",
    "{%- if m.tool_call_id %} [{{ m.tool_call_id }}]{% endif %}<|im_end|>\n{% endfor %}",
    "{%- if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n{% endif %}",
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
);

fn template() -> &'static ChatTemplate {
    static T: OnceLock<ChatTemplate> = OnceLock::new();
    T.get_or_init(|| ChatTemplate::new(Some(TOOLS_TEMPLATE), None, "<s>", "</s>", true).expect("the template compiles"))
}

/// The tool-call format a selector byte picks: corral's fallback or a native one.
pub(crate) fn tool_format(selector: u8) -> ToolFormat {
    let native = |syntax| ToolFormat { syntax, native: true, marker_token: None };
    match selector % 4 {
        0 => ToolFormat::fallback(),
        1 => native(Syntax::Hermes),
        2 => native(Syntax::Llama3),
        _ => native(Syntax::Mistral),
    }
}

/// OpenAI chat completions and completions bodies (`/v1/chat/completions`,
/// `/v1/completions`); the selector byte's high bit picks completions.
pub fn openai_request(data: &[u8]) {
    let api = if data.first().is_some_and(|b| b & 0x80 != 0) { Api::Completion } else { Api::Chat };
    run(api, ApiShape::OpenAi, data);
}

/// Anthropic Messages bodies (`/v1/messages`).
pub fn anthropic_request(data: &[u8]) {
    run(Api::Messages, ApiShape::Anthropic, data);
}

/// OpenAI Responses bodies (`/v1/responses`), with and without the gateway's history
/// mark (selector bit 0x80).
pub fn responses_request(data: &[u8]) {
    let history_expanded = data.first().is_some_and(|b| b & 0x80 != 0);
    run(Api::Responses { history_expanded }, ApiShape::Responses, data);
}

/// `data`: a selector byte (the model's tool format), then the body.
fn run(api: Api, shape: ApiShape, data: &[u8]) {
    let Some((&selector, body)) = data.split_first() else { return };
    let model = Model { tool_format: tool_format(selector), template: Some(template()) };
    if fuzzing::check(api, body, &model).is_err() {
        return;
    }
    let outline = match Outline::read(body, shape) {
        Ok(o) => o,
        Err(e) => panic!("the engine accepts a body the gateway cannot read: {}", e.message),
    };
    if let Err(e) = outline.check(shape) {
        panic!("the gateway refuses a body the engine accepts: {}", e.message);
    }
}
