//! What a request asks the output to be, independent of how it is enforced: a JSON
//! schema, any JSON object, a regex, one of several strings, or a Lark grammar. Each
//! turns into an llguidance grammar, and each can state itself as an instruction for
//! the degrade path (when it cannot be enforced, the model is told instead).

use llguidance::api::GrammarWithLexer;
use serde_json::{Value, json};

#[derive(Clone, Debug, PartialEq)]
pub enum Constraint {
    JsonSchema(Value),
    JsonObject,
    Regex(String),
    Choice(Vec<String>),
    Lark(String),
}

/// JSON the way models write it (`{"a": 1, "b": 2}`), with no freedom in whitespace: a
/// small model given free whitespace can spend its whole budget on newlines. A schema
/// that sets its own `x-guidance` options keeps them.
fn json_options() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// Adds corral's JSON layout to a schema (an object schema without its own options).
pub fn with_json_layout(schema: &Value) -> Value {
    match schema {
        Value::Object(m) if !m.contains_key("x-guidance") => {
            let mut m = m.clone();
            m.insert("x-guidance".into(), json_options());
            Value::Object(m)
        }
        // `true` / `{}` style schemas: any JSON value, same layout.
        Value::Bool(true) => json!({"x-guidance": json_options()}),
        other => other.clone(),
    }
}

/// A Lark string literal for `s` (Lark literals are JSON-decoded by llguidance).
pub fn lark_literal(s: &str) -> String {
    serde_json::to_string(s).expect("a string always serializes")
}

impl Constraint {
    /// A short name for logs and warnings.
    pub fn kind(&self) -> &'static str {
        match self {
            Constraint::JsonSchema(_) => "json_schema",
            Constraint::JsonObject => "json_object",
            Constraint::Regex(_) => "regex",
            Constraint::Choice(_) => "choice",
            Constraint::Lark(_) => "grammar",
        }
    }

    /// The output is JSON.
    pub fn is_json(&self) -> bool {
        matches!(self, Constraint::JsonSchema(_) | Constraint::JsonObject)
    }

    /// The grammar as one named llguidance grammar (other grammars refer to it as
    /// `@name`).
    pub fn grammar(&self, name: &str) -> GrammarWithLexer {
        let mut g = match self {
            Constraint::JsonSchema(s) => GrammarWithLexer::from_json_schema(with_json_layout(s)),
            Constraint::JsonObject => GrammarWithLexer::from_json_schema(with_json_layout(&json!({"type": "object"}))),
            Constraint::Regex(rx) => GrammarWithLexer::from_regex(rx),
            Constraint::Choice(options) => {
                let alts: Vec<String> = options.iter().map(|o| lark_literal(o)).collect();
                GrammarWithLexer::from_lark(format!("start: {}\n", alts.join(" | ")))
            }
            Constraint::Lark(text) => GrammarWithLexer::from_lark(text.clone()),
        };
        g.name = Some(name.to_owned());
        g
    }

    /// The instruction a chat request gets when the constraint is not enforced: it
    /// states the required output verbatim.
    pub fn instruction(&self) -> String {
        match self {
            Constraint::JsonSchema(s) => format!(
                "Respond with only a JSON value that conforms to this JSON Schema, and nothing else:\n{}",
                serde_json::to_string(s).unwrap_or_default()
            ),
            Constraint::JsonObject => "Respond with only a valid JSON object, and nothing else.".into(),
            Constraint::Regex(rx) => {
                format!("Respond with only text that fully matches this regular expression, and nothing else:\n{rx}")
            }
            Constraint::Choice(options) => format!(
                "Respond with exactly one of these options, and nothing else:\n{}",
                options.iter().map(|o| format!("- {o}")).collect::<Vec<_>>().join("\n")
            ),
            Constraint::Lark(g) => {
                format!("Respond with only text that this grammar (Lark syntax) accepts, and nothing else:\n{g}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_layout_is_added_but_never_overrides() {
        let s = with_json_layout(&json!({"type": "object"}));
        assert_eq!(s["x-guidance"]["key_separator"], ": ");
        let own = json!({"type": "object", "x-guidance": {"whitespace_flexible": true}});
        assert_eq!(with_json_layout(&own), own);
        assert!(with_json_layout(&json!(true))["x-guidance"].is_object());
    }

    #[test]
    fn choices_become_escaped_lark_literals() {
        let g = Constraint::Choice(vec!["a\"b".into(), "c\\d".into()]).grammar("answer");
        assert_eq!(g.lark_grammar.as_deref(), Some("start: \"a\\\"b\" | \"c\\\\d\"\n"));
        assert_eq!(g.name.as_deref(), Some("answer"));
    }

    #[test]
    fn instructions_state_the_constraint_verbatim() {
        let s = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        assert!(Constraint::JsonSchema(s.clone()).instruction().contains(&serde_json::to_string(&s).unwrap()));
        assert!(Constraint::Regex("[0-9]{3}".into()).instruction().ends_with("[0-9]{3}"));
        assert!(Constraint::Choice(vec!["yes".into(), "no".into()]).instruction().contains("- no"));
        assert!(Constraint::Lark("start: \"x\"".into()).instruction().contains("start: \"x\""));
    }
}
