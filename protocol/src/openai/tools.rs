//! Function tools on `/v1/chat/completions`: the request's `tools` and `tool_choice`,
//! the `tool_calls` of assistant messages (in history and in responses) and their
//! streaming deltas.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One entry of `tools`. Only `type: "function"` exists today; the engine refuses others.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: Option<FunctionDef>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct FunctionDef {
    pub name: String,
    pub description: Option<String>,
    /// A JSON schema for the arguments object; absent means no arguments.
    pub parameters: Option<Value>,
    /// Accepted for compatibility: calls are always decoded under the schema.
    pub strict: Option<bool>,
}

/// `"auto" | "none" | "required"` or `{"type":"function","function":{"name":…}}`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum ToolChoice {
    Mode(String),
    Named(NamedToolChoice),
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct NamedToolChoice {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: ToolName,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct ToolName {
    pub name: String,
}

/// A call as a client sends it back in history. `arguments` is a JSON string per
/// OpenAI; some clients send the object itself, which is accepted too.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct ToolCallIn {
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub function: FunctionCallIn,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct FunctionCallIn {
    pub name: String,
    pub arguments: Option<Value>,
}

/// A call in a response: `arguments` is the JSON text of the arguments object.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// A streamed fragment of a call: the first for an index carries `id`, `type` and the
/// name; later ones carry pieces of `arguments` to be concatenated.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub function: FunctionCallDelta,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct FunctionCallDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_choice_forms() {
        let c = |s: &str| serde_json::from_str::<ToolChoice>(s).unwrap();
        assert_eq!(c(r#""required""#), ToolChoice::Mode("required".into()));
        let ToolChoice::Named(n) = c(r#"{"type":"function","function":{"name":"f"}}"#) else { panic!("named") };
        assert_eq!(n.function.name, "f");
    }

    #[test]
    fn history_calls_take_string_or_object_arguments() {
        let s: ToolCallIn =
            serde_json::from_str(r#"{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}"#)
                .unwrap();
        assert_eq!(s.function.arguments, Some(Value::String("{\"a\":1}".into())));
        let o: ToolCallIn = serde_json::from_str(r#"{"function":{"name":"f","arguments":{"a":1}}}"#).unwrap();
        assert!(o.function.arguments.unwrap().is_object());
    }
}
