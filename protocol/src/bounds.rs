//! Bounds on the work one generation request may ask for: how many tokens it may
//! generate, how many choices, how many stop strings and how long each is. Two servers
//! apply them with these same functions: the gateway before it chooses or starts any
//! engine (so a request no engine would take never costs a model load), and the engine
//! while it validates the whole request.
//!
//! The gateway reads only the fields named here (`Outline`), loosely: a field of the
//! wrong type is left for the engine's full parse to name, so both servers refuse the
//! same requests with the same messages.

use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::error::{ApiError, ApiShape, ErrorKind};

/// The most tokens one request may ask to generate (`max_tokens`,
/// `max_completion_tokens`, `max_output_tokens`).
pub const MAX_OUTPUT_TOKENS: i64 = 1 << 24;
/// The most stop strings one request may give.
pub const MAX_STOPS: usize = 16;
/// The longest stop string, in bytes (each is matched against decoded text per token).
pub const MAX_STOP_BYTES: usize = 256;

/// A requested output-token count: more than 0, at most `MAX_OUTPUT_TOKENS`.
pub fn output_tokens(param: &str, n: i64) -> Result<usize, ApiError> {
    if n <= 0 {
        return Err(ApiError::invalid(param, format!("{param} must be > 0 (got {n})")));
    }
    if n > MAX_OUTPUT_TOKENS {
        return Err(ApiError::invalid(param, format!("{param} must be <= {MAX_OUTPUT_TOKENS} (got {n})")));
    }
    Ok(n as usize)
}

/// `n`, the number of choices: only one is generated per request.
pub fn choices(n: i64) -> Result<(), ApiError> {
    if n == 1 { Ok(()) } else { Err(ApiError::invalid("n", format!("only n=1 is supported (got {n})"))) }
}

/// Stop strings: at most `MAX_STOPS`, each at most `MAX_STOP_BYTES`.
pub fn stops(param: &str, stops: &[String]) -> Result<(), ApiError> {
    if stops.len() > MAX_STOPS {
        return Err(ApiError::invalid(param, format!("at most {MAX_STOPS} stop strings (got {})", stops.len())));
    }
    if let Some(s) = stops.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::invalid(
            param,
            format!("a stop string may be at most {MAX_STOP_BYTES} bytes (got {})", s.len()),
        ));
    }
    Ok(())
}

/// The few fields of a generation request read before any work is committed to it:
/// where it goes (`model`, `stream`) and what bounds its work in the request's own API
/// (`bounded_fields`). Every other field — another API's too, which the engine does not
/// read either — is skipped unread. Read from a JSON object only, and loosely: a key
/// given twice counts once (the last), as for any field the engine does not know; a
/// body the engine refuses for the repeat is the engine's to name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outline {
    pub model: Option<String>,
    pub stream: Option<Value>,
    max_tokens: Option<Value>,
    max_completion_tokens: Option<Value>,
    max_output_tokens: Option<Value>,
    n: Option<Value>,
    stop: Option<Value>,
    stop_sequences: Option<Value>,
}

/// Why a body is not an `Outline`, named as the engine would name it.
fn refusal(body: &[u8], e: &serde_json::Error) -> ApiError {
    let invalid_json = |e: &serde_json::Error| ApiError::new(ErrorKind::InvalidJson, format!("invalid JSON: {e}"));
    if !e.is_data() {
        return invalid_json(e);
    }
    let value = match serde_json::from_slice::<Value>(body) {
        Ok(v) => v,
        Err(e) => return invalid_json(&e),
    };
    let Value::Object(fields) = value else {
        let got = match value {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            _ => "an array",
        };
        return ApiError::new(ErrorKind::InvalidRequest, format!("the request body must be a JSON object (got {got})"));
    };
    match fields.get("model").map(String::deserialize) {
        Some(Err(e)) => ApiError::invalid("model", format!("model: {e}")),
        _ => ApiError::new(ErrorKind::InvalidRequest, format!("request body: {e}")),
    }
}

