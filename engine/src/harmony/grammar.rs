//! The grammar a harmony answer decodes under when a request has tools or a response
//! format, in llguidance's Lark dialect (the generation prompt ends in
//! `<|start|>assistant`, so the grammar starts at the first message's header).
//!
//! Any number of `analysis` messages may come first (as llama.cpp's gpt-oss grammar
//! allows), each ending in `<|end|><|start|>assistant`. Then:
//! - a call: `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>` and
//!   arguments under that tool's schema; generation then ends (`<|call|>`);
//! - or, unless a call is required, the answer: `<|channel|>final<|message|>` and the
//!   request's constraint (`@answer`), or free text that holds no harmony marker.
//!
//! One call per answer: harmony ends the assistant's turn at each call.

use llguidance::api::{GrammarWithLexer, TopLevelGrammar};

use super::{CHANNEL, CONSTRAIN, END, FUNCTIONS, MESSAGE, START};
use crate::grammar::{Constraint, lark_literal, with_json_layout};
use crate::tools::{ToolMode, ToolRequest};

/// The grammar for `tools` (if any) and the answer's `constraint` (if any); at least one
/// of them is given.
pub fn grammar(tools: Option<&ToolRequest>, constraint: Option<&Constraint>) -> TopLevelGrammar {
    let mut grammars = vec![GrammarWithLexer::default()];
    let mut calls = Vec::new();
    for (i, tool) in tools.map(|t| t.tools.as_slice()).unwrap_or_default().iter().enumerate() {
        if !tools.is_some_and(|t| t.callable().any(|c| c.name == tool.name)) {
            continue;
        }
        let mut g = GrammarWithLexer::from_json_schema(with_json_layout(&tool.parameters));
        g.name = Some(format!("args_{i}"));
        grammars.push(g);
        let head = format!("{CHANNEL}commentary to={FUNCTIONS}{} {CONSTRAIN}json{MESSAGE}", tool.name);
        calls.push(format!("{} @args_{i}", lark_literal(&head)));
    }
    let answer = match constraint {
        Some(c) => {
            grammars.push(c.grammar("answer"));
            "@answer".to_owned()
        }
        None => "FREE".to_owned(),
    };
    let markers: Vec<String> = [START, END, MESSAGE, CHANNEL, CONSTRAIN].iter().map(|m| regex_literal(m)).collect();
    let analysis_open = lark_literal(&format!("{CHANNEL}analysis{MESSAGE}"));
    let mut lark = format!(
        "analysis: {analysis_open} thought {}\n\
         thought[suffix={}]: /(?s:.*)/\n\
         final: {} {answer}\n\
         FREE: /(?s:.*)/ & ~/(?s:.*({}).*)/\n",
        lark_literal(&format!("{START}assistant")),
        lark_literal(END),
        lark_literal(&format!("{CHANNEL}final{MESSAGE}")),
        markers.join("|"),
    );
    let required = tools.is_some_and(|t| t.mode != ToolMode::Auto);
    let tail = match (calls.is_empty(), required) {
        (true, _) => "final".to_owned(),
        (false, true) => "call".to_owned(),
        (false, false) => "final | call".to_owned(),
    };
    if !calls.is_empty() {
        lark.push_str(&format!("call: {}\n", calls.join(" | ")));
    }
    lark.push_str(&format!("start: analysis* ({tail})\n"));
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

    /// Whether the grammar takes `text` (fed byte by byte) and may end after it.
    fn accepts(g: TopLevelGrammar, text: &str) -> bool {
        let env: TokEnv = Arc::new(ApproximateTokEnv::single_byte());
        let mut f = ParserFactory::new_simple(&env).unwrap();
        f.quiet();
        let mut m = Matcher::new(f.create_parser(g));
        assert!(!m.is_error(), "{:?}", m.get_error());
        for b in text.bytes() {
            if m.consume_token(b as u32).is_err() {
                return false;
            }
        }
        m.is_accepting().unwrap_or(false)
    }

    fn tools(mode: ToolMode) -> ToolRequest {
        let city = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false});
        ToolRequest {
            tools: vec![
                ToolDef { name: "get_weather".into(), description: None, parameters: city },
                ToolDef {
                    name: "now".into(),
                    description: None,
                    parameters: json!({"type": "object", "properties": {}}),
                },
            ],
            mode,
            parallel: false,
        }
    }

    const THINK: &str = "<|channel|>analysis<|message|>Need weather <|en.<|end|><|start|>assistant";
    const CALL: &str =
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}";
    const ANSWER: &str = "<|channel|>final<|message|>It is sunny.";

    #[test]
    fn required_takes_reasoning_then_one_valid_call() {
        let g = || grammar(Some(&tools(ToolMode::Required)), None);
        assert!(accepts(g(), CALL));
        assert!(accepts(g(), &format!("{THINK}{THINK}{CALL}")));
        assert!(!accepts(g(), ANSWER), "a call is required");
        assert!(!accepts(g(), &CALL.replace("Paris\"", "Paris\", \"x\": 1")), "arguments follow the schema");
        assert!(!accepts(g(), &CALL.replace("get_weather", "get_wether")), "only known tools");
        let named = || grammar(Some(&tools(ToolMode::Named("now".into()))), None);
        assert!(!accepts(named(), CALL));
        assert!(accepts(named(), "<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}"));
    }

    #[test]
    fn auto_takes_an_answer_or_a_call() {
        let g = || grammar(Some(&tools(ToolMode::Auto)), None);
        assert!(accepts(g(), &format!("{THINK}{ANSWER}")));
        assert!(accepts(g(), CALL));
        assert!(!accepts(g(), &format!("{ANSWER}<|end|><|start|>assistant{CALL}")), "the answer holds no marker");
        assert!(!accepts(g(), "It is sunny."), "every message has its header");
    }

    #[test]
    fn a_response_format_constrains_the_final_answer() {
        let schema = Constraint::JsonSchema(
            json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
        );
        let g = || grammar(None, Some(&schema));
        assert!(accepts(g(), "<|channel|>final<|message|>{\"a\": 1}"));
        assert!(accepts(g(), &format!("{THINK}<|channel|>final<|message|>{{\"a\": 2}}")));
        assert!(!accepts(g(), ANSWER));
        // With tools under auto: the answer follows the schema, or a call.
        let both = || grammar(Some(&tools(ToolMode::Auto)), Some(&schema));
        assert!(accepts(both(), CALL));
        assert!(!accepts(both(), ANSWER));
    }
}
