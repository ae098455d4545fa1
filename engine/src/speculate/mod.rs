//! Speculative decoding: a drafter guesses the tokens that follow a sequence, the model
//! checks the guesses in one pass (the row `[last token, draft…]`, every position's
//! logits), and the sequence keeps the longest prefix its own sampler agrees with plus
//! the token it samples after it. Each position's logits are the ones a decode step
//! would compute there (batch-invariant numerics, `docs/engine.md`), and each kept
//! token goes through the sequence's normal per-token path (grammar, sampler, stop
//! strings, logprobs), so the output is the output without speculation, token for
//! token; only the number of passes changes.
//!
//! `Drafter` is the seam for sources of guesses: the n-gram drafter here (`ngram`:
//! prompt lookup over the request's own prompt and output) today, a draft model or a
//! model's multi-token-prediction head later. `policy` decides how many of a draft's
//! tokens are worth a pass (pure functions); `Speculator` is one sequence's state.

pub mod ngram;
pub mod policy;

use std::str::FromStr;

use policy::Acceptance;

/// Whether a request speculates, and with which drafter (`--speculate`, the request's
/// `speculate` field).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Speculate {
    #[default]
    Off,
    /// Prompt lookup: drafts copied from where the last tokens occurred before.
    Ngram,
}

impl Speculate {
    pub fn as_str(self) -> &'static str {
        match self {
            Speculate::Off => "off",
            Speculate::Ngram => "ngram",
        }
    }
}

impl FromStr for Speculate {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Speculate::Off),
            "ngram" => Ok(Speculate::Ngram),
            _ => Err(format!("{s:?} is not a speculation mode (off or ngram)")),
        }
    }
}

/// Tokens a drafter proposes to follow the history, and the class of evidence they
/// come from (the n-gram drafter: the length of the matched suffix), whose acceptance
/// rate is tracked apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Draft {
    pub tokens: Vec<u32>,
    pub class: usize,
}

/// A source of guesses. It sees every token of the sequence in order (the prompt, then
/// each emitted token) and never a rejected guess, so it needs no rollback.
pub trait Drafter: Send {
    /// Append tokens to the history the drafts continue.
    fn extend(&mut self, tokens: &[u32]);
    /// Up to `max` tokens likely to follow the history, if it has a guess.
    fn propose(&self, max: usize) -> Option<Draft>;
    /// How many classes `propose` uses (`0..classes()`).
    fn classes(&self) -> usize;
}

/// Draft tokens proposed and accepted by verification (`usage.speculation`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecCounts {
    pub drafted: usize,
    pub accepted: usize,
}

/// One sequence's speculation: its drafter, the acceptance rate of each class of
/// drafts, and what the pass in flight is verifying.
pub struct Speculator {
    drafter: Box<dyn Drafter>,
    rates: Vec<Acceptance>,
    /// The draft being verified and its class.
    draft: Vec<u32>,
    class: usize,
    /// A plain step's guess of its own token (class, token): scored when the token comes,
    /// so acceptance is known while drafting is off.
    shadow: Option<(usize, u32)>,
    pub counts: SpecCounts,
}

impl Speculator {
    /// `None` for `Speculate::Off`.
    pub fn new(mode: Speculate, prompt: &[u32]) -> Option<Self> {
        let mut drafter: Box<dyn Drafter> = match mode {
            Speculate::Off => return None,
            Speculate::Ngram => Box::new(ngram::Ngram::new()),
        };
        drafter.extend(prompt);
        let rates = (0..drafter.classes()).map(policy::prior).collect();
        Some(Self { drafter, rates, draft: Vec::new(), class: 0, shadow: None, counts: SpecCounts::default() })
    }

    /// The draft for the next pass: as many guessed tokens as pay at `cost` (what one
    /// more token in the pass costs, in this row's share of a decode pass:
    /// `policy::draft_len`), at most `room`. Empty means a plain decode step.
    pub fn plan(&mut self, cost: f64, room: usize) -> &[u32] {
        self.draft.clear();
        self.shadow = None;
        let Some(d) = self.drafter.propose(policy::MAX_DRAFT.min(room.max(1))) else {
            return &self.draft;
        };
        let k = policy::draft_len(self.rates[d.class].rate(), cost, d.tokens.len().min(room));
        if k == 0 {
            self.shadow = d.tokens.first().map(|&t| (d.class, t));
        } else {
            self.draft.extend_from_slice(&d.tokens[..k]);
            self.class = d.class;
        }
        &self.draft
    }

    /// The draft the pass in flight verifies.
    pub fn draft(&self) -> &[u32] {
        &self.draft
    }

    /// The pass verified the draft: `accepted` of its tokens were kept.
    pub fn verified(&mut self, accepted: usize) {
        let drafted = self.draft.len();
        if drafted == 0 {
            return;
        }
        self.counts.drafted += drafted;
        self.counts.accepted += accepted;
        let r = &mut self.rates[self.class];
        for _ in 0..accepted {
            r.observe(true);
        }
        if accepted < drafted {
            r.observe(false);
        }
        self.draft.clear();
    }

    /// The sequence emitted `token` (drafted or not).
    pub fn emitted(&mut self, token: u32) {
        if let Some((class, guess)) = self.shadow.take() {
            self.rates[class].observe(guess == token);
        }
        self.drafter.extend(&[token]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for m in [Speculate::Off, Speculate::Ngram] {
            assert_eq!(m.as_str().parse::<Speculate>(), Ok(m));
        }
        assert!("eagle".parse::<Speculate>().is_err());
        assert!(Speculator::new(Speculate::Off, &[1, 2]).is_none());
    }

    #[test]
    fn a_repeated_text_is_drafted_and_counted() {
        let text: Vec<u32> = (10..40).collect();
        let mut prompt = text.clone();
        prompt.extend_from_slice(&text[..5]);
        let mut s = Speculator::new(Speculate::Ngram, &prompt).unwrap();
        // Lookup finds the text's continuation; a cheap pass drafts it.
        let d = s.plan(0.05, 100).to_vec();
        assert!(!d.is_empty() && d.len() <= policy::MAX_DRAFT);
        assert_eq!(d, text[5..5 + d.len()]);
        for &t in &d[..2] {
            s.emitted(t);
        }
        s.emitted(999);
        s.verified(2);
        assert_eq!(s.counts, SpecCounts { drafted: d.len(), accepted: 2 });
        assert!(s.draft().is_empty());
        // An expensive pass drafts nothing but still guesses (shadow) and learns.
        let mut s = Speculator::new(Speculate::Ngram, &prompt).unwrap();
        let before = s.rates.clone();
        assert!(s.plan(5.0, 100).is_empty());
        s.emitted(12345);
        assert_ne!(s.rates, before, "the shadow guess was scored");
        assert_eq!(s.counts.drafted, 0, "shadow guesses are not drafts");
    }

    #[test]
    fn room_bounds_the_draft() {
        let mut prompt: Vec<u32> = (0..20).collect();
        prompt.extend(0..3);
        let mut s = Speculator::new(Speculate::Ngram, &prompt).unwrap();
        assert_eq!(s.plan(0.01, 2), &[3, 4]);
        assert!(s.plan(0.01, 0).is_empty());
    }
}
