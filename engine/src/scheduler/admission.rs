//! Memory admission: every request reserves the KV its prompt plus `max_tokens` can
//! grow to (in whole cache blocks), against the engine's KV budget (`--kv-budget`, by
//! default the memory budget less the model file). Pure decisions, tested with plain
//! values; the generation thread holds the running total.
//!
//! - a prompt whose KV cannot fit the budget even alone is refused
//!   (`SchedulerError::OverBudget`, with the numbers);
//! - `max_tokens` (or the context's room, when unset) beyond what fits is capped, and
//!   the cap is reported (a `Warning` header);
//! - a request that fits alone but not beside the running rows waits in the queue
//!   until rows leave (`fits_now`).

use super::SchedulerError;
use crate::kv::BLOCK_TOKENS;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvBudget {
    /// Bytes of KV all running rows together may hold.
    pub bytes: u64,
    /// Bytes of K+V per cached position.
    pub per_token: u64,
}

impl KvBudget {
    /// The most positions one row can hold within the budget (whole blocks).
    pub fn max_tokens(&self) -> usize {
        let block = BLOCK_TOKENS as u64 * self.per_token.max(1);
        ((self.bytes / block) * BLOCK_TOKENS as u64) as usize
    }

    /// Bytes reserved for a row that may reach `tokens` positions.
    pub fn reserve(&self, tokens: usize) -> u64 {
        tokens.div_ceil(BLOCK_TOKENS) as u64 * BLOCK_TOKENS as u64 * self.per_token
    }
}

/// What a request may do under the budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admitted {
    /// `max_tokens` to generate with (capped if it had to be).
    pub max_tokens: usize,
    /// KV bytes reserved while it runs.
    pub kv_bytes: u64,
    /// Said to the client when `max_tokens` was capped.
    pub warning: Option<String>,
}

/// Decide for a prompt of `prompt` tokens asking for `max_tokens` more, within a
/// context of `ctx` positions.
pub fn admit(prompt: usize, max_tokens: usize, ctx: usize, budget: &KvBudget) -> Result<Admitted, SchedulerError> {
    let fit = budget.max_tokens();
    if prompt + 1 > fit {
        return Err(SchedulerError::OverBudget {
            prompt,
            need: budget.reserve(prompt + 1),
            per_token: budget.per_token,
            budget: budget.bytes,
            fit,
        });
    }
    let wanted = max_tokens.min(ctx.saturating_sub(prompt));
    let room = fit - prompt;
    let (max_tokens, warning) = if wanted > room {
        (room, Some(format!("max_tokens capped to {room} by the KV budget ({} bytes)", budget.bytes)))
    } else {
        (max_tokens, None)
    };
    Ok(Admitted { max_tokens, kv_bytes: budget.reserve(prompt + max_tokens.min(wanted)), warning })
}

/// Whether a row reserving `need` bytes may start beside rows holding `held` bytes. A
/// lone row always may (it fits alone by `admit`).
pub fn fits_now(held: u64, need: u64, budget: &KvBudget) -> bool {
    held == 0 || held + need <= budget.bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 100 bytes a token: one block is 3,200 bytes.
    fn b(bytes: u64) -> KvBudget {
        KvBudget { bytes, per_token: 100 }
    }

    #[test]
    fn reservations_are_whole_blocks() {
        assert_eq!(b(0).reserve(1), 3_200);
        assert_eq!(b(0).reserve(32), 3_200);
        assert_eq!(b(0).reserve(33), 6_400);
        assert_eq!(b(10_000).max_tokens(), 96, "three whole blocks");
    }

    #[test]
    fn a_prompt_that_cannot_fit_alone_is_refused_with_the_numbers() {
        let e = admit(96, 10, 4096, &b(10_000)).unwrap_err();
        assert!(matches!(e, SchedulerError::OverBudget { .. }), "{e:?}");
        let message = e.to_string();
        assert!(message.contains("10000 bytes") && message.contains("room for 96 tokens"), "{message}");
        assert!(admit(95, 1, 4096, &b(10_000)).is_ok());
    }

    #[test]
    fn max_tokens_beyond_the_budget_is_capped_and_said() {
        let a = admit(50, 100, 4096, &b(10_000)).unwrap();
        assert_eq!((a.max_tokens, a.kv_bytes), (46, 9_600));
        assert!(a.warning.unwrap().contains("capped to 46"));
        let a = admit(50, 10, 4096, &b(10_000)).unwrap();
        assert_eq!((a.max_tokens, a.kv_bytes, a.warning), (10, 6_400, None));
        // Unset max_tokens means "until the context is full": that much is reserved.
        let a = admit(50, usize::MAX, 64, &b(10_000)).unwrap();
        assert_eq!((a.max_tokens, a.kv_bytes, a.warning), (usize::MAX, 6_400, None));
    }

    #[test]
    fn rows_start_while_the_total_fits() {
        assert!(fits_now(0, 9_999_999, &b(10_000)), "alone it always starts");
        assert!(fits_now(6_400, 3_200, &b(10_000)));
        assert!(!fits_now(6_400, 6_400, &b(10_000)));
    }
}
