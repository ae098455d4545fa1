//! Function tools: how a model is told about tools, how its calls are written, and how
//! they are read back out of its output.
//!
//! A chat template that knows a tool-call format (`format::ToolFormat::detect`) renders
//! the tools itself; one that does not (both of our test models) gets corral's
//! fallback: the tool list in the system turn and one fixed call syntax (Hermes style,
//! `<tool_call>{…}</tool_call>`). Whichever format, calls are decoded under a grammar
//! (`grammar.rs`) so they parse and their arguments match the tool's schema, and one
//! parser (`stream.rs`) reads them back, incrementally for streams and whole otherwise.

pub mod format;
pub mod grammar;
pub mod prompt;
pub mod stream;

use serde_json::Value;

/// One function tool, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolDef {
    pub name: String,
    pub description: Option<String>,
    /// JSON schema of the arguments object.
    pub parameters: Value,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolMode {
    /// The model chooses between an answer and calls.
    Auto,
    /// At least one call, to any tool.
    Required,
    /// Exactly this tool.
    Named(String),
}

/// What a request asks of tools (`tool_choice: "none"` never gets this far).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolRequest {
    pub tools: Vec<ToolDef>,
    pub mode: ToolMode,
    /// More than one call per answer (`parallel_tool_calls`, default true).
    pub parallel: bool,
}

impl ToolRequest {
    /// The tools a call may name under this mode.
    pub fn callable(&self) -> impl Iterator<Item = &ToolDef> {
        self.tools.iter().filter(move |t| match &self.mode {
            ToolMode::Named(n) => &t.name == n,
            _ => true,
        })
    }
}

/// A call read back from the model's output; `arguments` is JSON text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: String,
}
