//! `docs/openapi.yaml` read as JSON, and the questions the tests ask of it: which
//! operations it lists, which statuses and media types an operation answers with, and
//! whether a body (or each event of a stream) is valid under the schema it gives.
//!
//! Schemas are checked with `jsonschema` (draft 2020-12, the dialect of OpenAPI 3.1):
//! the whole document is the root resource, so every `$ref` into `components` resolves
//! as written; a schema is addressed by its JSON pointer in the document.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use serde_json::Value;

/// The methods an OpenAPI path item can hold.
const METHODS: [&str; 8] = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];

pub struct Spec {
    pub doc: Value,
    validators: Mutex<HashMap<String, std::sync::Arc<jsonschema::Validator>>>,
}

/// One JSON-pointer token (RFC 6901).
pub fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// A JSON pointer as a URI fragment: what RFC 3986 does not allow there, percent-encoded
/// (`{id}` in a path template).
fn fragment(pointer: &str) -> String {
    pointer
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z'
            | b'a'..=b'z'
            | b'0'..=b'9'
            | b'-'
            | b'.'
            | b'_'
            | b'~'
            | b'/'
            | b'!'
            | b'$'
            | b'&'
            | b'\''
            | b'('
            | b')'
            | b'*'
            | b'+'
            | b','
            | b';'
            | b'='
            | b':'
            | b'@' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A media type without its parameters, lowercased (`text/plain; version=0.0.4` → `text/plain`).
pub fn bare_media(content_type: &str) -> String {
    content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase()
}

/// The events of a stream as `(event, data)`: the name is `message` when the event has
/// none (as the SSE standard reads it); comments (`: keep-alive`) are skipped.
pub fn sse_events(text: &str) -> Vec<(String, String)> {
    text.split("\n\n")
        .filter_map(|block| {
            let mut name = "message".to_owned();
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event:") {
                    name = n.trim().to_owned();
                } else if let Some(d) = line.strip_prefix("data:") {
                    data.push(d.strip_prefix(' ').unwrap_or(d));
                }
            }
            (!data.is_empty()).then(|| (name, data.join("\n")))
        })
        .collect()
}

impl Spec {
    pub fn load() -> Self {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.yaml");
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let doc: Value = serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
        Self { doc, validators: Mutex::new(HashMap::new()) }
    }

    /// Every (METHOD, path template) the document lists.
    pub fn operations(&self) -> BTreeSet<(String, String)> {
        let paths = self.doc["paths"].as_object().expect("paths");
        paths
            .iter()
            .flat_map(|(path, item)| {
                METHODS.iter().filter(|m| item.get(**m).is_some()).map(move |m| (m.to_ascii_uppercase(), path.clone()))
            })
            .collect()
    }

    /// The JSON pointer of an operation.
    fn op_pointer(method: &str, path: &str) -> String {
        format!("/paths/{}/{}", escape(path), method.to_ascii_lowercase())
    }

    fn at(&self, pointer: &str) -> &Value {
        self.doc.pointer(pointer).unwrap_or_else(|| panic!("the spec has nothing at {pointer}"))
    }

    /// Where an object really is: itself, or the target of its local `$ref`.
    fn deref(&self, pointer: String) -> String {
        match self.at(&pointer).get("$ref").and_then(Value::as_str) {
            Some(r) => r.strip_prefix('#').unwrap_or_else(|| panic!("non-local $ref {r}")).to_owned(),
            None => pointer,
        }
    }

    /// The statuses an operation lists.
    pub fn statuses(&self, method: &str, path: &str) -> Vec<String> {
        let responses = self.at(&format!("{}/responses", Self::op_pointer(method, path)));
        responses.as_object().expect("responses").keys().cloned().collect()
    }

    /// The pointer of the response object for `status` (following a `$ref` into
    /// `components/responses`), if the operation lists that status.
    fn response(&self, method: &str, path: &str, status: u16) -> Option<String> {
        let p = format!("{}/responses/{status}", Self::op_pointer(method, path));
        self.doc.pointer(&p).map(|_| self.deref(p))
    }

