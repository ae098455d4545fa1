//! The built-in harmony template on plain conversations: the strings gpt-oss's own
//! template writes for them (its layout, written out here by hand).

use serde_json::json;

use super::*;
use crate::chat::{ChatMessage, ChatTemplate};
use crate::harmony::{CALL, CHANNEL, END, MESSAGE, RETURN, START, speaks, vocabulary_has};

fn template() -> ChatTemplate {
    ChatTemplate::new(None, Some(builtin()), "<|startoftext|>", "<|return|>", false).unwrap()
}

/// The rendering with today's date replaced by `DATE`.
fn render(msgs: &[ChatMessage], tools: Option<&serde_json::Value>, kwargs: serde_json::Value) -> String {
    let kwargs = kwargs.as_object().cloned().unwrap_or_default();
    let out = template().render_with(msgs, tools, true, &kwargs).unwrap();
    let at = out.find("Current date: ").expect("a date line") + "Current date: ".len();
    format!("{}DATE{}", &out[..at], &out[at + 10..])
}

const SYSTEM: &str = "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: DATE\n\n";
const CHANNELS: &str = "# Valid channels: analysis, commentary, final. Channel must be included for every message.";

#[test]
fn a_plain_conversation() {
    let msgs = [
        ChatMessage::new("user", "Hi"),
        ChatMessage::new("assistant", "Hello!"),
        ChatMessage::new("user", "What is 2+2?"),
    ];
    assert_eq!(
        render(&msgs, None, json!({})),
        format!(
            "{SYSTEM}Reasoning: medium\n\n{CHANNELS}<|end|><|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|end|><|start|>user<|message|>What is 2+2?<|end|><|start|>assistant"
        )
    );
    // The effort goes into the system message; the first system message is the
    // developer's instructions.
    let msgs = [ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi")];
    assert_eq!(
        render(&msgs, None, json!({"reasoning_effort": "high"})),
        format!(
            "{SYSTEM}Reasoning: high\n\n{CHANNELS}<|end|><|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|><|start|>user<|message|>Hi<|end|><|start|>assistant"
        )
    );
}

#[test]
fn tools_calls_and_results() {
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
                "days": {"type": "array", "items": {"type": "integer"}},
                "where": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}}, "required": ["lat"]}},
            "required": ["city"]}}},
        {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
    ]);
    let mut call = ChatMessage::new("assistant", "");
    call.thinking = Some("Need the weather.".into());
    call.tool_calls = Some(vec![
        json!({"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}),
        json!({"id": "c2", "type": "function", "function": {"name": "now", "arguments": {}}}),
    ]);
    let mut r1 = ChatMessage::new("tool", "18C");
    r1.name = Some("get_weather".into());
    let r2 = ChatMessage::new("tool", "noon");
    let msgs = vec![ChatMessage::new("user", "Weather?"), call, r1, r2];
    let developer = "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n// Weather for a city\ntype get_weather = (_: {\n// City name\ncity: string,\nunit?: \"c\" | \"f\", // default: c,\ndays?: number[],\nwhere?: {\nlat: \n                number, lon?: \n                number},\n}) => any;\n\ntype now = () => any;\n\n} // namespace functions<|end|>";
    let turns = "<|start|>user<|message|>Weather?<|end|><|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|><|start|>assistant to=functions.now<|channel|>commentary json<|message|>{}<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"18C\"<|end|><|start|>functions.now to=assistant<|channel|>commentary<|message|>\"noon\"<|end|>";
    let tools_line = "\nCalls to these tools must go to the commentary channel: 'functions'.";
    assert_eq!(
        render(&msgs, Some(&tools), json!({"reasoning_effort": "low"})),
        format!("{SYSTEM}Reasoning: low\n\n{CHANNELS}{tools_line}<|end|>{developer}{turns}<|start|>assistant")
    );
    // Once an answer follows, the call turn's reasoning is dropped.
    let mut later = msgs.clone();
    later.push(ChatMessage::new("assistant", "18C and noon."));
    later.push(ChatMessage::new("user", "Thanks"));
    let out = render(&later, Some(&tools), json!({}));
    assert!(!out.contains("Need the weather."), "{out}");
    assert!(out.ends_with("<|start|>assistant<|channel|>final<|message|>18C and noon.<|end|><|start|>user<|message|>Thanks<|end|><|start|>assistant"), "{out}");
}

#[test]
fn a_tool_result_without_a_call_is_an_error() {
    let err = template().render(&[ChatMessage::new("tool", "x")], None, true).unwrap_err().to_string();
    assert!(err.contains("no call before it"), "{err}");
}

#[test]
fn the_format_is_recognised() {
    assert!(speaks(builtin().text));
    assert!(!speaks("<|im_start|>{{ m.content }}<|im_end|>"));
    assert!(vocabulary_has(|t| [START, CHANNEL, MESSAGE, END, RETURN, CALL].contains(&t)));
    assert!(!vocabulary_has(|t| t != CALL));
}
