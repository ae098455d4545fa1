//! How many prompt tokens a newcomer may read in a pass that also carries decoding rows.
//!
//! A pass costs roughly "one decode step" plus "a per-token price for every prompt token
//! in it". A fixed chunk makes the streams that are already decoding stall for as long as
//! the newcomer's chunk takes; an unbounded one (llama.cpp's default) stalls them for the
//! whole prompt. The pacer measures both costs as the engine runs and sizes each chunk so
//! that a mixed pass takes about `1 + SHARE` decode steps: running streams slow down by a
//! bounded, even amount while a long prompt arrives, and the prompt still advances every
//! pass. With nobody decoding, or more newcomers than established streams (a burst of
//! requests, whose first arrivals began decoding a moment before the rest), prompts go in
//! full `PREFILL_CHUNK`s. Chunking never changes
//! output (the numerics are batch- and chunk-invariant), only who waits.

use crate::generate::PREFILL_CHUNK;

/// A mixed pass may cost this much more than a decode-only pass. 0.3 rather than the
/// first 0.6: running streams' inter-token p99 during a 4,000-token newcomer went from
/// 2.25x to 1.85-1.90x their median on SmolLM2 (1.99x to 1.50x on Gemma 3), and the
/// newcomer's own wait did not grow (chunks mostly sit at `MAX_CHUNK` either way).
pub const SHARE: f64 = 0.3;
/// The least a prefilling row reads per mixed pass, and the most. Late in a long prompt
/// one of its tokens (attention over thousands of cached positions) can cost half a
/// decode pass, so the floor is a single token: the prompt always advances, the running
/// streams never wait more than about `1 + SHARE` passes.
pub const MIN_CHUNK: usize = 1;
pub const MAX_CHUNK: usize = 64;
/// A stream that has generated this many tokens is established: a newcomer is paced
/// beside it unless the newcomers outnumber such streams. Counting every decoding row
/// instead let a single newcomer read at full speed beside the one stream left of
/// several (a tie), which stalled that stream for a whole `PREFILL_CHUNK` pass (1.4 s
/// late in a 4,000-token prompt on SmolLM2); counting only established ones lets the
/// last request of a burst catch up with the first ones, which it otherwise trailed by
/// seconds (its TTFT 2.9× the burst's median at 8 streams).
pub const ESTABLISHED_TOKENS: usize = 16;
/// Weight of the newest observation in the running averages.
const ALPHA: f64 = 0.25;

#[derive(Clone, Debug, Default)]
pub struct Pacer {
    /// Seconds per decode-only pass.
    decode_s: Option<f64>,
    /// Seconds per prompt token, over what the pass's decoding rows cost.
    token_s: Option<f64>,
}

impl Pacer {
    /// Prompt tokens for each of `prefilling` rows in a pass with `decoding` other rows,
    /// `established` of which have streamed `ESTABLISHED_TOKENS` or more. Pacing protects
    /// established streams from a minority of newcomers; when the newcomers outnumber
    /// them (a burst of requests, where the first arrivals started decoding a moment
    /// earlier), reading their prompts at full speed is what most clients are waiting for.
    pub fn chunk(&self, decoding: usize, established: usize, prefilling: usize) -> usize {
        if decoding == 0 || prefilling == 0 || prefilling > established {
            return PREFILL_CHUNK;
        }
        match (self.decode_s, self.token_s) {
            (Some(d), Some(t)) if t > 0.0 => {
                let tokens = (SHARE * d / t / prefilling as f64).round() as usize;
                tokens.clamp(MIN_CHUNK, MAX_CHUNK)
            }
            _ => MIN_CHUNK,
        }
    }

    /// What one more token in a pass of `rows` decoding rows costs, over a row's share
    /// of the pass (`speculate::policy::token_cost`): how deep drafts are verified.
    pub fn token_cost(&self, rows: usize) -> f64 {
        crate::speculate::policy::token_cost(rows, self.decode_s, self.token_s)
    }

    /// A pass with `decoding` rows of one token each (beyond which every token — prompt
    /// or draft — counts in `prompt_tokens`) took `secs`.
    pub fn observe(&mut self, decoding: usize, prompt_tokens: usize, secs: f64) {
        if prompt_tokens == 0 {
            if decoding > 0 {
                self.decode_s = Some(ema(self.decode_s, secs));
            }
            return;
        }
        let base = if decoding > 0 { self.decode_s.unwrap_or(0.0) } else { 0.0 };
        let per = (secs - base).max(secs * 0.05) / prompt_tokens as f64;
        self.token_s = Some(ema(self.token_s, per));
    }
}

