//! Chat templates (`chat::ChatTemplate`, minijinja with fuel), hostile ones included:
//! a template comes from the model file or `--chat-template`, the messages from
//! requests. Input: a flags byte, the template source, a 0xFF byte, then message
//! contents separated by 0xFE.
//!
//! Asserted: compiling and rendering never panic, and finish within libFuzzer's time
//! and memory limits (`-timeout`, `-rss_limit_mb`): fuel bounds loops, minijinja's
//! recursion limit bounds macros and includes, a 64 MiB cap bounds the rendered text
//! (seed `wide-output`). Strings built up in variables are not bounded: docs/reliability.md,
//! "Known limit".

use corral_engine::builtin_templates;
use corral_engine::chat::{ChatMessage, ChatTemplate};
use corral_engine::config::Arch;
use serde_json::json;

const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

fn messages(flags: u8, rest: &[u8]) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = rest
        .split(|&b| b == 0xFE)
        .enumerate()
        .map(|(i, c)| ChatMessage::new(ROLES[i % ROLES.len()], &String::from_utf8_lossy(c)))
        .collect();
    if flags & 0x10 != 0
        && let Some(m) = out.iter_mut().find(|m| m.role == "assistant")
    {
        m.tool_calls = Some(vec![json!({"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": m.content}}})]);
        m.content = None;
    }
    out
}

/// The fuzz target `chat_template` (fuzz/targets/fuzz_targets/chat_template.rs): one input.
pub fn chat_template(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else { return };
    let (src, rest) = match rest.iter().position(|&b| b == 0xFF) {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (rest, &[][..]),
    };
    let src = String::from_utf8_lossy(src);
    // An empty source takes a family's built-in template.
    let arch = if flags & 1 != 0 { Arch::Gemma3 } else { Arch::Mistral3 };
    let builtin = builtin_templates::choose(arch, |_| false);
    let Ok(t) = ChatTemplate::new(Some(&src), builtin, "<s>", "</s>", flags & 2 != 0) else { return };
    let msgs = messages(flags, rest);
    let tools = (flags & 4 != 0).then(|| {
        json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
    });
    let mut kwargs = serde_json::Map::new();
    if flags & 8 != 0 {
        kwargs.insert("enable_thinking".into(), json!(flags & 0x20 != 0));
        kwargs.insert("messages".into(), json!("kwargs never replace the conversation"));
    }
    let _ = t.render_with(&msgs, tools.as_ref(), flags & 0x40 != 0, &kwargs);
}
