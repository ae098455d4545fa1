//! Fixed-string tests of the tool-call parsers, whole and split at every byte.

use super::*;

fn fmt(syntax: Syntax) -> ToolFormat {
    ToolFormat { syntax, native: true, marker_token: None }
}

fn call(name: &str, args: &str) -> ParsedCall {
    ParsedCall { name: name.into(), arguments: args.into() }
}

/// Feeding `text` in chunks of every size gives the same result as feeding it whole.
fn parse_all_splits(f: &ToolFormat, enforced: bool, text: &str) -> (Option<String>, Vec<ParsedCall>) {
    let whole = parse(f, enforced, text);
    for size in 1..=text.len().min(24) {
        let mut s = ToolStream::new(f.clone(), enforced);
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
        assert_eq!(collect(pieces), whole, "chunk size {size} of {text:?}");
    }
    whole
}

const W: &str =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call>";

#[test]
fn hermes_single_call() {
    // Under the grammar the arguments are passed through as generated; without it they
    // are parsed, so they come back re-serialized.
    let f = fmt(Syntax::Hermes);
    assert_eq!(
        parse_all_splits(&f, true, W),
        (None, vec![call("get_weather", r#"{"city": "Paris", "days": [1, 2]}"#)])
    );
    assert_eq!(parse_all_splits(&f, false, W), (None, vec![call("get_weather", r#"{"city":"Paris","days":[1,2]}"#)]));
}

#[test]
fn hermes_text_then_parallel_calls() {
    let t = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    let text = format!("Let me look. 😀\n{W}\n{t}");
    let (content, calls) = parse_all_splits(&fmt(Syntax::Hermes), true, &text);
    assert_eq!(content.as_deref(), Some("Let me look. 😀\n"));
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1], call("get_time", "{}"));
}

#[test]
fn hermes_plain_text_and_near_misses_are_content() {
    let f = fmt(Syntax::Hermes);
    assert_eq!(
        parse_all_splits(&f, true, "It is <b>sunny</b> <tool"),
        (Some("It is <b>sunny</b> <tool".into()), vec![])
    );
    // Unparseable call JSON without the grammar stays visible as content.
    let bad = "<tool_call>\n{name: get_weather}\n</tool_call>";
    assert_eq!(parse_all_splits(&f, false, bad), (Some(bad.into()), vec![]));
    // Lenient: arguments written as a JSON string, extra spacing.
    let loose = "<tool_call>{ \"name\":\"f\",\"arguments\":\"{\\\"a\\\": 1}\" }</tool_call>";
    assert_eq!(parse_all_splits(&f, false, loose), (None, vec![call("f", r#"{"a":1}"#)]));
}

#[test]
fn hermes_cut_in_the_closer_or_the_next_opener() {
    let f = fmt(Syntax::Hermes);
    let args = r#"{"city": "Paris", "days": [1, 2]}"#;
    for cut in [&W[..W.len() - 6], &format!("{W}\n<tool_")[..]] {
        assert_eq!(parse_all_splits(&f, true, cut), (None, vec![call("get_weather", args)]), "{cut:?}");
    }
}

#[test]
fn hermes_cut_mid_call_keeps_what_was_generated() {
    let cut = &W[..W.len() - 20];
    let (content, calls) = parse(&fmt(Syntax::Hermes), true, cut);
    assert_eq!(content, None);
    assert_eq!(calls[0].name, "get_weather");
    assert!(r#"{"city": "Paris", "days": [1, 2]}"#.starts_with(&calls[0].arguments));
}

#[test]
fn llama3_json_call_and_text() {
    let f = fmt(Syntax::Llama3);
    let c = "{\"name\": \"get_weather\", \"parameters\": {\"city\": {\"name\": \"Oslo\"}}}";
    assert_eq!(parse_all_splits(&f, true, c), (None, vec![call("get_weather", r#"{"city": {"name": "Oslo"}}"#)]));
    assert_eq!(parse_all_splits(&f, false, c), (None, vec![call("get_weather", r#"{"city":{"name":"Oslo"}}"#)]));
    assert_eq!(parse_all_splits(&f, true, "  Hello {there}"), (Some("  Hello {there}".into()), vec![]));
}

#[test]
fn mistral_call_array() {
    let f = fmt(Syntax::Mistral);
    let c = r#"[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]"#;
    assert_eq!(parse_all_splits(&f, true, c), (None, vec![call("a", r#"{"x":1}"#), call("b", "{}")]));
    assert_eq!(parse_all_splits(&f, true, "[1, 2] is a list"), (Some("[1, 2] is a list".into()), vec![]));
}

#[test]
fn streaming_sends_the_name_before_the_arguments() {
    let mut s = ToolStream::new(fmt(Syntax::Hermes), true);
    let mut pieces = s.push("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"ci");
    assert_eq!(pieces[0], Piece::CallStart { index: 0, name: "get_weather".into() });
    assert_eq!(pieces[1], Piece::CallArgs { index: 0, fragment: "{\"ci".into() });
    pieces = s.push("ty\": \"Paris\"}}\n</tool_");
    assert_eq!(pieces, vec![Piece::CallArgs { index: 0, fragment: "ty\": \"Paris\"}".into() }]);
    pieces = s.push("call>");
    assert!(pieces.is_empty(), "{pieces:?}");
    assert!(s.finish().is_empty());
    assert_eq!(s.calls(), 1);
}

/// `chunks` fed one by one, collected.
fn parse_chunks(f: &ToolFormat, enforced: bool, chunks: &[&str]) -> (Option<String>, Vec<ParsedCall>) {
    let mut s = ToolStream::new(f.clone(), enforced);
    let mut pieces: Vec<Piece> = chunks.iter().flat_map(|c| s.push(c)).collect();
    pieces.extend(s.finish());
    collect(pieces)
}

/// Found by the `tool_calls` fuzz target: whitespace that came after content (not
/// right after a call) was held back as a possible separator when it arrived in a
/// chunk of its own, and dropped at the end, so the stream lost text the whole
/// response kept.
#[test]
fn whitespace_after_content_is_content_however_split() {
    let f = fmt(Syntax::Hermes);
    for enforced in [true, false] {
        for (chunks, content) in [
            (&[W, ";", "\n"][..], ";\n"),
            (&["<tool_call>{\"name\":\"\"}</tool_call>;", "\n"][..], ";\n"),
            (&[W, "\n", "ok", "\n", W, " "][..], "\nok\n"),
        ] {
            let whole = parse(&f, enforced, &chunks.concat());
            assert_eq!(whole.0.as_deref(), Some(content), "{chunks:?}");
            assert_eq!(parse_chunks(&f, enforced, chunks), whole, "{chunks:?} enforced={enforced}");
        }
    }
}

/// Found by the `tool_calls` fuzz target (seed 1 in CI's run): under the grammar, a call
/// whose name held the closer and arrived split there was taken as an unparsed call
/// ended by that closer (content), while the whole text read the name to its quote.
#[test]
fn a_closer_inside_a_split_name_waits_for_the_name() {
    let f = fmt(Syntax::Hermes);
    let chunks = ["<tool_call>\n{\"name\": \"g</tool_call>", "get_weather\", \"arguments\": {\"a\": 1}}\n</tool_call>"];
    let whole = parse(&f, true, &chunks.concat());
    assert_eq!(whole, (None, vec![call("g</tool_call>get_weather", r#"{"a": 1}"#)]));
    assert_eq!(parse_chunks(&f, true, &chunks), whole);
    // The fuzz input itself: cut short, with bytes that are not UTF-8.
    let chunks =
        ["<tool_call>\n{\"name\": \"g</tool_call>", "get_weather\", \"arguments\": {stit\ncall", "\n", "<\u{fffd}"];
    assert_eq!(parse_chunks(&f, true, &chunks), parse(&f, true, &chunks.concat()));
    assert_eq!(parse_all_splits(&f, true, &chunks.concat()), parse(&f, true, &chunks.concat()));
}
