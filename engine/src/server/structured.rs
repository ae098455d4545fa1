//! Which constraint and which tools a request asks for, validated: a field that is
//! malformed, names an unknown tool or competes with another constraint is a 400
//! naming the field; everything else becomes a `Constraint` / `ToolRequest`.

use corral_protocol::ApiError;
use corral_protocol::openai::{ChatCompletionRequest, ConstraintFields, ResponseFormat, StructuredOutputs, ToolChoice};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::grammar::Constraint;
use crate::tools::{ToolDef, ToolMode, ToolRequest};

/// The constraint a request asks for, with the field that asked.
pub fn constraint(f: &ConstraintFields) -> Result<Option<(String, Constraint)>, ApiError> {
    let mut found: Vec<(String, Constraint)> = Vec::new();
    let response_format: Option<ResponseFormat> = parse("response_format", &f.response_format)?;
    match &response_format {
        None | Some(ResponseFormat::Text) => {}
        Some(ResponseFormat::JsonObject) => found.push(("response_format".into(), Constraint::JsonObject)),
        Some(ResponseFormat::JsonSchema { json_schema }) => {
            let c = match &json_schema.schema {
                None => Constraint::JsonObject,
                Some(s) => Constraint::JsonSchema(schema("response_format.json_schema.schema", s)?),
            };
            found.push(("response_format".into(), c));
        }
    }
    if let Some(v) = &f.guided_json {
        found.push(("guided_json".into(), Constraint::JsonSchema(schema("guided_json", v)?)));
    }
    if let Some(rx) = &f.guided_regex {
        found.push(("guided_regex".into(), Constraint::Regex(rx.clone())));
    }
    if let Some(c) = &f.guided_choice {
        found.push(("guided_choice".into(), choice("guided_choice", c)?));
    }
    if let Some(g) = &f.guided_grammar {
        found.push(("guided_grammar".into(), Constraint::Lark(g.clone())));
    }
    let structured_outputs: Option<StructuredOutputs> = parse("structured_outputs", &f.structured_outputs)?;
    if let Some(so) = &structured_outputs {
        if let Some(v) = &so.json {
            found.push((
                "structured_outputs.json".into(),
                Constraint::JsonSchema(schema("structured_outputs.json", v)?),
            ));
        }
        if let Some(rx) = &so.regex {
            found.push(("structured_outputs.regex".into(), Constraint::Regex(rx.clone())));
        }
        if let Some(c) = &so.choice {
            found.push(("structured_outputs.choice".into(), choice("structured_outputs.choice", c)?));
        }
        if let Some(g) = &so.grammar {
            found.push(("structured_outputs.grammar".into(), Constraint::Lark(g.clone())));
        }
        if so.json_object == Some(true) {
            found.push(("structured_outputs.json_object".into(), Constraint::JsonObject));
        }
    }
    if found.len() > 1 {
        return Err(ApiError::invalid(
            &found[1].0,
            format!("{} and {} both constrain the output; send only one", found[0].0, found[1].0),
        ));
    }
    Ok(found.pop())
}

/// A raw field in its typed shape; a mismatch is a 400 naming the field.
fn parse<T: DeserializeOwned>(param: &str, v: &Option<Value>) -> Result<Option<T>, ApiError> {
    v.as_ref()
        .filter(|v| !v.is_null())
        .map(|v| T::deserialize(v).map_err(|e| ApiError::invalid(param, format!("{param}: {e}"))))
        .transpose()
}

/// A JSON schema given as an object (or `true`), or as a string holding one.
fn schema(param: &str, v: &Value) -> Result<Value, ApiError> {
    let v = match v {
        Value::String(s) => serde_json::from_str(s)
            .map_err(|e| ApiError::invalid(param, format!("{param} is a string but not valid JSON: {e}")))?,
        other => other.clone(),
    };
    match v {
        Value::Object(_) | Value::Bool(true) => Ok(v),
        _ => Err(ApiError::invalid(param, format!("{param} must be a JSON Schema object"))),
    }
}

fn choice(param: &str, options: &[String]) -> Result<Constraint, ApiError> {
    if options.is_empty() {
        return Err(ApiError::invalid(param, format!("{param} must list at least one option")));
    }
    Ok(Constraint::Choice(options.to_vec()))
}