fn ema(old: Option<f64>, new: f64) -> f64 {
    match old {
        Some(o) => o + ALPHA * (new - o),
        None => new,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alone_or_without_decoders_prompts_go_in_full_chunks() {
        let p = Pacer::default();
        assert_eq!(p.chunk(0, 0, 1), PREFILL_CHUNK);
        assert_eq!(p.chunk(3, 3, 0), PREFILL_CHUNK);
    }

    #[test]
    fn a_burst_of_newcomers_outnumbering_the_streams_reads_at_full_speed() {
        let mut p = Pacer::default();
        p.observe(1, 0, 0.020);
        p.observe(0, 512, 512.0 * 0.001);
        assert_eq!(p.chunk(1, 1, 7), PREFILL_CHUNK);
        assert_eq!(p.chunk(3, 3, 2), 3, "fewer newcomers than streams: paced");
        assert_eq!(p.chunk(7, 0, 1), PREFILL_CHUNK, "the last of a burst beside its first arrivals");
        assert_eq!(p.chunk(7, 2, 1), 6, "beside established streams: paced");
    }

    #[test]
    fn one_newcomer_beside_the_one_stream_left_is_paced() {
        let mut p = Pacer::default();
        p.observe(1, 0, 0.020);
        p.observe(0, 512, 512.0 * 0.001);
        assert_eq!(p.chunk(1, 1, 1), 6, "a tie protects the stream: 0.3 × 20 ms / 1 ms");
        assert_eq!(p.chunk(2, 2, 2), 3, "so does a tie of two");
        assert_eq!(p.chunk(2, 1, 2), PREFILL_CHUNK, "two newcomers beside one established stream");
    }

    #[test]
    fn before_any_measurement_a_newcomer_beside_decoders_reads_the_minimum() {
        assert_eq!(Pacer::default().chunk(2, 2, 1), MIN_CHUNK);
    }

    #[test]
    fn a_chunk_costs_about_share_of_a_decode_step() {
        let mut p = Pacer::default();
        p.observe(3, 0, 0.020); // decode step 20 ms
        p.observe(0, 512, 512.0 * 0.001); // 1 ms a prompt token
        assert_eq!(p.chunk(3, 3, 1), 6); // 0.3 × 20 ms / 1 ms
        assert_eq!(p.chunk(3, 3, 2), 3, "two newcomers share the allowance");
        assert_eq!(p.chunk(5, 5, 3), 2);
    }

    #[test]
    fn mixed_passes_are_charged_beyond_the_decode_step() {
        let mut p = Pacer::default();
        p.observe(2, 0, 0.010);
        p.observe(2, 4, 0.030); // 20 ms for 4 tokens on top of 10 ms
        assert!((p.token_s.unwrap() - 0.005).abs() < 1e-9);
        assert_eq!(p.chunk(2, 2, 1), 1, "0.3 × 10 / 5 = 0.6 → never nothing");
        assert_eq!(p.chunk(3, 3, 2), MIN_CHUNK, "0.3 × 10 / 5 / 2 = 0.3");
        p.observe(2, 0, 0.200); // decode estimate 10 → 57.5 ms
        assert_eq!(p.chunk(2, 2, 1), 3, "0.3 × 57.5 / 5 = 3.45");
    }

    #[test]
    fn averages_move_toward_new_costs_and_the_chunk_stays_in_bounds() {
        let mut p = Pacer::default();
        p.observe(1, 0, 1.0);
        p.observe(0, 10, 1e-6);
        assert_eq!(p.chunk(2, 2, 1), MAX_CHUNK);
        for _ in 0..50 {
            p.observe(1, 0, 0.010);
        }
        assert!((p.decode_s.unwrap() - 0.010).abs() < 1e-3);
    }

    #[test]
    fn a_pass_faster_than_its_decode_estimate_still_charges_something() {
        let mut p = Pacer::default();
        p.observe(2, 0, 0.050);
        p.observe(2, 10, 0.040);
        assert!(p.token_s.unwrap() > 0.0);
    }
}
