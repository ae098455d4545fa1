//! The grammar a tool request decodes under, in llguidance's Lark dialect.
//!
//! Each call is written in its format's exact layout with its tool's name fixed and its
//! arguments under the tool's JSON schema (`@args_i`, one JSON-schema grammar per
//! tool). `required` and a named tool allow only calls; `auto` allows either an answer
//! (free text that never contains the call opener, or the request's own constraint as
//! `@answer`) or calls. In Hermes syntax `auto` may also write text before its calls:
//! a lazy lexeme ends that text at the first `<tool_call>`.

use llguidance::api::{GrammarWithLexer, TopLevelGrammar};

use super::format::{HERMES_CLOSE, HERMES_OPEN, Syntax, ToolFormat};
use super::{ToolMode, ToolRequest};
use crate::grammar::{Constraint, lark_literal, with_json_layout};

/// The grammar for `req` in format `fmt`; `answer` constrains a non-call answer under
/// `auto`.
pub fn tool_grammar(fmt: &ToolFormat, req: &ToolRequest, answer: Option<&Constraint>) -> TopLevelGrammar {
    if fmt.syntax == Syntax::Harmony {
        return crate::harmony::grammar::grammar(Some(req), answer);
    }
    let mut grammars = vec![GrammarWithLexer::default()];
    let mut bodies = Vec::new();
    for (i, tool) in req.tools.iter().enumerate() {
        if !req.callable().any(|t| t.name == tool.name) {
            continue;
        }
        let mut g = GrammarWithLexer::from_json_schema(with_json_layout(&tool.parameters));
        g.name = Some(format!("args_{i}"));
        grammars.push(g);
        bodies.push(format!("{} @args_{i} \"}}\"", lark_literal(&fmt.call_head(&tool.name))));
    }
    let auto = req.mode == ToolMode::Auto;
    let answer_rule = match answer {
        Some(c) if auto => {
            grammars.push(c.grammar("answer"));
            Some("@answer".to_owned())
        }
        _ => None,
    };
    let mut lark = String::new();
    let call_body = bodies.join(" | ");
    match fmt.syntax {
        Syntax::Hermes => {
            let (open, close) = (lark_literal(&format!("{HERMES_OPEN}\n")), lark_literal(&format!("\n{HERMES_CLOSE}")));
            let more = if req.parallel { " (\"\\n\" call)*" } else { "" };
            lark.push_str(&format!("call: {open} body {close}\nbody: {call_body}\n"));
            match (auto, answer_rule) {
                (false, _) => lark.push_str(&format!("start: call{more}\n")),
                (true, Some(a)) => lark.push_str(&format!("start: {a} | call{more}\n")),
                (true, None) => {
                    // An answer never contains the opener; text before calls ends at it.
                    let opener = regex_literal(HERMES_OPEN);
                    lark.push_str(&format!(
                        "start: FREE | lead \"\\n\" body {close}{more}\n\
                         FREE: /(?s:.*)/ & ~/(?s:.*{opener}.*)/\n\
                         lead[suffix={}]: /(?s:.*)/\n",
                        lark_literal(HERMES_OPEN)
                    ));
                }
            }
        }
        Syntax::Llama3 => {
            lark.push_str(&format!("call: {call_body}\n"));
            lark.push_str(&match (auto, answer_rule) {
                (false, _) => "start: call\n".to_owned(),
                (true, Some(a)) => format!("start: {a} | call\n"),
                (true, None) => "start: FREE | call\nFREE: /[^{](?s:.*)/\n".to_owned(),
            });
        }
        Syntax::Harmony => unreachable!("harmony's grammar is built above"),
        Syntax::Mistral => {
            let marker = fmt.marker_token.map(|id| format!("<[{id}]> ")).unwrap_or_default();
            let more = if req.parallel { " (\", \" body)*" } else { "" };
            lark.push_str(&format!("calls: {marker}\"[\" body{more} \"]\"\nbody: {call_body}\n"));
            lark.push_str(&match (auto, answer_rule) {
                (false, _) => "start: calls\n".to_owned(),
                (true, Some(a)) => format!("start: {a} | calls\n"),
                (true, None) => "start: FREE | calls\nFREE: /[^\\[](?s:.*)/\n".to_owned(),
            });
        }
    }
    grammars[0] = GrammarWithLexer::from_lark(lark);
    TopLevelGrammar { grammars, max_tokens: None }
}

