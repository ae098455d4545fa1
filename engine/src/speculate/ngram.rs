//! Prompt lookup: the drafts are what followed the newest earlier occurrence of the
//! sequence's last `n` tokens (`n` = 3, else 2, else 1) in its own prompt and output.
//! An agent's edit repeats most of the file it was given, so a few matched tokens
//! usually predict many. The index maps each n-gram to where its newest occurrence
//! ends (a position that has a following token), updated as tokens arrive.

use std::collections::HashMap;

use super::{Draft, Drafter};

/// The longest suffix matched.
const MAX_N: usize = 3;

#[derive(Default)]
pub struct Ngram {
    history: Vec<u32>,
    /// Per `n - 1`: the n-gram (zero-padded) → the position after its newest occurrence.
    index: [HashMap<[u32; MAX_N], usize>; MAX_N],
}

fn key(gram: &[u32]) -> [u32; MAX_N] {
    let mut k = [0; MAX_N];
    k[..gram.len()].copy_from_slice(gram);
    k
}

impl Ngram {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Drafter for Ngram {
    fn extend(&mut self, tokens: &[u32]) {
        for &t in tokens {
            // Each n-gram ending here gains `t` as its follower.
            let end = self.history.len();
            for n in 1..=MAX_N.min(end) {
                self.index[n - 1].insert(key(&self.history[end - n..end]), end);
            }
            self.history.push(t);
        }
    }

    fn propose(&self, max: usize) -> Option<Draft> {
        let len = self.history.len();
        (1..=MAX_N.min(len)).rev().find_map(|n| {
            let at = *self.index[n - 1].get(&key(&self.history[len - n..]))?;
            let tokens = self.history[at..(at + max).min(len)].to_vec();
            (!tokens.is_empty()).then_some(Draft { tokens, class: n - 1 })
        })
    }

    fn classes(&self) -> usize {
        MAX_N
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drafter(tokens: &[u32]) -> Ngram {
        let mut d = Ngram::new();
        d.extend(tokens);
        d
    }

    #[test]
    fn the_longest_match_wins_and_its_newest_occurrence() {
        // "1 2 3" occurs twice, followed by 4 then by 8; the suffix "2 3" also after 9.
        let d = drafter(&[1, 2, 3, 4, 5, 1, 2, 3, 8, 9, 2, 3, 7, 1, 2, 3]);
        assert_eq!(d.propose(3), Some(Draft { tokens: vec![8, 9, 2], class: 2 }));
        // Only "3" matches (after 6 it never occurred): class 0.
        let d = drafter(&[3, 5, 6, 7, 6, 3]);
        assert_eq!(d.propose(2), Some(Draft { tokens: vec![5, 6], class: 0 }));
        // Two tokens of suffix.
        let d = drafter(&[9, 4, 5, 6, 1, 4, 5]);
        assert_eq!(d.propose(8), Some(Draft { tokens: vec![6, 1, 4, 5], class: 1 }));
    }

    #[test]
    fn nothing_to_draft_without_an_earlier_occurrence() {
        assert_eq!(drafter(&[]).propose(4), None);
        assert_eq!(drafter(&[1, 2, 3]).propose(4), None);
        assert_eq!(drafter(&[1, 1]).propose(0), None);
    }

    #[test]
    fn tokens_extend_the_index_one_by_one() {
        let mut a = drafter(&[1, 2, 3, 4]);
        a.extend(&[1]);
        a.extend(&[2]);
        let b = drafter(&[1, 2, 3, 4, 1, 2]);
        assert_eq!(a.propose(5), b.propose(5));
        assert_eq!(a.propose(5), Some(Draft { tokens: vec![3, 4, 1, 2], class: 1 }));
    }
}
