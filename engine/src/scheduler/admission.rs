//! Memory admission: every request reserves the KV its prompt plus `max_tokens` can
//! grow to (in whole cache blocks), and for a hybrid model the recurrent states it holds
//! (its own and the snapshots taken while reading its prompt, `checkpoint::snapshots`),
//! against the engine's KV budget (`--kv-budget`, by default the memory budget less the
//! model file). Pure decisions, tested with plain values; the generation thread holds the
//! running total.
//!
//! - a prompt whose KV and states cannot fit the budget even alone is refused
//!   (`SchedulerError::OverBudget`, with the numbers);
//! - `max_tokens` (or the context's room, when unset) beyond what fits is capped, and
//!   the cap is reported (a `Warning` header);
//! - a request that fits alone but not beside the running rows waits in the queue
//!   until rows leave (`fits_now`).

use super::SchedulerError;
use crate::checkpoint;
use crate::kv::BLOCK_TOKENS;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvBudget {
    /// Bytes of KV (and recurrent states) all running rows together may hold.
    pub bytes: u64,
    /// Bytes of K+V per cached position.
    pub per_token: u64,
    /// Bytes of one recurrent state of a hybrid model (the convolution and delta-rule
    /// state of every recurrent layer, `RecurrentShape::bytes`); 0 for other models.
    pub state_bytes: u64,
}

impl KvBudget {
    /// Bytes of recurrent state a row whose prompt is `prompt` tokens holds: its own
    /// state and a snapshot at each checkpoint of the prompt (none for other models).
    pub fn states(&self, prompt: usize) -> u64 {
        if self.state_bytes == 0 {
            return 0;
        }
        (1 + checkpoint::snapshots(prompt) as u64) * self.state_bytes
    }

    /// The most positions (whole blocks) a row with a `prompt`-token prompt can reach
    /// within the budget, beside its states.
    fn positions_for(&self, prompt: usize) -> usize {
        let block = BLOCK_TOKENS as u64 * self.per_token.max(1);
        ((self.bytes.saturating_sub(self.states(prompt)) / block) * BLOCK_TOKENS as u64) as usize
    }

    /// The longest prompt (whole blocks) one row can hold within the budget with its
    /// states: the context that fits.
    pub fn max_tokens(&self) -> usize {
        // `positions_for` falls as the prompt grows: the largest n <= positions_for(n).
        let (mut lo, mut hi) = (0, self.positions_for(0) / BLOCK_TOKENS);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if mid * BLOCK_TOKENS <= self.positions_for(mid * BLOCK_TOKENS) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo * BLOCK_TOKENS
    }

    /// Bytes reserved for a row with a `prompt`-token prompt that may reach `tokens`
    /// positions.
    pub fn reserve(&self, prompt: usize, tokens: usize) -> u64 {
        tokens.div_ceil(BLOCK_TOKENS) as u64 * BLOCK_TOKENS as u64 * self.per_token + self.states(prompt)
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
    let fit = budget.positions_for(prompt);
    if prompt + 1 > fit {
        return Err(SchedulerError::OverBudget {
            prompt,
            need: budget.reserve(prompt, prompt + 1),
            per_token: budget.per_token,
            states: budget.states(prompt),
            budget: budget.bytes,
            fit: budget.max_tokens(),
        });
    }
    let wanted = max_tokens.min(ctx.saturating_sub(prompt));
    let room = fit - prompt;
    let (max_tokens, warning) = if wanted > room {
        (room, Some(format!("max_tokens capped to {room} by the KV budget ({} bytes)", budget.bytes)))
    } else {
        (max_tokens, None)
    };
    Ok(Admitted { max_tokens, kv_bytes: budget.reserve(prompt, prompt + max_tokens.min(wanted)), warning })
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
        KvBudget { bytes, per_token: 100, state_bytes: 0 }
    }

    /// The same, and a recurrent state of 1,000 bytes.
    fn hybrid(bytes: u64) -> KvBudget {
        KvBudget { state_bytes: 1_000, ..b(bytes) }
    }

    #[test]
    fn reservations_are_whole_blocks() {
        assert_eq!(b(0).reserve(1, 1), 3_200);
        assert_eq!(b(0).reserve(1, 32), 3_200);
        assert_eq!(b(0).reserve(1, 33), 6_400);
        assert_eq!(b(10_000).max_tokens(), 96, "three whole blocks");
    }

    #[test]
    fn a_hybrid_row_reserves_its_state_and_its_prompts_snapshots() {
        // Its own state; + a tail snapshot from 256 tokens; + one per 2,048.
        assert_eq!(hybrid(0).reserve(10, 32), 3_200 + 1_000);
        assert_eq!(hybrid(0).reserve(300, 320), 32_000 + 2_000);
        assert_eq!(hybrid(0).reserve(5_000, 5_024), 502_400 + 4_000, "2,048, 4,096, the tail");
        // 10,000 bytes: 9,000 after the state, two whole blocks.
        assert_eq!(hybrid(10_000).max_tokens(), 64);
        let a = admit(50, 100, 4096, &hybrid(10_000)).unwrap();
        assert_eq!((a.max_tokens, a.kv_bytes), (14, 7_400));
        // A prompt that would fit by its KV alone, not with its states.
        let e = admit(90, 1, 4096, &hybrid(10_000)).unwrap_err();
        let message = e.to_string();
        assert!(message.contains("10600 bytes") && message.contains("1000 bytes of recurrent state"), "{message}");
        assert!(admit(90, 1, 4096, &b(10_000)).is_ok());
        // The context that fits stops where the snapshots' growth catches up with it.
        let big = KvBudget { bytes: 1_000_000, per_token: 1, state_bytes: 100_000 };
        let n = big.max_tokens();
        assert!(big.reserve(n, n) <= big.bytes && big.reserve(n + 32, n + 32) > big.bytes, "{n}");
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
