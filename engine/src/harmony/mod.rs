//! gpt-oss's "harmony" chat format: messages on channels, tool calls addressed to a
//! recipient.
//!
//! A harmony conversation is a run of messages `<|start|>ROLE<|channel|>CHANNEL<|message|>
//! TEXT<|end|>`. The assistant thinks on the `analysis` channel, answers on `final`, and
//! calls a function by addressing a `commentary` message to it
//! (`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>`);
//! `<|return|>` and `<|call|>` end its turn, `<|end|>` one message of several. The
//! generation prompt ends in `<|start|>assistant`, so the output opens with the first
//! message's header.
//!
//! This module owns the format and nothing else: the built-in template for files without
//! one (`template.rs`), reading an output back into reasoning, answer and calls
//! (`parse.rs`), and the grammar that enforces tool calls and response formats in it
//! (`grammar.rs`). The tokenizer shows `<|start|>`, `<|channel|>`, `<|message|>`,
//! `<|constrain|>` and `<|end|>` as text (as llama.cpp does), which is what the parser
//! reads; `<|return|>` and `<|call|>` end generation and are never seen.

pub mod grammar;
pub mod parse;
pub mod template;

pub const START: &str = "<|start|>";
pub const END: &str = "<|end|>";
pub const MESSAGE: &str = "<|message|>";
pub const CHANNEL: &str = "<|channel|>";
pub const CONSTRAIN: &str = "<|constrain|>";
pub const RETURN: &str = "<|return|>";
pub const CALL: &str = "<|call|>";

/// The recipient prefix of a call to one of the request's function tools.
pub const FUNCTIONS: &str = "functions.";

/// Whether a chat template speaks harmony (gpt-oss's own template or ours).
pub fn speaks(template: &str) -> bool {
    template.contains(CHANNEL) && template.contains(MESSAGE) && template.contains(START)
}

/// Whether a vocabulary is o200k_harmony's: it has the message-structure tokens.
pub fn vocabulary_has(has_token: impl Fn(&str) -> bool) -> bool {
    [START, CHANNEL, MESSAGE, END, RETURN, CALL].into_iter().all(has_token)
}

/// What `reasoning_effort` writes into the system message ("Reasoning: low"); harmony
/// has no way to turn reasoning off, so `none` and `minimal` have no level.
pub fn effort_level(e: crate::reasoning::Effort) -> Option<&'static str> {
    use crate::reasoning::Effort;
    match e {
        Effort::Low => Some("low"),
        Effort::Medium => Some("medium"),
        Effort::High => Some("high"),
        Effort::None | Effort::Minimal => None,
    }
}