/// The fields that bound a request's work in `shape`'s API: OpenAI chat and completions
/// (`max_tokens`, `max_completion_tokens`, `n`, `stop`), Anthropic Messages
/// (`max_tokens`, `stop_sequences`), OpenAI Responses (`max_output_tokens`).
fn bounded_fields(shape: ApiShape) -> &'static [&'static str] {
    match shape {
        ApiShape::OpenAi => &["max_tokens", "max_completion_tokens", "n", "stop"],
        ApiShape::Anthropic => &["max_tokens", "stop_sequences"],
        ApiShape::Responses => &["max_output_tokens"],
    }
}

/// Reads an `Outline` for one API shape.
struct Reader(ApiShape);

impl<'de> DeserializeSeed<'de> for Reader {
    type Value = Outline;

    /// Entry by entry: `model`, `stream` and the shape's bounded fields as values
    /// (`null` as absent), every other one skipped unread — without recursion, however
    /// deep it nests, and without looking inside its strings.
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Outline, D::Error> {
        struct Entries(ApiShape);
        impl<'de> Visitor<'de> for Entries {
            type Value = Outline;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Outline, A::Error> {
                let mut o = Outline::default();
                while let Some(key) = m.next_key::<String>()? {
                    let slot = match key.as_str() {
                        "model" => {
                            o.model = match m.next_value::<Value>()? {
                                Value::Null => None,
                                Value::String(s) => Some(s),
                                other => {
                                    return Err(de::Error::custom(format!("model must be a string (got {other})")));
                                }
                            };
                            continue;
                        }
                        "stream" => &mut o.stream,
                        k if !bounded_fields(self.0).contains(&k) => {
                            m.next_value::<IgnoredAny>()?;
                            continue;
                        }
                        "max_tokens" => &mut o.max_tokens,
                        "max_completion_tokens" => &mut o.max_completion_tokens,
                        "max_output_tokens" => &mut o.max_output_tokens,
                        "n" => &mut o.n,
                        "stop" => &mut o.stop,
                        "stop_sequences" => &mut o.stop_sequences,
                        _ => {
                            m.next_value::<IgnoredAny>()?;
                            continue;
                        }
                    };
                    *slot = Some(m.next_value::<Value>()?).filter(|v| !v.is_null());
                }
                Ok(o)
            }
        }
        d.deserialize_map(Entries(self.0))
    }
}

/// A stop field as strings: one string or a list of them (anything else is the engine's
/// to refuse).
fn stop_strings(v: &Value) -> Option<Vec<String>> {
    match v {
        Value::String(s) => Some(vec![s.clone()]),
        Value::Array(items) => items.iter().map(|i| i.as_str().map(str::to_owned)).collect(),
        _ => None,
    }
}

