//! The tool-call syntaxes of the common GGUF model families, and which one a model's
//! chat template speaks.
//!
//! - Hermes / Qwen: `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>`, one block
//!   per call. Also corral's fallback for templates with no tool syntax.
//! - Llama 3.x (JSON tool calling): the whole answer is `{"name": …, "parameters": …}`,
//!   optionally after the `<|python_tag|>` control token.
//! - Mistral: the `[TOOL_CALLS]` control token, then a JSON array of
//!   `{"name": …, "arguments": …}`.
//!
//! - Harmony (gpt-oss): a message addressed to `functions.NAME` whose body is the
//!   arguments; read and enforced by `crate::harmony`, not here.
//!
//! Control tokens render as no text, so the parsers see only the JSON after them.

use super::ParsedCall;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syntax {
    Hermes,
    Llama3,
    Mistral,
    Harmony,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolFormat {
    pub syntax: Syntax,
    /// The chat template renders `tools`, `tool_calls` and tool results itself;
    /// otherwise corral's fallback prompt does (`prompt.rs`).
    pub native: bool,
    /// The control token that opens calls (`[TOOL_CALLS]`), when the vocabulary has one.
    pub marker_token: Option<u32>,
}

pub const HERMES_OPEN: &str = "<tool_call>";
pub const HERMES_CLOSE: &str = "</tool_call>";

impl ToolFormat {
    /// The format a chat template speaks; `token_id` looks a token text up in the
    /// vocabulary. A template with no known tool syntax gets the Hermes fallback.
    pub fn detect(template: Option<&str>, token_id: impl Fn(&str) -> Option<u32>) -> Self {
        let t = template.unwrap_or("");
        let reads_tools = t.contains("tools");
        let (syntax, native) = if crate::harmony::speaks(t) {
            (Syntax::Harmony, true)
        } else if t.contains(HERMES_OPEN) {
            (Syntax::Hermes, reads_tools)
        } else if t.contains("[TOOL_CALLS]") {
            (Syntax::Mistral, reads_tools)
        } else if t.contains("<|python_tag|>") || (t.contains("ipython") && t.contains("<|eot_id|>")) {
            (Syntax::Llama3, reads_tools)
        } else {
            (Syntax::Hermes, false)
        };
        let marker_token = match syntax {
            Syntax::Mistral => token_id("[TOOL_CALLS]"),
            _ => None,
        };
        Self { syntax, native, marker_token }
    }

    /// corral's fallback: Hermes syntax described in the system turn.
    pub fn fallback() -> Self {
        Self { syntax: Syntax::Hermes, native: false, marker_token: None }
    }

    pub fn name(&self) -> &'static str {
        match (self.syntax, self.native) {
            (Syntax::Hermes, false) => "fallback",
            (Syntax::Hermes, true) => "hermes",
            (Syntax::Llama3, _) => "llama3",
            (Syntax::Mistral, _) => "mistral",
            (Syntax::Harmony, _) => "harmony",
        }
    }

    /// The key that holds the arguments object.
    pub fn arguments_key(&self) -> &'static str {
        match self.syntax {
            Syntax::Llama3 => "parameters",
            Syntax::Hermes | Syntax::Mistral | Syntax::Harmony => "arguments",
        }
    }

    /// The JSON object of one call, up to (not including) its arguments, exactly as the
    /// grammar writes it: `{"name": "f", "arguments": `.
    pub fn call_head(&self, name: &str) -> String {
        format!("{{\"name\": {}, \"{}\": ", json_str(name), self.arguments_key())
    }

    /// One call as text in this syntax (history rendering and the fallback prompt).
    pub fn call_text(&self, call: &ParsedCall) -> String {
        let object = format!("{}{}}}", self.call_head(&call.name), call.arguments);
        match self.syntax {
            Syntax::Hermes => format!("{HERMES_OPEN}\n{object}\n{HERMES_CLOSE}"),
            Syntax::Llama3 => object,
            Syntax::Mistral => format!("[{object}]"),
            Syntax::Harmony => format!(
                "<|start|>assistant to=functions.{}<|channel|>commentary json<|message|>{}<|call|>",
                call.name, call.arguments
            ),
        }
    }

    /// Several calls in one assistant turn.
    pub fn calls_text(&self, calls: &[ParsedCall]) -> String {
        match self.syntax {
            Syntax::Mistral => {
                let objects: Vec<String> =
                    calls.iter().map(|c| format!("{}{}}}", self.call_head(&c.name), c.arguments)).collect();
                format!("[{}]", objects.join(", "))
            }
            _ => calls.iter().map(|c| self.call_text(c)).collect::<Vec<_>>().join("\n"),
        }
    }
}

pub fn json_str(s: &str) -> String {
    serde_json::to_string(s).expect("a string always serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN: &str = "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\nFor each function call, return a json object within <tool_call></tool_call> XML tags<|im_end|>{% endif %}";
    const LLAMA: &str = "{%- if tools is not none %}Environment: ipython\n{% endif %}<|start_header_id|>{{ m.role }}<|end_header_id|>{{ '<|python_tag|>' }}<|eot_id|>";
    const MISTRAL: &str =
        "{%- if tools %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]{{ calls|tojson }}";
    const SMOLLM: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}";

    #[test]
    fn detects_each_family_and_falls_back() {
        let none = |_: &str| None;
        let f = ToolFormat::detect(Some(QWEN), none);
        assert_eq!((f.syntax, f.native, f.name()), (Syntax::Hermes, true, "hermes"));
        let f = ToolFormat::detect(Some(LLAMA), none);
        assert_eq!((f.syntax, f.native), (Syntax::Llama3, true));
        let f = ToolFormat::detect(Some(MISTRAL), |t| (t == "[TOOL_CALLS]").then_some(5));
        assert_eq!((f.syntax, f.native, f.marker_token), (Syntax::Mistral, true, Some(5)));
        assert_eq!(ToolFormat::detect(Some(SMOLLM), none), ToolFormat::fallback());
        assert_eq!(ToolFormat::detect(None, none), ToolFormat::fallback());
        assert_eq!(ToolFormat::fallback().name(), "fallback");
        let f = ToolFormat::detect(Some(crate::harmony::template::builtin().text), none);
        assert_eq!((f.syntax, f.native, f.name()), (Syntax::Harmony, true, "harmony"));
    }

    #[test]
    fn call_text_per_syntax() {
        let c = ParsedCall { name: "get_weather".into(), arguments: r#"{"city": "Paris"}"#.into() };
        let f = |syntax| ToolFormat { syntax, native: true, marker_token: None };
        assert_eq!(
            f(Syntax::Hermes).call_text(&c),
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
        );
        assert_eq!(f(Syntax::Llama3).call_text(&c), r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#);
        assert_eq!(
            f(Syntax::Mistral).calls_text(&[c.clone(), c.clone()]),
            r#"[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {"city": "Paris"}}]"#
        );
        assert_eq!(f(Syntax::Hermes).calls_text(&[c.clone(), c]).matches(HERMES_OPEN).count(), 2);
    }
}
