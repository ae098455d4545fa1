//! A guard against runaway numbers in JSON output.
//!
//! JSON Schema cannot bound how many digits a number has, and a small model that
//! starts `30.000` often never stops writing zeros: the grammar keeps allowing digits,
//! the output hits `max_tokens`, and the JSON does not parse. Under JSON grammars
//! (schemas, JSON objects, tool arguments) corral therefore refuses a token that would
//! make a run of consecutive ASCII digits longer than `MAX_DIGIT_RUN` (20: every u64
//! fits, a double carries 17 significant digits) — unless the grammar allows nothing
//! else, so a schema that requires a longer run (a `pattern` of 30 digits) still
//! completes. Output stays valid under the schema: the guard only removes choices.

use toktrie::SimpleVob;

pub const MAX_DIGIT_RUN: usize = 20;

pub struct DigitTable {
    /// Tokens that begin with digits and how many, longest first.
    leading: Vec<(u32, usize)>,
    /// Per token: digits at its end, and whether it is all digits (then a run goes on).
    trailing: Vec<(u16, bool)>,
}

impl DigitTable {
    /// From each token's bytes.
    pub fn new(words: &[Vec<u8>]) -> Self {
        let mut leading = Vec::new();
        let mut trailing = Vec::with_capacity(words.len());
        for (id, w) in words.iter().enumerate() {
            let lead = w.iter().take_while(|b| b.is_ascii_digit()).count();
            let trail = w.iter().rev().take_while(|b| b.is_ascii_digit()).count();
            if lead > 0 {
                leading.push((id as u32, lead));
            }
            trailing.push((trail.min(u16::MAX as usize) as u16, !w.is_empty() && lead == w.len()));
        }
        leading.sort_by_key(|&(_, lead)| std::cmp::Reverse(lead));
        Self { leading, trailing }
    }

    /// The run of digits at the end of the output after `id` follows a run of `run`.
    pub fn next_run(&self, run: usize, id: u32) -> usize {
        match self.trailing.get(id as usize) {
            Some(&(_, true)) => run + self.trailing[id as usize].0 as usize,
            Some(&(trail, false)) => trail as usize,
            None => 0,
        }
    }

    /// Take out of `mask` every token that would push the run past the limit, unless
    /// that would leave no token at all.
    pub fn limit(&self, run: usize, mask: &mut SimpleVob) {
        let room = MAX_DIGIT_RUN.saturating_sub(run);
        if self.leading.first().is_none_or(|&(_, lead)| lead <= room) {
            return;
        }
        let mut limited = mask.clone();
        for &(id, lead) in &self.leading {
            if lead <= room {
                break;
            }
            limited.disallow_token(id);
        }
        if !limited.is_zero() {
            *mask = limited;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> DigitTable {
        // 0: "0", 1: "000", 2: "}", 3: "1}", 4: ".5", 5: "12a34"
        let words: Vec<Vec<u8>> =
            ["0", "000", "}", "1}", ".5", "12a34"].iter().map(|w| w.as_bytes().to_vec()).collect();
        DigitTable::new(&words)
    }

    #[test]
    fn runs_continue_through_digit_tokens_and_restart_after_others() {
        let t = table();
        assert_eq!(t.next_run(5, 0), 6);
        assert_eq!(t.next_run(5, 1), 8);
        assert_eq!(t.next_run(5, 2), 0);
        assert_eq!(t.next_run(5, 4), 1);
        assert_eq!(t.next_run(5, 5), 2);
    }

    #[test]
    fn limit_removes_tokens_that_overrun_but_never_everything() {
        let t = table();
        let mut all = SimpleVob::alloc(6);
        for id in 0..6 {
            all.allow_token(id);
        }
        let mut m = all.clone();
        t.limit(MAX_DIGIT_RUN - 2, &mut m);
        assert!(m.is_allowed(0) && !m.is_allowed(1) && m.is_allowed(3), "one more digit fits, three do not");
        let mut m = all.clone();
        t.limit(MAX_DIGIT_RUN, &mut m);
        assert!(!m.is_allowed(0) && !m.is_allowed(3) && !m.is_allowed(5) && m.is_allowed(2) && m.is_allowed(4));
        let mut only_digits = SimpleVob::alloc(6);
        only_digits.allow_token(0);
        t.limit(MAX_DIGIT_RUN, &mut only_digits);
        assert!(only_digits.is_allowed(0), "the grammar's only way on is kept");
    }
}
