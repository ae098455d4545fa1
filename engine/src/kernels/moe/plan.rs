//! Which rows each expert takes, as one stacked batch: a pure function of the routes.
//!
//! A layer's rows are gathered once, grouped by expert (experts in index order, each
//! one's rows in row order), so every expert's matrices run over a contiguous slice of
//! one buffer and all of them go to the pool together (`kernels::forward_each`); `at`
//! then finds each (row, slot) output for the weighted sum in the routing order.

use std::ops::Range;

#[derive(Debug, PartialEq, Eq)]
pub(super) struct Plan {
    /// Each chosen expert and its rows' span in `order`, by expert index.
    pub(super) groups: Vec<(usize, Range<usize>)>,
    /// The stacked rows: row indices, grouped by expert.
    pub(super) order: Vec<usize>,
    /// `at[r * used + slot]`: where row `r`'s `slot`th expert's output lies in `order`.
    pub(super) at: Vec<usize>,
}

impl Plan {
    /// The plan for rows routed to `experts[r]` (each at most `used` of `0..n_experts`).
    pub(super) fn new(experts: &[Vec<usize>], n_experts: usize, used: usize) -> Self {
        let mut starts = vec![0usize; n_experts + 1];
        for &e in experts.iter().flatten() {
            starts[e + 1] += 1;
        }
        for e in 0..n_experts {
            starts[e + 1] += starts[e];
        }
        let groups =
            (0..n_experts).filter(|&e| starts[e + 1] > starts[e]).map(|e| (e, starts[e]..starts[e + 1])).collect();
        let mut next = starts;
        let mut order = vec![0usize; next[n_experts]];
        let mut at = vec![0usize; experts.len() * used];
        for (r, chosen) in experts.iter().enumerate() {
            debug_assert!(chosen.len() <= used);
            for (slot, &e) in chosen.iter().enumerate() {
                order[next[e]] = r;
                at[r * used + slot] = next[e];
                next[e] += 1;
            }
        }
        Self { groups, order, at }
    }

    /// `buf` (`[order.len()][width]`) cut into each group's rows.
    pub(super) fn split<'a>(&self, mut buf: &'a mut [f32], width: usize) -> Vec<&'a mut [f32]> {
        self.groups
            .iter()
            .map(|(_, rows)| {
                let (head, rest) = std::mem::take(&mut buf).split_at_mut(rows.len() * width);
                buf = rest;
                head
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_grouped_by_expert_in_row_order_and_found_again() {
        let routes = vec![vec![3, 0], vec![0, 2], vec![3, 2], vec![1, 3]];
        let p = Plan::new(&routes, 5, 2);
        assert_eq!(p.groups, vec![(0, 0..2), (1, 2..3), (2, 3..5), (3, 5..8)]);
        assert_eq!(p.order, vec![0, 1, 3, 1, 2, 0, 2, 3]);
        for (r, chosen) in routes.iter().enumerate() {
            for (slot, &e) in chosen.iter().enumerate() {
                let at = p.at[r * 2 + slot];
                assert_eq!(p.order[at], r);
                assert!(p.groups.iter().any(|(g, rows)| *g == e && rows.contains(&at)), "row {r} slot {slot}");
            }
        }
    }

    #[test]
    fn split_cuts_a_buffer_at_the_groups() {
        let p = Plan::new(&[vec![1], vec![1], vec![4]], 6, 1);
        let mut buf: Vec<f32> = (0..9).map(|i| i as f32).collect();
        let parts = p.split(&mut buf, 3);
        assert_eq!(parts.iter().map(|s| s.len()).collect::<Vec<_>>(), vec![6, 3]);
        assert_eq!(parts[1], &[6.0, 7.0, 8.0]);
        assert!(Plan::new(&[], 4, 2).split(&mut [], 3).is_empty());
    }
}
