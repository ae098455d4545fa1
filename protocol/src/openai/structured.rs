//! Structured-output request fields: OpenAI's `response_format` and vLLM's
//! `guided_*` / `structured_outputs`. Shapes only: which constraint wins, and what a
//! conflict or a bad value means, is decided by the engine.

use serde::Deserialize;
use serde_json::Value;

/// `response_format`, tagged by `type`; any other `type` is a 400 naming the field.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct JsonSchemaFormat {
    pub name: Option<String>,
    pub description: Option<String>,
    /// Absent: any JSON object.
    pub schema: Option<Value>,
    /// Accepted for compatibility: constrained decoding is always strict.
    pub strict: Option<bool>,
}

/// vLLM's newer `structured_outputs` object: exactly one member may be set.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StructuredOutputs {
    /// A JSON schema (object, or a string holding one).
    pub json: Option<Value>,
    pub regex: Option<String>,
    pub choice: Option<Vec<String>>,
    /// A grammar in llguidance's Lark dialect.
    pub grammar: Option<String>,
    pub json_object: Option<bool>,
}

/// Every field that can constrain the output, flattened into both generation requests.
/// The two object-valued fields stay raw JSON here: serde loses the field path inside
/// a flattened struct, so the engine parses them itself (`ResponseFormat`,
/// `StructuredOutputs`) to name the field in its 400.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct ConstraintFields {
    pub response_format: Option<Value>,
    /// vLLM: a JSON schema (object, or a string holding one).
    pub guided_json: Option<Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
    pub structured_outputs: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_format_shapes() {
        let f = |s: &str| serde_json::from_str::<ResponseFormat>(s);
        assert_eq!(f(r#"{"type":"text"}"#).unwrap(), ResponseFormat::Text);
        assert_eq!(f(r#"{"type":"json_object"}"#).unwrap(), ResponseFormat::JsonObject);
        let s =
            f(r#"{"type":"json_schema","json_schema":{"name":"p","schema":{"type":"object"},"strict":true}}"#).unwrap();
        let ResponseFormat::JsonSchema { json_schema } = s else { panic!("json_schema") };
        assert_eq!(json_schema.name.as_deref(), Some("p"));
        assert!(f(r#"{"type":"xml"}"#).is_err(), "unknown types are refused");
        assert!(f(r#"{"type":"json_schema"}"#).is_err(), "json_schema needs its object");
    }

    #[test]
    fn structured_outputs_refuses_unknown_members() {
        let ok: StructuredOutputs = serde_json::from_str(r#"{"choice":["a","b"]}"#).unwrap();
        assert_eq!(ok.choice, Some(vec!["a".into(), "b".into()]));
        assert!(serde_json::from_str::<StructuredOutputs>(r#"{"structural_tag":"x"}"#).is_err());
    }
}
