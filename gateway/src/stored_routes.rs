//! The gateway's part of OpenAI Responses: before a `POST /v1/responses` goes to an
//! engine, a `previous_response_id` is replaced by the whole conversation (the stored
//! history, then the new input; the engine is told with `x-corral-history: expanded`);
//! while the answer passes through, it is captured (the whole body, or the stream's
//! final `response.completed`/`response.incomplete` event) and stored, unless the
//! request said `store: false`. `GET`/`DELETE /v1/responses/{id}` answer from the store.
//!
//! A capture stores the response before its last bytes reach the client, so a client
//! that continues the conversation at once always finds it.

use std::sync::Arc;

use bytes::Bytes;
use corral_protocol::responses::HISTORY_HEADER;
use corral_protocol::{ApiError, ApiShape, ErrorKind};
use http::{HeaderValue, Method, Response, header};
use serde_json::{Map, Value, json};

use crate::app::App;
use crate::body::{Body, Tap};
use crate::respond;
use crate::stored::{ResponseStore, Stored, valid_id};

/// A captured answer larger than this is passed through but not stored.
const MAX_CAPTURE: usize = 32 << 20;

/// The body to send the engine, and what captures the answer (none if nothing is to
/// be stored).
pub struct Prepared {
    pub body: Bytes,
    pub capture: Option<Capture>,
}

/// Expand `previous_response_id` and set up the capture. A body that is not a JSON
/// object goes through unchanged: the engine judges it.
pub fn prepare(store: &Arc<ResponseStore>, headers: &mut http::HeaderMap, body: Bytes) -> Result<Prepared, ApiError> {
    headers.remove(HISTORY_HEADER);
    let Ok(mut req) = serde_json::from_slice::<Map<String, Value>>(&body) else {
        return Ok(Prepared { body, capture: None });
    };
    let mut input = match req.get("input") {
        Some(Value::String(s)) => vec![json!({"type": "message", "role": "user", "content": s})],
        Some(Value::Array(items)) => items.clone(),
        // Missing or malformed: the engine answers 400; nothing will be stored.
        _ => Vec::new(),
    };
    let expanded = match req.get("previous_response_id") {
        None | Some(Value::Null) => false,
        Some(Value::String(id)) => {
            let prev = store.get(id).filter(|_| valid_id(id)).ok_or_else(|| {
                ApiError::new(ErrorKind::NotFound, format!("previous response with id '{id}' not found"))
                    .with_param("previous_response_id")
            })?;
            let mut all = prev.history();
            all.append(&mut input);
            input = all;
            req.insert("input".into(), Value::Array(input.clone()));
            headers.insert(HISTORY_HEADER, HeaderValue::from_static("expanded"));
            true
        }
        Some(_) => return Err(ApiError::invalid("previous_response_id", "previous_response_id must be a string")),
    };
    let body = if expanded { Bytes::from(serde_json::to_vec(&req).unwrap_or_default()) } else { body };
    let keep = req.get("store").and_then(Value::as_bool) != Some(false);
    let capture = keep.then(|| Capture { store: store.clone(), input, buf: Vec::new(), expected: None, done: false });
    Ok(Prepared { body, capture })
}

/// Watches an answer go by and stores the response it carries.
pub struct Capture {
    store: Arc<ResponseStore>,
    input: Vec<Value>,
    buf: Vec<u8>,
    /// A whole (non-stream) body's length, from its head.
    expected: Option<usize>,
    done: bool,
}

impl Capture {
    /// Set from the engine's response head; `None` for a stream.
    pub fn expect_len(&mut self, len: Option<usize>) {
        self.expected = len;
    }

    fn keep(&mut self, response: Value) {
        self.done = true;
        let Some(id) = response.get("id").and_then(Value::as_str).filter(|id| valid_id(id)).map(str::to_owned) else {
            tracing::warn!("an engine response without a usable id; not stored");
            return;
        };
        let created_at = response.get("created_at").and_then(Value::as_u64).unwrap_or(0);
        tracing::debug!(id = %id, "response stored");
        self.store.put(Stored { id, created_at, input: std::mem::take(&mut self.input), response });
    }

    /// Complete `data:` events at the front of the buffer; keeps the final response.
    fn scan_events(&mut self) {
        while let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = self.buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            for data in text.lines().filter_map(|l| l.strip_prefix("data:")) {
                let Ok(v) = serde_json::from_str::<Value>(data.trim()) else { continue };
                let kind = v.get("type").and_then(Value::as_str);
                if matches!(kind, Some("response.completed" | "response.incomplete"))
                    && let Some(r) = v.get("response")
                {
                    self.keep(r.clone());
                    return;
                }
            }
        }
    }
}

impl Tap for Capture {
    fn data(&mut self, chunk: &Bytes) {
        if self.done {
            return;
        }
        if self.buf.len() + chunk.len() > MAX_CAPTURE {
            tracing::warn!("response too large to store");
            self.done = true;
            self.buf = Vec::new();
            return;
        }
        self.buf.extend_from_slice(chunk);
        match self.expected {
            None => self.scan_events(),
            Some(n) if self.buf.len() >= n => self.end(),
            Some(_) => {}
        }
    }

