//! A fixed-bucket histogram as plain data: what an engine reports for its request
//! timings in `/admin/stats` and what the pool keeps for model switches, for the gateway
//! to expose on `/metrics`. The bounds belong to whoever observes; the renderer takes
//! them as they come, so a histogram that crossed a process boundary is checked with
//! `is_consistent` before it is shown.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Histogram {
    /// Upper bounds of the buckets, ascending and finite; a last bucket to +Inf follows.
    pub bounds: Vec<f64>,
    /// Observations per bucket, not cumulative: one per bound, then the +Inf bucket.
    pub counts: Vec<u64>,
    /// Sum of every observed value.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending, finite).
    pub fn new(bounds: &[f64]) -> Self {
        Self { bounds: bounds.to_vec(), counts: vec![0; bounds.len() + 1], sum: 0.0, count: 0 }
    }

    /// Count `v` in the first bucket whose upper bound is at least `v` (bounds are
    /// inclusive, as Prometheus' `le`). A value that is not a number is not counted.
    pub fn observe(&mut self, v: f64) {
        if v.is_nan() || self.counts.len() != self.bounds.len() + 1 {
            return;
        }
        let i = self.bounds.partition_point(|b| *b < v);
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }

    /// Whether the shape holds: a count per bucket, ascending finite bounds, and counts
    /// that add up to `count`.
    pub fn is_consistent(&self) -> bool {
        self.counts.len() == self.bounds.len() + 1
            && self.bounds.iter().all(|b| b.is_finite())
            && self.bounds.windows(2).all(|w| w[0] < w[1])
            && self.counts.iter().try_fold(0u64, |a, c| a.checked_add(*c)) == Some(self.count)
    }

    /// `(upper bound, observations in that bucket)` for the finite buckets; the +Inf
    /// bucket is `count` minus their sum.
    pub fn buckets(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        self.bounds.iter().copied().zip(self.counts.iter().copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_land_in_the_first_bucket_that_holds_them() {
        let mut h = Histogram::new(&[0.1, 1.0, 10.0]);
        for v in [0.05, 0.1, 0.5, 1.0, 9.0, 50.0, f64::NAN] {
            h.observe(v);
        }
        assert_eq!(h.counts, vec![2, 2, 1, 1], "bounds are inclusive; NaN is not counted");
        assert_eq!(h.count, 6);
        assert!((h.sum - 60.65).abs() < 1e-9);
        assert_eq!(h.buckets().collect::<Vec<_>>(), vec![(0.1, 2), (1.0, 2), (10.0, 1)]);
        assert!(h.is_consistent());
    }

    #[test]
    fn a_histogram_from_elsewhere_is_checked_before_use() {
        let ok: Histogram = serde_json::from_str(r#"{"bounds":[1],"counts":[1,2],"sum":9,"count":3}"#).unwrap();
        assert!(ok.is_consistent());
        for bad in [
            r#"{"bounds":[1],"counts":[1],"sum":0,"count":1}"#,
            r#"{"bounds":[2,1],"counts":[0,0,0],"sum":0,"count":0}"#,
            r#"{"bounds":[1],"counts":[1,1],"sum":0,"count":3}"#,
            r#"{"bounds":[1],"counts":[18446744073709551615,1],"sum":0,"count":0}"#,
        ] {
            let h: Histogram = serde_json::from_str(bad).unwrap();
            assert!(!h.is_consistent(), "{bad}");
        }
        // An absent histogram (an older engine) is empty, and consistent only once shaped.
        let mut empty = Histogram::default();
        empty.observe(1.0);
        assert_eq!(empty.count, 0, "no buckets, nothing counted");
    }
}
