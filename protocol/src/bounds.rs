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

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;

use crate::error::{ApiError, ApiShape};

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
/// where it goes (`model`, `stream`) and what bounds its work. Read from a JSON object
/// the way the engine reads its request: every other field is skipped unread (not even
/// checked to be UTF-8 or shallow); unlike a derived reader, a key given twice counts
/// once (the last), since a repeat of a field this API does not use is no error to the
/// engine, and one it does use is the engine's to refuse.
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

impl<'de> Deserialize<'de> for Outline {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(OutlineVisitor)
    }
}

struct OutlineVisitor;

impl<'de> Visitor<'de> for OutlineVisitor {
    type Value = Outline;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Outline, A::Error> {
        let mut o = Outline::default();
        while let Some(key) = map.next_key::<String>()? {
            let slot = match key.as_str() {
                "model" => {
                    o.model = map.next_value()?;
                    continue;
                }
                "stream" => &mut o.stream,
                "max_tokens" => &mut o.max_tokens,
                "max_completion_tokens" => &mut o.max_completion_tokens,
                "max_output_tokens" => &mut o.max_output_tokens,
                "n" => &mut o.n,
                "stop" => &mut o.stop,
                "stop_sequences" => &mut o.stop_sequences,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            *slot = map.next_value()?;
        }
        Ok(o)
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
    /// Whether the stream flag is `true` (any other value is the engine's to judge).
    pub fn streams(&self) -> bool {
        self.stream.as_ref().and_then(Value::as_bool).unwrap_or(false)
    }

    /// Check the bounds of the fields `shape`'s API has: OpenAI chat and completions
    /// (`max_tokens`, `max_completion_tokens`, `n`, `stop`), Anthropic Messages
    /// (`max_tokens`, `stop_sequences`), OpenAI Responses (`max_output_tokens`).
    pub fn check(&self, shape: ApiShape) -> Result<(), ApiError> {
        let int = |v: &Option<Value>| v.as_ref().and_then(Value::as_i64);
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

    fn outline(v: Value) -> Outline {
        serde_json::from_value(v).unwrap()
    }

    fn refused(v: Value, shape: ApiShape) -> Option<String> {
        outline(v).check(shape).err().map(|e| e.param.unwrap_or_default())
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
    fn within_bounds_or_of_another_type_passes_to_the_engine() {
        let ok = json!({"model": "m", "stream": true, "max_tokens": 256, "n": 1, "stop": ["\n", "END"]});
        let o = outline(ok);
        assert!(o.check(ApiShape::OpenAi).is_ok());
        assert_eq!((o.model.as_deref(), o.streams()), (Some("m"), true));
        // Wrong types are the engine's to name (its parse is typed); a bound is not.
        for v in [json!({"max_tokens": "many"}), json!({"n": 2.5}), json!({"stop": 7}), json!({"stop": [1, 2]})] {
            assert!(outline(v.clone()).check(ApiShape::OpenAi).is_ok(), "{v}");
        }
        assert!(!outline(json!({"stream": "yes"})).streams());
    }

    /// Found by the request fuzz targets: a key given twice (here one the engine does not
    /// read for this API) made the whole body unreadable to the gateway, which then
    /// refused as invalid JSON a body the engine accepts.
    #[test]
    fn a_repeated_key_counts_once_and_only_objects_are_read() {
        let body =
            br#"{"prompt": "x", "max_output_tokens": 1, "max_output_tokens": 2, "max_tokens": 0, "max_tokens": 5}"#;
        let o: Outline = serde_json::from_slice(body).unwrap();
        assert!(o.check(ApiShape::OpenAi).is_ok(), "the last max_tokens counts");
        assert!(serde_json::from_slice::<Outline>(br#"["m", true, 0]"#).is_err());
        assert!(serde_json::from_slice::<Outline>(br#"{"model": 5}"#).is_err());
        let o: Outline = serde_json::from_slice(br#"{"model": null, "stream": null}"#).unwrap();
        assert_eq!((o.model.as_deref(), o.streams()), (None, false));
        // Found by the fuzz targets after the first fix, which read the whole object as a
        // map: the engine skips other fields unread, bytes that are not UTF-8 and nesting
        // past serde_json's recursion limit included, so the gateway must too.
        let mut odd = b"{\"max_tokens\": 8, \"other\": {\"k\xff\": \"v\xfe\"}, \"deep\": ".to_vec();
        odd.extend([b'['; 200].iter().chain(&[b']'; 200]).chain(b"}"));
        let o: Outline = serde_json::from_slice(&odd).unwrap();
        assert!(o.check(ApiShape::Anthropic).is_ok());
    }
}
