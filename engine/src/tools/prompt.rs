//! corral's fallback tool prompt, for chat templates with no tool syntax: the tools
//! and the call syntax go into the system turn; past calls are written into the
//! assistant turn in that syntax; tool results become a user turn wrapped in
//! `<tool_response>` (consecutive results share one turn, so templates that require
//! alternating roles still render).

use serde_json::json;

use super::format::ToolFormat;
use super::{ToolMode, ToolRequest};

/// The system text that describes the tools and how to call them.
pub fn fallback_system(req: &ToolRequest) -> String {
    let fmt = ToolFormat::fallback();
    let mut s =
        String::from("You can call functions (tools). Their names, descriptions and JSON Schemas for the arguments:\n");
    for t in &req.tools {
        let spec = json!({"name": t.name, "description": t.description, "parameters": t.parameters});
        s.push_str(&spec.to_string());
        s.push('\n');
    }
    let example =
        super::ParsedCall { name: "<function name>".into(), arguments: "<arguments as a JSON object>".into() };
    s.push_str("\nTo call a function, reply with exactly:\n");
    s.push_str(&fmt.call_text(&example));
    s.push('\n');
    s.push_str(match &req.mode {
        ToolMode::Auto => "Call a function only when it helps answer; otherwise answer normally.",
        ToolMode::Required => "You must call at least one function now.",
        ToolMode::Named(_) => "",
    });
    if let ToolMode::Named(n) = &req.mode {
        s.push_str(&format!("You must call the function `{n}` now."));
    }
    if req.parallel {
        s.push_str(" You may call several functions, one block each.");
    }
    s.push_str("\nResults come back inside <tool_response></tool_response>.");
    s
}

/// A tool result as the text of a user turn.
pub fn tool_response(content: &str) -> String {
    format!("<tool_response>\n{content}\n</tool_response>")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ToolDef;

    #[test]
    fn fallback_system_lists_tools_and_the_syntax() {
        let req = ToolRequest {
            tools: vec![ToolDef {
                name: "get_weather".into(),
                description: Some("Weather for a city".into()),
                parameters: json!({"type": "object"}),
            }],
            mode: ToolMode::Named("get_weather".into()),
            parallel: false,
        };
        let s = fallback_system(&req);
        assert!(s.contains(r#""name":"get_weather""#), "{s}");
        assert!(s.contains("Weather for a city"));
        assert!(s.contains(
            "<tool_call>\n{\"name\": \"<function name>\", \"arguments\": <arguments as a JSON object>}\n</tool_call>"
        ));
        assert!(s.contains("You must call the function `get_weather` now."));
        assert_eq!(tool_response("42"), "<tool_response>\n42\n</tool_response>");
    }
}
