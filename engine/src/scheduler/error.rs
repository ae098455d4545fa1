//! Why the scheduler refused, cut or failed a request, in engine terms. The server maps
//! each variant to an API error in its one error→HTTP site (`server/errors.rs`); nothing
//! here knows about status codes.

use std::sync::Arc;

#[derive(Clone, Debug, thiserror::Error)]
pub enum SchedulerError {
    /// The bounded queue is full: the request was refused at submit time.
    #[error("the request queue is full; retry later")]
    QueueFull,

    /// The generation thread is gone; nothing more will run.
    #[error("the generation thread stopped")]
    Stopped,

    /// Cut before it started: its client left, or every request was cancelled.
    #[error("request cancelled")]
    Cancelled,

    /// The prompt's KV (and a hybrid model's recurrent states) cannot fit the KV budget
    /// even with nothing else running.
    #[error(
        "the prompt needs {need} bytes of KV cache ({prompt} tokens + 1 to generate, {per_token} bytes a token{}), \
         more than the KV budget of {budget} bytes (room for {fit} tokens); raise --kv-budget or shorten the prompt",
        states_note(*.states)
    )]
    OverBudget { prompt: usize, need: u64, per_token: u64, states: u64, budget: u64, fit: usize },

    /// Starting or running the sequence failed. Shared: one failed forward pass fails
    /// every row that was in it.
    #[error(transparent)]
    Engine(Arc<crate::Error>),
}

/// A hybrid model's share of an over-budget request.
fn states_note(states: u64) -> String {
    if states == 0 { String::new() } else { format!(", and {states} bytes of recurrent state") }
}

impl From<crate::Error> for SchedulerError {
    fn from(e: crate::Error) -> Self {
        Self::Engine(Arc::new(e))
    }
}
