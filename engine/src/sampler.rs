//! Token sampling: logit bias, repetition/presence/frequency penalties, then greedy or
//! top-k -> top-p -> min-p -> temperature -> a seeded draw, in llama.cpp's order (the
//! truncation decisions use the untempered distribution; temperature shapes only what
//! is kept). Same seed and inputs give the same tokens.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy (argmax).
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1.0 = off.
    pub top_p: f32,
    /// 0.0 = off.
    pub min_p: f32,
    /// 1.0 = off. Divides positive logits (multiplies negative) of recent tokens.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every recent token.
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of every recent token.
    pub frequency_penalty: f32,
    /// How many recent tokens (prompt included) the penalties look at.
    pub penalty_last_n: usize,
    /// `None` draws a seed from the OS.
    pub seed: Option<u64>,
    /// Added to the logit of each token id.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    /// llama.cpp's defaults.
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: None,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self { temperature: 0.0, ..Self::default() }
    }

    fn penalties_active(&self) -> bool {
        self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }
}

pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// (id, logit) scratch, reused between steps.
    cand: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = match params.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        Self { params, rng, cand: Vec::new() }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Pick the next token. `logits` is modified (bias and penalties applied);
    /// `recent` is the token history (prompt and generated), newest last.
    pub fn sample(&mut self, logits: &mut [f32], recent: &[u32]) -> u32 {
        let p = &self.params;
        for &(id, bias) in &p.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        if p.penalties_active() {
            apply_penalties(logits, &recent[recent.len().saturating_sub(p.penalty_last_n)..], p);
        }
        if p.temperature <= 0.0 {
            return argmax(logits);
        }

        let cand = &mut self.cand;
        cand.clear();
        cand.extend(logits.iter().enumerate().filter(|(_, l)| l.is_finite()).map(|(i, &l)| (i as u32, l)));
        if cand.is_empty() {
            return argmax(logits);
        }
        let by_logit_desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.select_nth_unstable_by(p.top_k - 1, by_logit_desc);
            cand.truncate(p.top_k);
        }
        cand.sort_unstable_by(by_logit_desc);

        // Truncation on the untempered distribution.
        let max = cand[0].1;
        let probs: Vec<f32> = cand.iter().map(|c| (c.1 - max).exp()).collect();
        let total: f32 = probs.iter().sum();
        let mut keep = cand.len();
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            for (i, pr) in probs.iter().enumerate() {
                cum += pr / total;
                if cum >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            // probs[0] is the maximum (relative weight 1.0).
            let n = probs[..keep].iter().take_while(|&&pr| pr >= p.min_p).count();
            keep = n.max(1);
        }
        cand.truncate(keep.max(1));

        // Temperature, then draw.
        let t = p.temperature;
        let weights: Vec<f64> = cand.iter().map(|c| (((c.1 - max) / t) as f64).exp()).collect();
        let sum: f64 = weights.iter().sum();
        let mut r = self.rng.random::<f64>() * sum;
        for (c, w) in cand.iter().zip(&weights) {
            if r < *w {
                return c.0;
            }
            r -= w;
        }
        cand[cand.len() - 1].0
    }
}

fn apply_penalties(logits: &mut [f32], window: &[u32], p: &SamplingParams) {
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for &t in window {
        *counts.entry(t).or_default() += 1;
    }
    for (&id, &n) in &counts {
        let Some(l) = logits.get_mut(id as usize) else {
            continue;
        };
        if p.repetition_penalty != 1.0 {
            *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
        }
        *l -= n as f32 * p.frequency_penalty + p.presence_penalty;
    }
}