    fn end(&mut self) {
        if self.done || self.expected.is_none() {
            return;
        }
        match serde_json::from_slice::<Value>(&self.buf) {
            Ok(v) => self.keep(v),
            Err(e) => {
                self.done = true;
                tracing::warn!(error = %e, "an engine response that is not JSON; not stored");
            }
        }
    }
}

/// `GET` or `DELETE /v1/responses/{id}`.
pub fn by_id(app: &App, method: &Method, path: &str) -> Response<Body> {
    let id = path.rsplit('/').next().unwrap_or_default();
    let missing = || {
        let e = ApiError::new(ErrorKind::NotFound, format!("response with id '{id}' not found"));
        respond::error(ApiShape::Responses, &e)
    };
    if !valid_id(id) {
        return missing();
    }
    if *method == Method::DELETE {
        return match app.responses.delete(id) {
            true => respond::json(json!({"id": id, "object": "response", "deleted": true}).to_string()),
            false => missing(),
        };
    }
    match app.responses.get(id) {
        Some(s) => {
            let mut r = respond::json(s.response.to_string());
            r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r
        }
        None => missing(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stored::StoreConfig;
    use std::time::Duration;

    fn store() -> Arc<ResponseStore> {
        Arc::new(ResponseStore::open(StoreConfig {
            dir: None,
            max_count: 10,
            max_bytes: 1 << 20,
            // The fixtures are from 1970.
            ttl: Duration::from_secs(u64::MAX / 2),
        }))
    }

    fn response(id: &str, text: &str) -> Value {
        json!({"id": id, "object": "response", "created_at": 1, "status": "completed",
               "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}]})
    }

    #[test]
    fn a_whole_body_is_stored_when_its_last_byte_passes() {
        let s = store();
        let mut h = http::HeaderMap::new();
        let p = prepare(&s, &mut h, Bytes::from_static(br#"{"model":"m","input":"hi"}"#)).unwrap();
        let mut c = p.capture.unwrap();
        let body = response("resp_1", "hello").to_string();
        c.expect_len(Some(body.len()));
        let (a, b) = body.as_bytes().split_at(10);
        c.data(&Bytes::copy_from_slice(a));
        assert!(s.get("resp_1").is_none());
        c.data(&Bytes::copy_from_slice(b));
        let got = s.get("resp_1").expect("stored");
        assert_eq!(got.input, vec![json!({"type": "message", "role": "user", "content": "hi"})]);
    }

    #[test]
    fn a_stream_is_stored_from_its_final_event_split_anywhere() {
        let s = store();
        let mut h = http::HeaderMap::new();
        let mut c = prepare(&s, &mut h, Bytes::from_static(br#"{"input":[],"stream":true}"#)).unwrap().capture.unwrap();
        let done = json!({"type": "response.completed", "response": response("resp_2", "x"), "sequence_number": 3});
        let wire = format!(
            "event: response.created\ndata: {{\"type\":\"response.created\"}}\n\nevent: response.completed\ndata: {done}\n\n"
        );
        for piece in wire.as_bytes().chunks(7) {
            c.data(&Bytes::copy_from_slice(piece));
        }
        assert!(s.get("resp_2").is_some());
    }

    #[test]
    fn previous_response_id_expands_into_history_and_marks_the_request() {
        let s = store();
        s.put(Stored {
            id: "resp_a".into(),
            created_at: 1,
            input: vec![json!({"role": "user", "content": "My name is Ada."})],
            response: response("resp_a", "Hello Ada."),
        });
        let mut h = http::HeaderMap::new();
        h.insert(HISTORY_HEADER, HeaderValue::from_static("expanded"));
        let body = br#"{"input":"What is my name?","previous_response_id":"resp_a","store":false}"#;
        let p = prepare(&s, &mut h, Bytes::from_static(body)).unwrap();
        assert!(p.capture.is_none(), "store: false");
        assert_eq!(h[HISTORY_HEADER], "expanded");
        let sent: Value = serde_json::from_slice(&p.body).unwrap();
        let roles: Vec<&str> = sent["input"].as_array().unwrap().iter().map(|i| i["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["user", "assistant", "user"]);
        assert_eq!(sent["previous_response_id"], "resp_a", "the engine echoes it");

        // A client cannot mark a request itself, and an unknown id is a 404.
        let mut h = http::HeaderMap::new();
        h.insert(HISTORY_HEADER, HeaderValue::from_static("expanded"));
        let p = prepare(&s, &mut h, Bytes::from_static(br#"{"input":"x"}"#)).unwrap();
        assert!(h.get(HISTORY_HEADER).is_none() && p.capture.is_some());
        let e = prepare(&s, &mut h, Bytes::from_static(br#"{"input":"x","previous_response_id":"resp_zz"}"#));
        let e = e.err().unwrap();
        assert_eq!((e.status(), e.param.as_deref()), (404, Some("previous_response_id")));
        let e = prepare(&s, &mut h, Bytes::from_static(br#"{"input":"x","previous_response_id":7}"#));
        assert_eq!(e.err().unwrap().status(), 400);
    }
}