/// The tools a chat request offers and how it lets the model use them. `None` when
/// there are no tools or `tool_choice` is `"none"`.
pub fn tools(req: &ChatCompletionRequest) -> Result<Option<ToolRequest>, ApiError> {
    let list = req.tools.as_deref().unwrap_or_default();
    let mode = match &req.tool_choice {
        None => (!list.is_empty()).then_some(ToolMode::Auto),
        Some(ToolChoice::Mode(m)) => match m.as_str() {
            "none" => None,
            "auto" => (!list.is_empty()).then_some(ToolMode::Auto),
            "required" => Some(ToolMode::Required),
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("tool_choice must be \"auto\", \"none\", \"required\" or a named function (got {other:?})"),
                ));
            }
        },
        Some(ToolChoice::Named(n)) => {
            if n.kind != "function" {
                return Err(ApiError::invalid("tool_choice.type", "tool_choice.type must be \"function\""));
            }
            Some(ToolMode::Named(n.function.name.clone()))
        }
    };
    let specs = list
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if t.kind != "function" {
                return Err(ApiError::invalid(
                    &format!("tools[{i}].type"),
                    format!("only function tools are supported (got {:?})", t.kind),
                ));
            }
            let f = t.function.as_ref().ok_or_else(|| {
                ApiError::invalid(&format!("tools[{i}].function"), "a function tool needs `function`")
            })?;
            Ok(ToolSpec {
                name: &f.name,
                description: f.description.as_deref(),
                schema: f.parameters.as_ref(),
                at: format!("tools[{i}].function"),
                schema_key: "parameters",
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    // One call per answer unless asked (llama.cpp's default too): small local models
    // given the choice tend to repeat a call until they run out of tokens.
    let parallel = req.parallel_tool_calls.unwrap_or(false);
    tool_set(specs, mode, parallel, ("tool_choice", "tool_choice.function.name"))
}

/// A tool as any API names it, before validation.
pub struct ToolSpec<'a> {
    pub name: &'a str,
    pub description: Option<&'a str>,
    pub schema: Option<&'a Value>,
    /// Where the tool is in the request (`tools[0].function`), for 400s.
    pub at: String,
    /// The schema's key (`parameters`, Anthropic's `input_schema`).
    pub schema_key: &'static str,
}

/// Validate the tools a request offers under `mode` (`None`: no tools in play).
/// `choice` names the tool-choice field and its tool-name field, for 400s.
pub fn tool_set(
    specs: Vec<ToolSpec<'_>>,
    mode: Option<ToolMode>,
    parallel: bool,
    choice: (&str, &str),
) -> Result<Option<ToolRequest>, ApiError> {
    let Some(mode) = mode else { return Ok(None) };
    if specs.is_empty() {
        return Err(ApiError::invalid(choice.0, format!("{} asks for a tool call but `tools` is empty", choice.0)));
    }
    let mut tools: Vec<ToolDef> = Vec::with_capacity(specs.len());
    for spec in specs {
        let def = tool_def(&spec)?;
        if tools.iter().any(|d| d.name == def.name) {
            return Err(ApiError::invalid(
                &format!("{}.name", spec.at),
                format!("tool {:?} is listed twice", def.name),
            ));
        }
        tools.push(def);
    }
    if let ToolMode::Named(n) = &mode
        && !tools.iter().any(|t| &t.name == n)
    {
        return Err(ApiError::invalid(choice.1, format!("{} names {n:?}, which is not in `tools`", choice.0)));
    }
    Ok(Some(ToolRequest { tools, mode, parallel }))
}