    /// The media types a response lists (none for a body-less one).
    pub fn media_types(&self, method: &str, path: &str, status: u16) -> Vec<String> {
        let Some(r) = self.response(method, path, status) else { return Vec::new() };
        self.at(&r).get("content").and_then(Value::as_object).map(|c| c.keys().cloned().collect()).unwrap_or_default()
    }

    /// The pointer of a response's schema for `media` (for an event stream: the schema
    /// of one event, `{event, data}`).
    pub fn response_schema(&self, method: &str, path: &str, status: u16, media: &str) -> Option<String> {
        let r = self.response(method, path, status)?;
        let p = format!("{r}/content/{}/schema", escape(media));
        self.doc.pointer(&p).map(|_| p)
    }

    /// The `contentSchema` of an event schema's JSON `data` (under its `else` when the
    /// data may also be the bare `[DONE]`).
    pub fn sse_data_schema(&self, event: &str) -> String {
        let e = self.deref(event.to_owned());
        ["/properties/data/else/contentSchema", "/properties/data/contentSchema"]
            .into_iter()
            .map(|tail| format!("{e}{tail}"))
            .find(|p| self.doc.pointer(p).is_some())
            .unwrap_or_else(|| panic!("the event schema at {e} gives no contentSchema for its data"))
    }

    /// The pointer of an operation's JSON request body schema.
    pub fn request_schema(&self, method: &str, path: &str) -> Option<String> {
        let p = format!("{}/requestBody/content/application~1json/schema", Self::op_pointer(method, path));
        self.doc.pointer(&p).map(|_| p)
    }

    fn validator(&self, pointer: &str) -> std::sync::Arc<jsonschema::Validator> {
        let mut cache = self.validators.lock().unwrap();
        cache
            .entry(pointer.to_owned())
            .or_insert_with(|| {
                // The document itself is the schema's root resource: its OpenAPI keys are
                // unknown keywords (ignored), and `$ref` points at the schema wanted.
                let mut root = self.doc.clone();
                root["$ref"] = Value::String(format!("#{}", fragment(pointer)));
                let v = jsonschema::draft202012::new(&root)
                    .unwrap_or_else(|e| panic!("the schema at {pointer} does not compile: {e}"));
                std::sync::Arc::new(v)
            })
            .clone()
    }

    /// Why `instance` is not valid under the schema at `pointer` (empty: it is).
    pub fn errors(&self, pointer: &str, instance: &Value) -> Vec<String> {
        let v = self.validator(pointer);
        v.iter_errors(instance).map(|e| format!("{} at {}", e, e.instance_path())).collect()
    }

    /// Every local `$ref` in the document that points at nothing.
    pub fn dangling_refs(&self) -> Vec<String> {
        fn walk(v: &Value, doc: &Value, out: &mut Vec<String>) {
            match v {
                Value::Object(m) => {
                    if let Some(Value::String(r)) = m.get("$ref")
                        && r.strip_prefix('#').is_none_or(|p| doc.pointer(p).is_none())
                    {
                        out.push(r.clone());
                    }
                    m.values().for_each(|x| walk(x, doc, out));
                }
                Value::Array(a) => a.iter().for_each(|x| walk(x, doc, out)),
                _ => {}
            }
        }
        let mut out = Vec::new();
        walk(&self.doc, &self.doc, &mut out);
        out
    }
}

#[test]
fn sse_blocks_give_their_data_and_names_and_skip_comments() {
    let text = "event: ping\ndata: {\"type\":\"ping\"}\n\n: keep-alive\n\ndata: [DONE]\n\n";
    let got = sse_events(text);
    assert_eq!(got, vec![("ping".into(), r#"{"type":"ping"}"#.into()), ("message".into(), "[DONE]".into())]);
    assert_eq!(bare_media("text/plain; version=0.0.4; charset=utf-8"), "text/plain");
    assert_eq!(escape("/v1/models"), "~1v1~1models");
    assert_eq!(fragment("/paths/~1a~1{id}"), "/paths/~1a~1%7Bid%7D");
}
