//! Reading model output back: tool calls (`tools::stream`, every syntax, with and
//! without the grammar) and reasoning (`reasoning::ThinkSplit`). Input: a flags byte,
//! then the output text in chunks separated by 0xFF (a byte UTF-8 never contains), as
//! a stream would release it.
//!
//! Asserted: no panic; fed in those chunks, each reader gives exactly what it gives
//! for the whole text at once (the streamed and the whole response never disagree);
//! without the grammar every call's arguments are a JSON object.

use corral_engine::reasoning::{Part, ThinkSplit};
use corral_engine::tools::stream::{ToolStream, collect, parse};

use crate::request::tool_format;

fn joined(parts: Vec<Part>) -> (String, String) {
    let mut out = (String::new(), String::new());
    for p in parts {
        match p {
            Part::Reasoning(t) => out.0.push_str(&t),
            Part::Answer(t) => out.1.push_str(&t),
        }
    }
    out
}

/// The fuzz target `tool_calls` (fuzz/targets/fuzz_targets/tool_calls.rs): one input.
pub fn tool_calls(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else { return };
    let chunks: Vec<String> = rest.split(|&b| b == 0xFF).map(|c| String::from_utf8_lossy(c).into_owned()).collect();
    let text = chunks.concat();

    let fmt = tool_format(flags);
    let enforced = flags & 4 != 0;
    let whole = parse(&fmt, enforced, &text);
    let mut s = ToolStream::new(fmt.clone(), enforced);
    let mut pieces = Vec::new();
    for c in &chunks {
        pieces.extend(s.push(c));
    }
    pieces.extend(s.finish());
    assert_eq!(collect(pieces), whole, "streamed tool calls differ from the whole text's ({fmt:?}, {enforced})");
    if !enforced {
        for c in &whole.1 {
            let args: serde_json::Value = serde_json::from_str(&c.arguments).expect("arguments are JSON");
            assert!(args.is_object(), "arguments are an object: {}", c.arguments);
        }
    }

    let inside = flags & 8 != 0;
    let mut s = ThinkSplit::new(inside);
    let mut all = s.push(&text);
    all.extend(s.finish());
    let mut s = ThinkSplit::new(inside);
    let mut parts = Vec::new();
    for c in &chunks {
        parts.extend(s.push(c));
    }
    parts.extend(s.finish());
    assert_eq!(joined(parts), joined(all), "streamed reasoning differs from the whole text's");
}
