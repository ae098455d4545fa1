//! Fixed-string tests of the harmony reader, whole and split at every size.

use super::*;

#[derive(Debug, Default, PartialEq, Eq)]
struct Read {
    reasoning: String,
    text: String,
    calls: Vec<(String, String)>,
}

fn collect(pieces: Vec<Piece>) -> Read {
    let mut r = Read::default();
    for p in pieces {
        match p {
            Piece::Reasoning(t) => r.reasoning.push_str(&t),
            Piece::Text(t) => r.text.push_str(&t),
            Piece::CallStart { index, name } => {
                assert_eq!(index, r.calls.len(), "calls are numbered in order");
                r.calls.push((name, String::new()));
            }
            Piece::CallArgs { index, fragment } => r.calls[index].1.push_str(&fragment),
        }
    }
    r
}

/// Reads `text` whole and in chunks of every size up to 24 bytes; all must agree.
fn read(tools: bool, enforced: bool, text: &str) -> Read {
    let whole = {
        let mut s = HarmonyStream::new(tools, enforced);
        let mut p = s.push(text);
        p.extend(s.finish());
        collect(p)
    };
    for size in 1..=24 {
        let mut s = HarmonyStream::new(tools, enforced);
        let mut pieces = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let mut n = size.min(rest.len());
            while !rest.is_char_boundary(n) {
                n += 1;
            }
            pieces.extend(s.push(&rest[..n]));
            rest = &rest[n..];
        }
        pieces.extend(s.finish());
        assert_eq!(collect(pieces), whole, "chunks of {size}: {text:?}");
    }
    whole
}

fn answer(reasoning: &str, text: &str) -> Read {
    Read { reasoning: reasoning.into(), text: text.into(), calls: vec![] }
}

#[test]
fn analysis_is_reasoning_and_final_is_the_answer() {
    let out = "<|channel|>analysis<|message|>User says hi. Reply briefly 😀.<|end|><|start|>assistant<|channel|>final<|message|>Hello! How can I help?";
    assert_eq!(read(false, false, out), answer("User says hi. Reply briefly 😀.", "Hello! How can I help?"));
    // A final answer alone; a preamble (commentary to no one) is answer text too.
    assert_eq!(read(false, false, "<|channel|>final<|message|>42"), answer("", "42"));
    let preamble =
        "<|channel|>commentary<|message|>Checking. <|end|><|start|>assistant<|channel|>final<|message|>Done.";
    assert_eq!(read(true, true, preamble), answer("", "Checking. Done."));
}

#[test]
fn a_message_to_a_function_is_a_call() {
    let call = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}";
    let want = Read {
        reasoning: "Need weather.".into(),
        text: String::new(),
        calls: vec![("get_weather".into(), "{\"city\": \"Paris\"}".into())],
    };
    assert_eq!(read(true, true, call), want);
    // Not under the grammar: the arguments must parse, and come back re-serialized.
    let mut held = want;
    held.calls[0].1 = "{\"city\":\"Paris\"}".into();
    assert_eq!(read(true, false, call), held);
    // The recipient in the role part of the header, as templates render past calls.
    let in_role =
        "<|channel|>final<|message|>ok<|end|><|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}";
    let r = read(true, true, in_role);
    assert_eq!((r.text.as_str(), r.calls), ("ok", vec![("f".into(), "{}".into())]));
}

#[test]
fn without_tools_or_valid_arguments_a_call_is_text() {
    let call = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": 1}";
    assert_eq!(read(false, true, call), answer("", "{\"a\": 1}"), "the request offered no tools");
    let bad = "<|channel|>commentary to=functions.f<|message|>not json";
    assert_eq!(read(true, false, bad), answer("", "not json"));
    // Other recipients (built-in tools corral does not run): by channel.
    assert_eq!(read(true, true, "<|channel|>analysis to=python<|message|>print(1)"), answer("print(1)", ""));
    assert_eq!(read(true, true, "<|channel|>commentary to=browser.search<|message|>{}"), answer("", "{}"));
}

#[test]
fn output_that_is_not_harmony_is_text() {
    assert_eq!(read(false, false, "Just plain words."), answer("", "Just plain words."));
    let long = "word ".repeat(80);
    assert_eq!(read(false, false, &long), answer("", &long));
    // Cut short inside a header: nothing was written yet.
    assert_eq!(
        read(false, false, "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>fin"),
        answer("hm", "")
    );
    // Cut short inside a body: what was written counts; a marker cut in half is text.
    assert_eq!(
        read(false, false, "<|channel|>analysis<|message|>still thinking <|en"),
        answer("still thinking <|en", "")
    );
}

#[test]
fn headers_are_read_in_any_order() {
    let h = Header::read("assistant to=functions.get_weather<|channel|>commentary json");
    assert_eq!((h.channel.as_deref(), h.recipient.as_deref()), (Some("commentary"), Some("functions.get_weather")));
    let h = Header::read("<|channel|>commentary to=functions.x <|constrain|>json");
    assert_eq!((h.channel.as_deref(), h.recipient.as_deref()), (Some("commentary"), Some("functions.x")));
    assert_eq!(Header::read("<|channel|>final"), Header { channel: Some("final".into()), recipient: None });
}