impl Outline {
    /// Read from a request body of `shape`'s API. A body that is not JSON is
    /// `invalid_json`; JSON that is not an object, or a `model` that is not a string, is
    /// `invalid_value` — what the engine's typed parse answers for the same body.
    pub fn read(body: &[u8], shape: ApiShape) -> Result<Outline, ApiError> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let read = Reader(shape).deserialize(&mut de).and_then(|o| de.end().map(|()| o));
        // Only a refusal looks at the body again, to name what is wrong as the engine would.
        read.map_err(|e| refusal(body, &e))
    }

    /// Whether the stream flag is `true` (any other value is the engine's to judge).
    pub fn streams(&self) -> bool {
        self.stream.as_ref().and_then(Value::as_bool).unwrap_or(false)
    }

    /// Check the bounds of the fields `shape`'s API has: OpenAI chat and completions
    /// (`max_tokens`, `max_completion_tokens`, `n`, `stop`), Anthropic Messages
    /// (`max_tokens`, `stop_sequences`), OpenAI Responses (`max_output_tokens`).
    pub fn check(&self, shape: ApiShape) -> Result<(), ApiError> {
        // An integer past i64 (`2^63`) is over every bound: saturate, so it is refused
        // here like any other too-large value.
        let int = |v: &Option<Value>| v.as_ref().and_then(|v| v.as_i64().or(v.as_u64().map(|_| i64::MAX)));
        let (tokens, stop) = match shape {
            ApiShape::OpenAi => {
                if let Some(n) = int(&self.n) {
                    choices(n)?;
                }
                let tokens =
                    vec![("max_tokens", &self.max_tokens), ("max_completion_tokens", &self.max_completion_tokens)];
                (tokens, Some(("stop", &self.stop)))
            }
            ApiShape::Anthropic => {
                (vec![("max_tokens", &self.max_tokens)], Some(("stop_sequences", &self.stop_sequences)))
            }
            ApiShape::Responses => (vec![("max_output_tokens", &self.max_output_tokens)], None),
        };
        for (param, v) in tokens {
            if let Some(n) = int(v) {
                output_tokens(param, n)?;
            }
        }
        match stop {
            Some((param, Some(v))) => stop_strings(v).map_or(Ok(()), |list| stops(param, &list)),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn outline(v: Value, shape: ApiShape) -> Outline {
        Outline::read(&serde_json::to_vec(&v).unwrap(), shape).unwrap()
    }

    fn refused(v: Value, shape: ApiShape) -> Option<String> {
        outline(v, shape).check(shape).err().map(|e| e.param.unwrap_or_default())
    }

    #[test]
    fn plain_bounds() {
        assert_eq!(output_tokens("max_tokens", 1).unwrap(), 1);
        assert_eq!(output_tokens("max_tokens", MAX_OUTPUT_TOKENS).unwrap(), MAX_OUTPUT_TOKENS as usize);
        assert!(output_tokens("max_tokens", MAX_OUTPUT_TOKENS + 1).is_err());
        assert!(output_tokens("max_tokens", 0).is_err() && output_tokens("max_tokens", -1).is_err());
        assert!(choices(1).is_ok() && choices(2).is_err() && choices(0).is_err());
        let long = "x".repeat(MAX_STOP_BYTES);
        assert!(stops("stop", &vec![long.clone(); MAX_STOPS]).is_ok());
        assert!(stops("stop", &vec!["a".to_owned(); MAX_STOPS + 1]).is_err());
        let e = stops("stop", &[format!("{long}x")]).unwrap_err();
        assert!(e.message.contains("257"), "{}", e.message);
    }

    #[test]
    fn each_api_is_checked_on_its_own_fields_and_names_the_one_at_fault() {
        let big = MAX_OUTPUT_TOKENS + 1;
        assert_eq!(refused(json!({"max_tokens": big}), ApiShape::OpenAi).as_deref(), Some("max_tokens"));
        assert_eq!(
            refused(json!({"max_completion_tokens": big}), ApiShape::OpenAi).as_deref(),
            Some("max_completion_tokens")
        );
        assert_eq!(refused(json!({"n": 2}), ApiShape::OpenAi).as_deref(), Some("n"));
        assert_eq!(refused(json!({"max_tokens": 1u64 << 63}), ApiShape::OpenAi).as_deref(), Some("max_tokens"));
        assert_eq!(refused(json!({"max_tokens": u64::MAX}), ApiShape::Anthropic).as_deref(), Some("max_tokens"));
        assert_eq!(refused(json!({"n": 1u64 << 63}), ApiShape::OpenAi).as_deref(), Some("n"));
        assert_eq!(refused(json!({"stop": vec!["a"; 17]}), ApiShape::OpenAi).as_deref(), Some("stop"));
        assert_eq!(refused(json!({"stop": "x".repeat(300)}), ApiShape::OpenAi).as_deref(), Some("stop"));
        assert_eq!(refused(json!({"max_tokens": 0}), ApiShape::Anthropic).as_deref(), Some("max_tokens"));
        assert_eq!(
            refused(json!({"stop_sequences": vec!["a"; 17]}), ApiShape::Anthropic).as_deref(),
            Some("stop_sequences")
        );
        assert_eq!(
            refused(json!({"max_output_tokens": big}), ApiShape::Responses).as_deref(),
            Some("max_output_tokens")
        );
        // Another API's field is not this one's: the engine ignores it, so must the gateway.
        assert_eq!(refused(json!({"n": 2, "stop": vec!["a"; 17]}), ApiShape::Anthropic), None);
        assert_eq!(refused(json!({"max_tokens": big}), ApiShape::Responses), None);
        assert_eq!(refused(json!({"stop_sequences": vec!["a"; 17]}), ApiShape::OpenAi), None);
    }

    #[test]
    fn a_body_that_is_not_an_object_or_names_no_string_model_is_invalid_not_unparsable() {
        let code = |b: &str| Outline::read(b.as_bytes(), ApiShape::OpenAi).map(|_| ()).map_err(|e| (e.kind, e.param));
        assert_eq!(code(r#"{"model": "m", "x": [1, {"y": 2}]}"#), Ok(()));
        assert_eq!(code(r#"{"model": "m""#), Err((ErrorKind::InvalidJson, None)));
        assert_eq!(code("not json"), Err((ErrorKind::InvalidJson, None)));
        // Valid JSON of the wrong shape: the engine's typed parse calls these invalid values.
        for b in ["[]", r#"["m", true]"#, "null", "7", r#""m""#] {
            let e = Outline::read(b.as_bytes(), ApiShape::Anthropic).unwrap_err();
            assert_eq!((e.kind, e.param.as_deref()), (ErrorKind::InvalidRequest, None), "{b}");
            assert!(e.message.starts_with("the request body must be a JSON object"), "{b}: {}", e.message);
        }
        let e = Outline::read(br#"{"model": 5, "messages": []}"#, ApiShape::Responses).unwrap_err();
        assert_eq!((e.kind, e.param.as_deref()), (ErrorKind::InvalidRequest, Some("model")));
        assert_eq!(e.message, "model: invalid type: integer `5`, expected a string");
    }

    #[test]
    fn within_bounds_or_of_another_type_passes_to_the_engine() {
        let ok = json!({"model": "m", "stream": true, "max_tokens": 256, "n": 1, "stop": ["\n", "END"]});
        let o = outline(ok, ApiShape::OpenAi);
        assert!(o.check(ApiShape::OpenAi).is_ok());
        assert_eq!((o.model.as_deref(), o.streams()), (Some("m"), true));
        // Wrong types are the engine's to name (its parse is typed); a bound is not.
        for v in [json!({"max_tokens": "many"}), json!({"n": 2.5}), json!({"stop": 7}), json!({"stop": [1, 2]})] {
            assert!(outline(v.clone(), ApiShape::OpenAi).check(ApiShape::OpenAi).is_ok(), "{v}");
        }
        assert!(!outline(json!({"stream": "yes"}), ApiShape::OpenAi).streams());
    }

    /// Found by the request fuzz targets: a key given twice (here one the engine does not
    /// read for this API) made the whole body unreadable to the gateway, which then
    /// refused as invalid JSON a body the engine accepts.
    #[test]
    fn a_repeated_key_counts_once_and_only_objects_are_read() {
        let body =
            br#"{"prompt": "x", "max_output_tokens": 1, "max_output_tokens": 2, "max_tokens": 0, "max_tokens": 5}"#;
        let read = |b: &[u8]| Outline::read(b, ApiShape::OpenAi);
        assert!(read(body).unwrap().check(ApiShape::OpenAi).is_ok(), "the last max_tokens counts");
        assert!(read(br#"["m", true, 0]"#).is_err() && read(br#"{"model": 5}"#).is_err());
        let o = read(br#"{"model": null, "stream": null}"#).unwrap();
        assert_eq!((o.model.as_deref(), o.streams()), (None, false));
        assert_eq!(read(br#"{"model": "m"} x"#).unwrap_err().kind, ErrorKind::InvalidJson);
    }

    /// Found by the Messages fuzz target: a field of another API holding a string that is
    /// not UTF-8 — the engine skips it unread, so the gateway must too.
    #[test]
    fn another_apis_fields_are_skipped_unread() {
        let body = b"{\"max_tokens\": 8, \"max_completion_tokens\": {\"a\xa3\": 1}, \"stop\": [\"\xff\"]}";
        assert!(Outline::read(body, ApiShape::Anthropic).unwrap().check(ApiShape::Anthropic).is_ok());
        assert!(Outline::read(body, ApiShape::OpenAi).is_err(), "OpenAI's own fields are read");
    }
}