/// Index of the largest logit (lowest index on ties, NaN never wins).
///
/// Two passes that vectorize (a decode step's 128k-value vocabulary: ~73 µs with a
/// branch per value, ~21 µs so): the maximum over 16 lanes (a NaN never compares
/// greater), then the first index holding it. Nothing above −∞ → index 0, as a running
/// "v > best" gives.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = logits.chunks_exact(16);
    for c in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = if v > *m { v } else { *m };
        }
    }
    let mut best = f32::NEG_INFINITY;
    for &v in lanes.iter().chain(chunks.remainder()) {
        if v > best {
            best = v;
        }
    }
    if best == f32::NEG_INFINITY {
        return 0;
    }
    for (i, c) in logits.chunks(16).enumerate() {
        if c.iter().fold(false, |any, &v| any | (v == best)) {
            return (i * 16 + c.iter().position(|&v| v == best).unwrap_or(0)) as u32;
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        vec![1.0, 3.0, 2.0, 0.5, 2.9, -1.0]
    }

    #[test]
    fn argmax_is_the_first_largest_and_skips_nan() {
        let running = |l: &[f32]| {
            let (mut best, mut best_v) = (0, f32::NEG_INFINITY);
            for (i, &v) in l.iter().enumerate() {
                if v > best_v {
                    (best, best_v) = (i, v);
                }
            }
            best as u32
        };
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for len in [0, 1, 7, 16, 17, 100, 49152, 128_256] {
            for case in 0..6 {
                let mut l: Vec<f32> = (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        ((x % 2001) as f32 - 1000.0) / 37.0
                    })
                    .collect();
                match case {
                    1 => l.iter_mut().step_by(3).for_each(|v| *v = f32::NAN),
                    2 => l.iter_mut().for_each(|v| *v = f32::NEG_INFINITY),
                    3 => l.iter_mut().for_each(|v| *v = f32::NAN),
                    4 => l.iter_mut().for_each(|v| *v = v.round().min(3.0)),
                    5 if len > 2 => {
                        l[0] = f32::NAN;
                        l[len - 1] = f32::INFINITY;
                    }
                    _ => {}
                }
                assert_eq!(argmax(&l), running(&l), "len {len} case {case}");
            }
        }
    }

    #[test]
    fn greedy_picks_argmax_and_bias_moves_it() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&mut logits(), &[]), 1);
        let mut s = Sampler::new(SamplingParams { logit_bias: vec![(5, 10.0)], ..SamplingParams::greedy() });
        assert_eq!(s.sample(&mut logits(), &[]), 5);
    }

    #[test]
    fn penalties_follow_llama_cpp() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..SamplingParams::greedy()
        };
        let mut l = logits();
        apply_penalties(&mut l, &[1, 1, 5], &p);
        assert_eq!(l[1], 3.0 / 2.0 - 0.5 - 0.5);
        assert_eq!(l[5], -2.0 - 0.25 - 0.5);
        assert_eq!(l[2], 2.0);
        let mut s = Sampler::new(p);
        assert_eq!(s.sample(&mut logits(), &[1, 1]), 4, "penalized best token loses");
    }

    #[test]
    fn same_seed_same_draws() {
        let params =
            SamplingParams { temperature: 1.5, top_k: 0, top_p: 1.0, min_p: 0.0, seed: Some(7), ..Default::default() };
        let draw = |params: &SamplingParams| {
            let mut s = Sampler::new(params.clone());
            (0..50).map(|_| s.sample(&mut logits(), &[])).collect::<Vec<_>>()
        };
        let a = draw(&params);
        assert_eq!(a, draw(&params));
        assert!(a.iter().collect::<std::collections::HashSet<_>>().len() > 2, "high temperature explores");
        assert_ne!(a, draw(&SamplingParams { seed: Some(8), ..params.clone() }));
    }

    #[test]
    fn truncation_limits_the_support() {
        let base =
            SamplingParams { temperature: 5.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: Some(1), ..Default::default() };
        let support = |p: SamplingParams| {
            let mut s = Sampler::new(p);
            let mut seen: Vec<u32> = (0..300).map(|_| s.sample(&mut logits(), &[])).collect();
            seen.sort();
            seen.dedup();
            seen
        };
        assert_eq!(support(SamplingParams { top_k: 2, ..base.clone() }), vec![1, 4]);
        assert_eq!(support(SamplingParams { min_p: 0.5, ..base.clone() }), vec![1, 4]);
        assert_eq!(support(SamplingParams { min_p: 0.3, ..base.clone() }), vec![1, 2, 4]);
        assert_eq!(support(SamplingParams { top_p: 0.5, ..base.clone() }), vec![1, 4]);
        assert_eq!(support(base).len(), 6);
    }
}
