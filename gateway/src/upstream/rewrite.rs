//! The request as an upstream gets it: the body's top-level `model` set to the
//! upstream's name for the model (every other byte unchanged: the value is spliced, the
//! body is not re-serialized), and the headers without the hop-by-hop ones, without the
//! client's credentials for this gateway, with the upstream's key when it has one. Pure.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, header};

/// Headers that never go upstream: the client's key is this gateway's, not the
/// upstream's, and corral's history marker is set by a gateway only.
const DROPPED: [&str; 3] = ["authorization", "x-api-key", "x-corral-history"];

/// `body` (a JSON object) with its top-level `model` set to `name`: the value replaced
/// where it is (the last one, if the key is given twice), or added first when absent.
/// `None` when the body is not a JSON object.
pub fn set_model(body: &[u8], name: &str) -> Option<Bytes> {
    let value = serde_json::to_string(name).ok()?;
    let (open, spans) = top_level_spans(body, b"model")?;
    let mut out = Vec::with_capacity(body.len() + value.len() + 10);
    match spans.last() {
        Some(&(start, end)) => {
            if body[start..end] == *value.as_bytes() {
                return Some(Bytes::copy_from_slice(body));
            }
            out.extend_from_slice(&body[..start]);
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(&body[end..]);
        }
        None => {
            out.extend_from_slice(&body[..=open]);
            out.extend_from_slice(b"\"model\":");
            out.extend_from_slice(value.as_bytes());
            let rest = &body[open + 1..];
            if rest.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'}') {
                out.push(b',');
            }
            out.extend_from_slice(rest);
        }
    }
    Some(Bytes::from(out))
}

/// The offset of the object's `{` and the byte ranges of every top-level value whose key
/// is `key`.
fn top_level_spans(b: &[u8], key: &[u8]) -> Option<(usize, Vec<(usize, usize)>)> {
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    let open = i;
    i = skip_ws(b, i + 1);
    let mut spans = Vec::new();
    if b.get(i) == Some(&b'}') {
        return Some((open, spans));
    }
    loop {
        let key_end = string_end(b, i)?;
        let is_key = key_matches(&b[i..key_end], key);
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        let start = skip_ws(b, i + 1);
        let end = value_end(b, start)?;
        if is_key {
            spans.push((start, end));
        }
        i = skip_ws(b, end);
        match b.get(i)? {
            b',' => i = skip_ws(b, i + 1),
            b'}' => return Some((open, spans)),
            _ => return None,
        }
    }
}

/// A JSON string token (quotes included) equals `key` once unescaped.
fn key_matches(token: &[u8], key: &[u8]) -> bool {
    if !token.contains(&b'\\') {
        return token.get(1..token.len() - 1) == Some(key);
    }
    serde_json::from_slice::<String>(token).is_ok_and(|s| s.as_bytes() == key)
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    i
}

/// The end (exclusive) of the string starting at `i` (its `"`).
fn string_end(b: &[u8], i: usize) -> Option<usize> {
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let mut j = i + 1;
    loop {
        match b.get(j)? {
            b'\\' => j += 2,
            b'"' => return Some(j + 1),
            _ => j += 1,
        }
    }
}

/// The end (exclusive) of the value starting at `i`: a string, an array or object
/// (brackets counted outside strings), or a scalar up to the next delimiter.
fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match b.get(i)? {
        b'"' => string_end(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            loop {
                match b.get(j)? {
                    b'"' => {
                        j = string_end(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        _ => {
            let mut j = i;
            while b.get(j).is_some_and(|c| !matches!(c, b',' | b'}' | b']') && !c.is_ascii_whitespace()) {
                j += 1;
            }
            (j > i).then_some(j)
        }
    }
}

/// The client's headers made the upstream's: hop-by-hop headers are the proxy's to
/// drop (`strip_hop`); here the client's credentials go and the upstream's key, if any,
/// comes in.
pub fn headers(h: &mut HeaderMap, key: Option<&HeaderValue>) {
    for name in DROPPED {
        h.remove(HeaderName::from_static(name));
    }
    if let Some(k) = key {
        h.insert(header::AUTHORIZATION, k.clone());
    }
}

/// `Bearer <key>` as a header value marked sensitive (never printed by `http`'s Debug).
pub fn bearer(key: &str) -> Option<HeaderValue> {
    let mut v = HeaderValue::from_str(&format!("Bearer {}", key.trim())).ok()?;
    v.set_sensitive(true);
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(body: &str, name: &str) -> String {
        String::from_utf8(set_model(body.as_bytes(), name).unwrap().to_vec()).unwrap()
    }

    #[test]
    fn the_model_value_is_spliced_and_nothing_else_moves() {
        let body =
            r#"{ "messages": [{"role":"user","content":"a \"model\": b"}], "model" : "big",  "temperature":0.10}"#;
        assert_eq!(
            set(body, "meta/llama-3"),
            r#"{ "messages": [{"role":"user","content":"a \"model\": b"}], "model" : "meta/llama-3",  "temperature":0.10}"#
        );
        // Nested `model` keys are not the request's.
        let nested = r#"{"tools":[{"model":"x"}],"meta":{"model":"y"}}"#;
        assert_eq!(set(nested, "m"), r#"{"model":"m","tools":[{"model":"x"}],"meta":{"model":"y"}}"#);
        // The last of a repeated key is the one read, and the one set.
        assert_eq!(set(r#"{"model":"a","model":"b"}"#, "c"), r#"{"model":"a","model":"c"}"#);
        // A value of another type is replaced whole; an escaped key is still the key.
        assert_eq!(set(r#"{"model":{"a":[1,"}"]},"x":1}"#, "m"), r#"{"model":"m","x":1}"#);
        assert_eq!(set(r#"{"\u006dodel":5}"#, "m"), r#"{"\u006dodel":"m"}"#);
        assert_eq!(set(r#"{"model":null}"#, "m"), r#"{"model":"m"}"#);
    }

    #[test]
    fn a_missing_model_is_added_and_names_are_escaped() {
        assert_eq!(set("{}", "m"), r#"{"model":"m"}"#);
        assert_eq!(set(" { } ", "m"), r#" {"model":"m" } "#);
        assert_eq!(set(r#"{"prompt":"hi"}"#, r#"a"b"#), r#"{"model":"a\"b","prompt":"hi"}"#);
        let same = r#"{"model":"m"}"#;
        assert_eq!(set(same, "m"), same);
    }

    #[test]
    fn anything_but_an_object_is_left_alone() {
        for bad in ["[1]", "\"model\"", "{\"model\"}", "{\"model\":", "{\"a\":1,}", ""] {
            assert_eq!(set_model(bad.as_bytes(), "m"), None, "{bad}");
        }
    }

    #[test]
    fn the_clients_key_stays_here_and_the_upstreams_goes() {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_static("Bearer client-key"));
        h.insert("x-api-key", HeaderValue::from_static("client-key"));
        h.insert("x-corral-history", HeaderValue::from_static("expanded"));
        h.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
        let mut without = h.clone();
        headers(&mut without, None);
        assert_eq!(without.len(), 1);
        let key = bearer("sk-upstream").unwrap();
        headers(&mut h, Some(&key));
        assert_eq!(h["authorization"], "Bearer sk-upstream");
        assert!(h.get("x-api-key").is_none() && h.get("x-corral-history").is_none());
        assert!(h["authorization"].is_sensitive());
        assert!(!format!("{h:?}").contains("sk-upstream"), "not in Debug output");
    }
}
