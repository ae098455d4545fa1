//! Bounds on what an engine's stderr may cost the gateway. An engine is untrusted in
//! this respect: a bug (or a model's chat template in a loop) can print without end,
//! and the gateway must keep serving at the same pace with the same memory.
//!
//! - A line is kept up to `MAX_LINE_BYTES`; the rest of it is read and dropped, so a
//!   newline-free flood never grows a buffer (`read_bounded_line`).
//! - Lines are re-emitted as gateway log lines at most `PER_SEC` a second with bursts of
//!   `BURST` (a token bucket, `LogBudget`); what is left out is counted and said in the
//!   next line that passes. The crash-report tail (`child.rs`) still sees every line.
//!
//! The budget is pure (the clock is an argument); the reader is the only I/O here.

use std::time::{Duration, Instant};

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// The longest stderr line kept (the rest is dropped, and the line marked as cut).
pub const MAX_LINE_BYTES: usize = 8 * 1024;
/// Re-emitted lines a second, on average, per engine.
pub const PER_SEC: u32 = 200;
/// Lines that may pass at once after a quiet spell.
pub const BURST: u32 = 400;

/// A token bucket over log lines.
#[derive(Debug)]
pub struct LogBudget {
    per_sec: u32,
    burst: u32,
    tokens: f64,
    last: Instant,
    dropped: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Log it; `dropped` lines were left out since the last one that passed.
    Emit { dropped: u64 },
    /// Leave it out (counted).
    Drop,
}

impl LogBudget {
    pub fn new(per_sec: u32, burst: u32, now: Instant) -> Self {
        Self { per_sec, burst, tokens: f64::from(burst), last: now, dropped: 0 }
    }

    pub fn admit(&mut self, now: Instant) -> Verdict {
        let dt = now.saturating_duration_since(self.last);
        self.last = now;
        self.tokens = (self.tokens + dt.as_secs_f64() * f64::from(self.per_sec)).min(f64::from(self.burst));
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Verdict::Emit { dropped: std::mem::take(&mut self.dropped) }
        } else {
            self.dropped += 1;
            Verdict::Drop
        }
    }

    /// Lines left out and not yet reported.
    pub fn pending(&self) -> u64 {
        self.dropped
    }

    /// How long until at least one line may pass again.
    pub fn refill_in(&self) -> Duration {
        let missing = (1.0 - self.tokens).max(0.0);
        Duration::from_secs_f64(missing / f64::from(self.per_sec.max(1)))
    }
}

/// One line of at most `max` bytes (without its newline; lossily decoded), the rest of
/// a longer line skipped, and whether it was cut. `None` at EOF or on a read error.
pub async fn read_bounded_line<R: AsyncBufRead + Unpin>(r: &mut R, max: usize) -> Option<(String, bool)> {
    let mut line: Vec<u8> = Vec::new();
    let mut cut = false;
    loop {
        let buf = match r.fill_buf().await {
            Ok(b) => b,
            Err(_) => return None,
        };
        if buf.is_empty() {
            return (!line.is_empty() || cut).then(|| (String::from_utf8_lossy(&line).into_owned(), cut));
        }
        let (piece, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        let room = max.saturating_sub(line.len());
        line.extend_from_slice(&piece[..piece.len().min(room)]);
        cut |= piece.len() > room;
        let used = done.unwrap_or(buf.len());
        r.consume(used);
        if done.is_some() {
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Some((String::from_utf8_lossy(&line).into_owned(), cut));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_the_rate_holds_and_drops_are_reported_once() {
        let t0 = Instant::now();
        let mut b = LogBudget::new(10, 5, t0);
        for _ in 0..5 {
            assert_eq!(b.admit(t0), Verdict::Emit { dropped: 0 });
        }
        for _ in 0..100 {
            assert_eq!(b.admit(t0), Verdict::Drop);
        }
        assert_eq!(b.pending(), 100);
        assert!(b.refill_in() <= Duration::from_millis(100));
        // 100 ms later one line passes and carries the count.
        assert_eq!(b.admit(t0 + Duration::from_millis(100)), Verdict::Emit { dropped: 100 });
        assert_eq!(b.admit(t0 + Duration::from_millis(100)), Verdict::Drop);
        // A long quiet spell refills only up to the burst.
        let later = t0 + Duration::from_secs(60);
        let passed = (0..50).filter(|_| matches!(b.admit(later), Verdict::Emit { .. })).count();
        assert_eq!(passed, 5);
    }

    #[test]
    fn over_a_second_of_flood_at_most_rate_plus_burst_pass() {
        let t0 = Instant::now();
        let mut b = LogBudget::new(PER_SEC, BURST, t0);
        let passed = (0..100_000u64)
            .filter(|i| matches!(b.admit(t0 + Duration::from_micros(i * 10)), Verdict::Emit { .. }))
            .count();
        assert!(passed as u32 <= PER_SEC + BURST + 1, "{passed}");
        assert!(passed as u32 >= BURST, "{passed}");
    }

    #[tokio::test]
    async fn long_lines_are_cut_and_their_rest_skipped() {
        let mut input: Vec<u8> = b"short\r\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 100_000));
        input.extend(b"\nnext\nlast-without-newline");
        // A small buffer, so lines span many reads.
        let mut r = tokio::io::BufReader::with_capacity(64, &input[..]);
        assert_eq!(read_bounded_line(&mut r, 16).await, Some(("short".into(), false)));
        assert_eq!(read_bounded_line(&mut r, 16).await, Some(("x".repeat(16), true)));
        assert_eq!(read_bounded_line(&mut r, 16).await, Some(("next".into(), false)));
        assert_eq!(read_bounded_line(&mut r, 16).await, Some(("last-without-new".into(), true)));
        assert_eq!(read_bounded_line(&mut r, 16).await, None);
    }
}
