//! A chat request's messages, validated and shaped for the chat template.
//!
//! History tool calls and tool results are kept: a template that renders tools gets
//! them in the Hugging Face shape (`tool_calls` with arguments as objects, `role:
//! "tool"` with `tool_call_id`; a call's turn without text has content `""`, never null,
//! as llama.cpp gives it: Qwen 3's template tests `'</think>' in message.content`, which
//! fails on null); any other template gets corral's fallback (calls
//! written into the assistant's text in the fallback syntax, results as a user turn in
//! `<tool_response>`). Text the server must add — the fallback tool prompt, the
//! instruction of an unenforced constraint — goes in front of the system turn.

use corral_protocol::ApiError;
use corral_protocol::openai::{Content, MessageIn};
use serde_json::{Value, json};

use crate::chat::ChatMessage;
use crate::tools::ParsedCall;
use crate::tools::format::{Syntax, ToolFormat};
use crate::tools::prompt::tool_response;

/// One message after validation.
#[derive(Clone, Debug, PartialEq)]
pub struct Turn {
    pub role: &'static str,
    pub text: String,
    /// Assistant turns: calls made, with the client's ids.
    pub calls: Vec<(Option<String>, ParsedCall)>,
    pub tool_call_id: Option<String>,
    /// Assistant turns: the reasoning the client sent back with it.
    pub reasoning: Option<String>,
}

pub fn turns(messages: &[MessageIn]) -> Result<Vec<Turn>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    messages.iter().enumerate().map(|(i, m)| turn(i, m)).collect()
}

fn turn(i: usize, m: &MessageIn) -> Result<Turn, ApiError> {
    let role = match m.role.as_str() {
        "developer" | "system" => "system",
        "user" => "user",
        "assistant" => "assistant",
        "tool" => "tool",
        other => return Err(ApiError::invalid(&format!("messages[{i}].role"), format!("unknown role {other:?}"))),
    };
    let mut calls = Vec::new();
    for (j, c) in m.tool_calls.iter().flatten().enumerate() {
        if role != "assistant" {
            return Err(ApiError::invalid(
                &format!("messages[{i}].tool_calls"),
                "only assistant messages carry tool_calls",
            ));
        }
        let param = format!("messages[{i}].tool_calls[{j}].function.arguments");
        let args = match &c.function.arguments {
            None => json!({}),
            Some(Value::String(s)) if s.trim().is_empty() => json!({}),
            Some(Value::String(s)) => serde_json::from_str::<Value>(s)
                .map_err(|e| ApiError::invalid(&param, format!("{param} is not valid JSON: {e}")))?,
            Some(v) => v.clone(),
        };
        calls.push((c.id.clone(), ParsedCall { name: c.function.name.clone(), arguments: args.to_string() }));
    }
    let reasoning = m.reasoning_content.clone().filter(|r| role == "assistant" && !r.is_empty());
    Ok(Turn { role, text: text(i, &m.content)?, calls, tool_call_id: m.tool_call_id.clone(), reasoning })
}

fn text(i: usize, content: &Option<Content>) -> Result<String, ApiError> {
    let param = format!("messages[{i}].content");
    match content {
        None => Ok(String::new()),
        Some(Content::Text(s)) => Ok(s.clone()),
        Some(Content::Parts(parts)) => {
            let mut out = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => out.push_str(t),
                    ("text", None) => {
                        return Err(ApiError::invalid(&format!("{param}[{j}].text"), "a text part needs `text`"));
                    }
                    (other, _) => {
                        return Err(ApiError::invalid(
                            &format!("{param}[{j}].type"),
                            format!("content part type {other:?} is not supported by this model"),
                        ));
                    }
                }
            }
            Ok(out)
        }
    }
}

/// The messages the template renders. `system` texts go in front of the system turn
/// (one is created when the conversation has none).
pub fn template_messages(turns: &[Turn], fmt: &ToolFormat, system: &[String]) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(turns.len() + 1);
    for (i, t) in turns.iter().enumerate() {
        if fmt.native {
            let mut m = native(t);
            if fmt.syntax == Syntax::Harmony && t.role == "tool" {
                // Harmony names the tool a result comes from: the call with its id.
                m.name = called(&turns[..i], t.tool_call_id.as_deref());
            }
            out.push(m);
        } else if t.role == "tool" {
            let text = tool_response(&t.text);
            // Results of parallel calls share one user turn.
            match out.last_mut() {
                Some(prev)
                    if prev.role == "user"
                        && prev.content.as_deref().is_some_and(|c| c.ends_with("</tool_response>")) =>
                {
                    let c = prev.content.get_or_insert_default();
                    c.push('\n');
                    c.push_str(&text);
                }
                _ => out.push(ChatMessage::new("user", &text)),
            }
        } else if t.calls.is_empty() {
            out.push(ChatMessage::new(t.role, &t.text));
        } else {
            let calls: Vec<ParsedCall> = t.calls.iter().map(|(_, c)| c.clone()).collect();
            let sep = if t.text.is_empty() { "" } else { "\n" };
            out.push(ChatMessage::new(t.role, &format!("{}{sep}{}", t.text, fmt.calls_text(&calls))));
        }
    }
    if !system.is_empty() {
        let extra = system.join("\n\n");
        match out.first_mut() {
            Some(first) if first.role == "system" => {
                let own = first.content.take().unwrap_or_default();
                first.content = Some(if own.is_empty() { extra } else { format!("{extra}\n\n{own}") });
            }
            _ => out.insert(0, ChatMessage::new("system", &extra)),
        }
    }
    out
}