fn tool_def(spec: &ToolSpec<'_>) -> Result<ToolDef, ApiError> {
    let name = spec.name;
    let name_ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
    if !name_ok {
        return Err(ApiError::invalid(
            &format!("{}.name", spec.at),
            format!("function names are 1-64 characters of a-z, A-Z, 0-9, _, - and . (got {name:?})"),
        ));
    }
    let parameters = match spec.schema {
        None => serde_json::json!({"type": "object", "properties": {}}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => {
            return Err(ApiError::invalid(
                &format!("{}.{}", spec.at, spec.schema_key),
                format!("{} must be a JSON Schema object", spec.schema_key),
            ));
        }
    };
    Ok(ToolDef { name: name.to_owned(), description: spec.description.map(str::to_owned), parameters })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(json: &str) -> ConstraintFields {
        serde_json::from_str(json).unwrap()
    }

    fn chat(json: &str) -> ChatCompletionRequest {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn each_field_maps_to_its_constraint() {
        let c = |j: &str| constraint(&fields(j)).unwrap().map(|(f, c)| (f, c.kind()));
        assert_eq!(c(r#"{}"#), None);
        assert_eq!(c(r#"{"response_format":{"type":"text"}}"#), None);
        assert_eq!(c(r#"{"response_format":{"type":"json_object"}}"#), Some(("response_format".into(), "json_object")));
        assert_eq!(
            c(r#"{"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}}}"#),
            Some(("response_format".into(), "json_schema"))
        );
        assert_eq!(c(r#"{"guided_json":"{\"type\":\"integer\"}"}"#), Some(("guided_json".into(), "json_schema")));
        assert_eq!(c(r#"{"guided_regex":"[a-z]+"}"#), Some(("guided_regex".into(), "regex")));
        assert_eq!(c(r#"{"guided_choice":["a"]}"#), Some(("guided_choice".into(), "choice")));
        assert_eq!(c(r#"{"guided_grammar":"start: \"x\""}"#), Some(("guided_grammar".into(), "grammar")));
        assert_eq!(c(r#"{"structured_outputs":{"regex":"x"}}"#), Some(("structured_outputs.regex".into(), "regex")));
        assert_eq!(
            c(r#"{"structured_outputs":{"json_object":true}}"#),
            Some(("structured_outputs.json_object".into(), "json_object"))
        );
    }

    #[test]
    fn two_constraints_name_both_fields() {
        let e = constraint(&fields(r#"{"response_format":{"type":"json_object"},"guided_regex":"x"}"#)).unwrap_err();
        assert!(e.message.contains("response_format") && e.message.contains("guided_regex"), "{}", e.message);
        let e = constraint(&fields(r#"{"structured_outputs":{"regex":"x","choice":["a"]}}"#)).unwrap_err();
        assert!(e.message.contains("structured_outputs.regex") && e.message.contains("structured_outputs.choice"));
    }

    #[test]
    fn malformed_constraints_are_400s() {
        for (j, param) in [
            (r#"{"guided_json":"{not json"}"#, "guided_json"),
            (r#"{"guided_json":3}"#, "guided_json"),
            (r#"{"guided_choice":[]}"#, "guided_choice"),
            (r#"{"response_format":{"type":"yaml"}}"#, "response_format"),
            (r#"{"structured_outputs":{"xml":"x"}}"#, "structured_outputs"),
        ] {
            assert_eq!(constraint(&fields(j)).unwrap_err().param.as_deref(), Some(param), "{j}");
        }
    }

    const TOOLS: &str =
        r#""tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]"#;

    #[test]
    fn tool_choice_modes() {
        let t = |extra: &str| tools(&chat(&format!("{{{TOOLS}{extra}}}"))).map(|r| r.map(|r| (r.mode, r.parallel)));
        assert_eq!(t("").unwrap(), Some((ToolMode::Auto, false)));
        assert_eq!(t(r#","tool_choice":"none""#).unwrap(), None);
        assert_eq!(
            t(r#","tool_choice":"required","parallel_tool_calls":true"#).unwrap(),
            Some((ToolMode::Required, true))
        );
        assert_eq!(
            t(r#","tool_choice":{"type":"function","function":{"name":"get_weather"}}"#).unwrap(),
            Some((ToolMode::Named("get_weather".into()), false))
        );
        assert!(t(r#","tool_choice":{"type":"function","function":{"name":"nope"}}"#).is_err());
        assert!(t(r#","tool_choice":"sometimes""#).is_err());
        assert_eq!(tools(&chat(r#"{"tool_choice":"auto"}"#)).unwrap(), None);
        assert!(tools(&chat(r#"{"tool_choice":"required"}"#)).is_err(), "required needs tools");
    }

    #[test]
    fn bad_tools_name_the_field() {
        let e = |j: &str| tools(&chat(j)).unwrap_err().param;
        assert_eq!(e(r#"{"tools":[{"type":"web_search"}]}"#).as_deref(), Some("tools[0].type"));
        assert_eq!(
            e(r#"{"tools":[{"type":"function","function":{"name":"a b"}}]}"#).as_deref(),
            Some("tools[0].function.name")
        );
        assert_eq!(
            e(r#"{"tools":[{"type":"function","function":{"name":"f","parameters":[]}}]}"#).as_deref(),
            Some("tools[0].function.parameters")
        );
        assert_eq!(
            e(r#"{"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]}"#)
                .as_deref(),
            Some("tools[1].function.name")
        );
    }
}
