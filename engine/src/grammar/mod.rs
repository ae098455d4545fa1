//! Constrained decoding with llguidance: request constraints (`constraint`), the
//! model's vocabulary as byte strings (`vocab`), and per-request matchers that mask
//! logits before sampling (`matcher`). See docs/structured-output.md.

mod constraint;
mod digits;
mod matcher;
mod vocab;

pub use constraint::{Constraint, lark_literal, with_json_layout};
pub use digits::MAX_DIGIT_RUN;
pub use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
pub use matcher::{Grammar, Grammars};