fn native(t: &Turn) -> ChatMessage {
    let mut m = ChatMessage::new(t.role, &t.text);
    if !t.calls.is_empty() {
        m.tool_calls = Some(
            t.calls
                .iter()
                .enumerate()
                .map(|(k, (id, c))| {
                    let args: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
                    let id = id.clone().unwrap_or_else(|| format!("call_{k}"));
                    json!({"id": id, "type": "function", "function": {"name": c.name, "arguments": args}})
                })
                .collect(),
        );
    }
    m.tool_call_id = t.tool_call_id.clone();
    m.thinking = t.reasoning.clone();
    m
}

/// The name of the tool that the call with `id` (the latest call, without one) named.
fn called(before: &[Turn], id: Option<&str>) -> Option<String> {
    let mut calls = before.iter().rev().flat_map(|t| t.calls.iter().rev());
    match id {
        Some(id) => calls.find(|(cid, _)| cid.as_deref() == Some(id)).map(|(_, c)| c.name.clone()),
        None => calls.next().map(|(_, c)| c.name.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(json: &str) -> Vec<MessageIn> {
        serde_json::from_str(json).unwrap()
    }

    const HISTORY: &str = r#"[
        {"role":"user","content":"Weather in Paris and Rome?"},
        {"role":"assistant","content":null,"tool_calls":[
            {"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},
            {"id":"c2","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Rome\"}"}}]},
        {"role":"tool","tool_call_id":"c1","content":"18C"},
        {"role":"tool","tool_call_id":"c2","content":"24C"}]"#;

    #[test]
    fn fallback_writes_calls_and_merges_results() {
        let t = turns(&msgs(HISTORY)).unwrap();
        let out = template_messages(&t, &ToolFormat::fallback(), &["TOOLS".into()]);
        let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert_eq!(out[0].content.as_deref(), Some("TOOLS"));
        let a = out[2].content.as_deref().unwrap();
        assert_eq!(a.matches("<tool_call>").count(), 2);
        assert!(a.contains(r#"{"name": "get_weather", "arguments": {"city":"Paris"}}"#), "{a}");
        assert_eq!(
            out[3].content.as_deref(),
            Some("<tool_response>\n18C\n</tool_response>\n<tool_response>\n24C\n</tool_response>")
        );
    }

    #[test]
    fn native_keeps_the_hugging_face_shape() {
        let t = turns(&msgs(HISTORY)).unwrap();
        let fmt = ToolFormat { syntax: Syntax::Hermes, native: true, marker_token: None };
        let out = template_messages(&t, &fmt, &[]);
        assert_eq!(out.len(), 4);
        assert_eq!(out[1].content.as_deref(), Some(""), "a call's turn without text: empty content, not null");
        let calls = out[1].tool_calls.as_ref().unwrap();
        assert_eq!(calls[1]["function"]["arguments"]["city"], "Rome");
        assert_eq!(calls[0]["id"], "c1");
        assert_eq!((out[2].role.as_str(), out[2].tool_call_id.as_deref()), ("tool", Some("c1")));
    }

    /// A Hermes-style template that renders tools itself (written for this test in the
    /// shape of Qwen 2.5's): the native path end to end through minijinja.
    const NATIVE: &str = concat!(
        "{%- if tools %}<|im_start|>system\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>",
        "\nCall tools inside <tool_call></tool_call>.<|im_end|>\n{% endif %}",
        "{%- for m in messages %}",
        "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant",
        "{%- for tc in m.tool_calls %}\n<tool_call>\n{\"name\": \"{{ tc.function.name }}\", \"arguments\": {{ tc.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n",
        "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n",
        "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}",
        "{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    );

    #[test]
    fn a_template_with_tool_syntax_renders_tools_and_history_itself() {
        use crate::chat::ChatTemplate;
        let fmt = ToolFormat::detect(Some(NATIVE), |_| None);
        assert!(fmt.native && fmt.syntax == Syntax::Hermes);
        let t = ChatTemplate::new(Some(NATIVE), None, "", "", false).unwrap();
        let msgs = template_messages(&turns(&msgs(HISTORY)).unwrap(), &fmt, &[]);
        let tools =
            json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
        let out = t.render(&msgs, Some(&tools), true).unwrap();
        // (The template's own whitespace is trimmed by minijinja's block options.)
        assert!(out.starts_with("<|im_start|>system\n<tools>{"), "{out}");
        // `tojson` as Python's `json.dumps`, the tool's keys in the order given.
        assert!(out.contains("{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""), "{out}");
        assert!(
            out.contains("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>"),
            "{out}"
        );
        assert!(out.contains("<tool_response>\n24C\n</tool_response>"), "{out}");
        assert!(out.ends_with("<|im_start|>assistant\n"), "{out}");
    }

    /// Qwen 3's template reads every assistant turn's content as a string (its
    /// `'</think>' in message.content`, written here in that shape): a turn that only
    /// calls tools renders, as llama.cpp renders it.
    #[test]
    fn a_call_turn_without_text_renders_in_a_template_that_reads_its_content() {
        use crate::chat::ChatTemplate;
        let src = concat!(
            "{%- for m in messages %}{%- if m.role == 'assistant' %}",
            "{%- set content = m.content.split('</think>')[-1] if '</think>' in m.content else m.content %}",
            "[{{ content }}{% for tc in m.tool_calls %}<tool_call>{{ tc.function.arguments | tojson }}{% endfor %}]",
            "{%- else %}<{{ m.role }}:{{ m.content }}>{% endif %}{%- endfor %}",
        );
        let fmt = ToolFormat { syntax: Syntax::Hermes, native: true, marker_token: None };
        let t = ChatTemplate::new(Some(src), None, "", "", false).unwrap();
        let out = t.render(&template_messages(&turns(&msgs(HISTORY)).unwrap(), &fmt, &[]), None, false).unwrap();
        assert_eq!(
            out,
            r#"<user:Weather in Paris and Rome?>[<tool_call>{"city": "Paris"}<tool_call>{"city": "Rome"}]<tool:18C><tool:24C>"#
        );
    }

    #[test]
    fn harmony_results_name_their_tool_and_calls_keep_their_reasoning() {
        let mut history = turns(&msgs(HISTORY)).unwrap();
        history[1].reasoning = Some("Two cities.".into());
        history[1].calls[1].1.name = "get_time".into();
        history.swap(2, 3); // results out of order: each still finds its call by id
        let fmt = ToolFormat { syntax: Syntax::Harmony, native: true, marker_token: None };
        let out = template_messages(&history, &fmt, &[]);
        assert_eq!(out[1].thinking.as_deref(), Some("Two cities."));
        let named = |m: &ChatMessage| (m.tool_call_id.clone(), m.name.clone());
        assert_eq!(named(&out[2]), (Some("c2".into()), Some("get_time".into())));
        assert_eq!(named(&out[3]), (Some("c1".into()), Some("get_weather".into())));
        let ids = [None, Some("c1"), Some("nope")].map(|id| called(&history[..2], id));
        assert_eq!(ids, [Some("get_time".to_owned()), Some("get_weather".to_owned()), None]);
        // Other native formats keep the message as the client sent it.
        let hermes = ToolFormat { syntax: Syntax::Hermes, native: true, marker_token: None };
        assert_eq!(template_messages(&history, &hermes, &[])[2].name, None);
        let m: Vec<MessageIn> = msgs(r#"[{"role":"assistant","content":"x","reasoning_content":"r"}]"#);
        assert_eq!(turns(&m).unwrap()[0].reasoning.as_deref(), Some("r"));
    }

    #[test]
    fn system_text_goes_in_front_of_the_system_turn() {
        let t = turns(&msgs(r#"[{"role":"developer","content":"Be brief."},{"role":"user","content":"Hi"}]"#)).unwrap();
        let out = template_messages(&t, &ToolFormat::fallback(), &["A".into(), "B".into()]);
        assert_eq!(out[0].content.as_deref(), Some("A\n\nB\n\nBe brief."));
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn bad_history_is_a_400_naming_the_field() {
        let e = turns(&msgs(r#"[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{oops"}}]}]"#))
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].tool_calls[0].function.arguments"));
        let e = turns(&msgs(r#"[{"role":"user","tool_calls":[{"function":{"name":"f"}}]}]"#)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].tool_calls"));
        assert!(turns(&[]).is_err());
    }
}