/// `s` as a regex matching itself literally (inside a Lark `/…/`).
fn regex_literal(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c.to_string() } else { format!("\\x{:02x}", c as u32) })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use llguidance::{Matcher, ParserFactory};
    use serde_json::json;
    use toktrie::{ApproximateTokEnv, TokEnv};

    use super::*;
    use crate::tools::ToolDef;

    /// A one-byte-per-token vocabulary: any text can be fed to the matcher byte by byte.
    fn factory() -> ParserFactory {
        let env: TokEnv = Arc::new(ApproximateTokEnv::single_byte());
        let mut f = ParserFactory::new_simple(&env).unwrap();
        f.quiet();
        f
    }

    /// Whether the grammar takes `text` and may end after it.
    fn accepts(g: TopLevelGrammar, text: &str) -> bool {
        let mut m = Matcher::new(factory().create_parser(g));
        assert!(!m.is_error(), "{:?}", m.get_error());
        for b in text.bytes() {
            if m.consume_token(b as u32).is_err() {
                return false;
            }
        }
        m.is_accepting().unwrap_or(false)
    }

    fn req(mode: ToolMode, parallel: bool) -> ToolRequest {
        let weather = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false});
        ToolRequest {
            tools: vec![
                ToolDef { name: "get_weather".into(), description: None, parameters: weather },
                ToolDef {
                    name: "get_time".into(),
                    description: None,
                    parameters: json!({"type": "object", "properties": {}, "additionalProperties": false}),
                },
            ],
            mode,
            parallel,
        }
    }

    const W: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    const T: &str = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";

    #[test]
    fn hermes_required_takes_only_valid_calls() {
        let fmt = ToolFormat::fallback();
        let g = || tool_grammar(&fmt, &req(ToolMode::Required, true), None);
        assert!(accepts(g(), W));
        assert!(accepts(g(), &format!("{W}\n{T}")), "parallel calls");
        assert!(!accepts(g(), "Sure!"), "text is not a call");
        assert!(!accepts(g(), &W.replace("Paris\"", "Paris\", \"x\": 1")), "arguments follow the schema");
        assert!(!accepts(g(), &W.replace("get_weather", "get_wether")), "only known tools");
        let single = tool_grammar(&fmt, &req(ToolMode::Required, false), None);
        assert!(!accepts(single, &format!("{W}\n{T}")), "parallel_tool_calls: false");
    }

    #[test]
    fn hermes_named_takes_only_that_tool() {
        let g = || tool_grammar(&ToolFormat::fallback(), &req(ToolMode::Named("get_time".into()), true), None);
        assert!(accepts(g(), T));
        assert!(!accepts(g(), W));
    }

    #[test]
    fn hermes_auto_takes_text_or_text_then_calls() {
        let g = || tool_grammar(&ToolFormat::fallback(), &req(ToolMode::Auto, true), None);
        assert!(accepts(g(), "It is sunny."));
        assert!(accepts(g(), W));
        assert!(accepts(g(), &format!("Let me check.\n{W}")));
        assert!(!accepts(g(), "<tool_call>\nnot json"), "once a call starts it must parse");
        let with_answer = || {
            let schema = Constraint::JsonSchema(
                json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
            );
            tool_grammar(&ToolFormat::fallback(), &req(ToolMode::Auto, true), Some(&schema))
        };
        assert!(accepts(with_answer(), "{\"a\": 1}"));
        assert!(accepts(with_answer(), W));
        assert!(!accepts(with_answer(), "free text"));
    }

    #[test]
    fn llama3_and_mistral_layouts() {
        let llama = ToolFormat { syntax: Syntax::Llama3, native: true, marker_token: None };
        let call = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}";
        assert!(accepts(tool_grammar(&llama, &req(ToolMode::Required, true), None), call));
        assert!(accepts(tool_grammar(&llama, &req(ToolMode::Auto, true), None), "No call needed."));
        assert!(!accepts(tool_grammar(&llama, &req(ToolMode::Auto, true), None), "{\"name\": \"x\"}"));
        let mistral = ToolFormat { syntax: Syntax::Mistral, native: true, marker_token: None };
        let calls = "[{\"name\": \"get_time\", \"arguments\": {}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]";
        assert!(accepts(tool_grammar(&mistral, &req(ToolMode::Required, true), None), calls));
        assert!(!accepts(tool_grammar(&mistral, &req(ToolMode::Required, false), None), calls));
    }
}
