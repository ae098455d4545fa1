//! Which replica a request goes to: among those that take requests and that this
//! request has not tried yet, the one with the fewest requests in flight; ties go round
//! in turn from `turn`, so equal replicas share the load. Pure.

/// A replica as the choice sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub usable: bool,
    pub in_flight: usize,
    /// This request already failed there.
    pub tried: bool,
}

/// The replica to try next, or `None` when none is left.
pub fn pick(replicas: &[Candidate], turn: usize) -> Option<usize> {
    let n = replicas.len();
    (0..n)
        .map(|k| (turn + k) % n)
        .filter(|&i| replicas[i].usable && !replicas[i].tried)
        .min_by_key(|&i| replicas[i].in_flight)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(usable: bool, in_flight: usize, tried: bool) -> Candidate {
        Candidate { usable, in_flight, tried }
    }

    #[test]
    fn fewest_in_flight_wins_and_ties_take_turns() {
        let r = [c(true, 3, false), c(true, 1, false), c(true, 2, false)];
        assert_eq!(pick(&r, 0), Some(1));
        assert_eq!(pick(&r, 2), Some(1));
        let even = [c(true, 0, false), c(true, 0, false), c(true, 0, false)];
        assert_eq!(
            (pick(&even, 0), pick(&even, 1), pick(&even, 2), pick(&even, 3)),
            (Some(0), Some(1), Some(2), Some(0))
        );
    }

    #[test]
    fn down_and_tried_replicas_are_passed_over() {
        let r = [c(false, 0, false), c(true, 5, true), c(true, 9, false)];
        assert_eq!(pick(&r, 0), Some(2));
        assert_eq!(pick(&[c(false, 0, false), c(true, 0, true)], 0), None);
        assert_eq!(pick(&[], 3), None);
    }
}
