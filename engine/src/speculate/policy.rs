//! How many drafted tokens a pass should verify: pure decisions on plain numbers.
//!
//! A drafted token at depth `j` (the `j`-th after the last emitted one) is kept only if
//! the `j − 1` before it were, so with a per-token acceptance rate `p` it yields `p^j`
//! tokens in expectation. It costs `cost`: the time one more token adds to the pass,
//! over this row's share of a decode pass (`rows · token_s / decode_s`, measured by
//! the scheduler's pacer). It pays when it yields more tokens per second than the pass
//! does on average: `p^j > cost`. So a draft is verified up to the deepest such `j`,
//! and not at all where acceptance is low or extra tokens are dear (free chat on a
//! busy batch): the pass is then a plain decode step, as without speculation.

/// The most drafted tokens a pass verifies (the CUDA backend keeps rows under 32 tokens
/// on its decode matmul kernels).
pub const MAX_DRAFT: usize = 16;

/// Weight of the newest outcome in an acceptance rate.
const ALPHA: f64 = 0.1;

/// What an extra token costs when the pacer has not measured it yet (prompt tokens cost
/// ~0.15–0.25 of a decode step on the CPU test models, `docs/benchmarks.md`).
pub const DEFAULT_COST: f64 = 0.3;

/// A running per-token acceptance rate (an exponential average of outcomes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Acceptance(f64);

impl Acceptance {
    pub fn new(p: f64) -> Self {
        Self(p.clamp(0.0, 1.0))
    }

    pub fn rate(self) -> f64 {
        self.0
    }

    /// One drafted (or shadow-guessed) token was or was not the sampled one.
    pub fn observe(&mut self, kept: bool) {
        self.0 += ALPHA * (f64::from(u8::from(kept)) - self.0);
    }
}

/// The starting rate of an n-gram class (`class + 1` tokens matched): longer matches
/// are likelier to go on. Measured rates replace these within a few dozen tokens.
pub fn prior(class: usize) -> Acceptance {
    Acceptance::new(match class {
        0 => 0.2,
        1 => 0.35,
        _ => 0.5,
    })
}

/// How many of `available` drafted tokens to verify: the deepest `j` with `p^j > cost`.
pub fn draft_len(p: f64, cost: f64, available: usize) -> usize {
    let mut yield_j = 1.0;
    for j in 1..=available {
        yield_j *= p;
        if yield_j <= cost {
            return j - 1;
        }
    }
    available
}

/// `cost` for a pass of `rows` decoding rows, from the pacer's measurements (seconds per
/// decode-only pass, seconds per extra token), or `DEFAULT_COST` per row before both
/// are known.
pub fn token_cost(rows: usize, decode_s: Option<f64>, token_s: Option<f64>) -> f64 {
    let rows = rows.max(1) as f64;
    match (decode_s, token_s) {
        (Some(d), Some(t)) if d > 0.0 => rows * t / d,
        _ => rows * DEFAULT_COST,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_stop_where_the_expected_yield_falls_under_the_cost() {
        // 0.9^j > 0.3 for j <= 11.
        assert_eq!(draft_len(0.9, 0.3, 16), 11);
        assert_eq!(draft_len(0.9, 0.3, 4), 4);
        assert_eq!(draft_len(0.5, 0.3, 16), 1);
        assert_eq!(draft_len(0.25, 0.3, 16), 0);
        assert_eq!(draft_len(1.0, 0.3, 16), 16);
        assert_eq!(draft_len(0.0, 0.0, 16), 0);
        assert_eq!(draft_len(0.99, 1.5, 16), 0, "a token dearer than a step never pays");
    }

    #[test]
    fn acceptance_follows_outcomes() {
        let mut a = prior(2);
        for _ in 0..50 {
            a.observe(true);
        }
        assert!(a.rate() > 0.99);
        for _ in 0..50 {
            a.observe(false);
        }
        assert!(a.rate() < 0.01);
        assert!(prior(0).rate() < prior(1).rate() && prior(1).rate() < prior(2).rate());
    }

    #[test]
    fn cost_scales_with_the_rows_sharing_the_pass() {
        assert_eq!(token_cost(1, Some(0.02), Some(0.004)), 0.2);
        assert!((token_cost(4, Some(0.04), Some(0.004)) - 0.4).abs() < 1e-12);
        assert_eq!(token_cost(2, None, Some(0.004)), 2.0 * DEFAULT_COST);
        assert_eq!(token_cost(0, Some(0.0), Some(0.004)), DEFAULT_COST);
    }
}
