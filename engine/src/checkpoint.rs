//! Where a hybrid model's sequence keeps snapshots (checkpoints) of its recurrent state,
//! and which one a shorter prefix restores: pure decisions over token positions. The
//! states themselves live in `SeqCache` (`kv.rs`); `Sequence` takes the snapshots while it
//! prefills; the SSD tier stores them with the KV (`cache::file`).
//!
//! A recurrent state exists only after exactly the positions it has read, so a prompt
//! that shares `n` tokens with a cached sequence resumes from the newest state at a
//! position `<= n` (its KV cut back to that position) and computes the rest. Snapshots:
//! - every `EVERY` positions of a prompt (prefill chunks end there), so a shared prefix
//!   loses fewer than `EVERY` positions;
//! - `TAIL` positions before the end of a prompt of `TAIL_MIN_PROMPT` or more: the next
//!   turn of a conversation usually shares the whole prompt but its last few tokens (a
//!   generation prompt such as `<think>\n` that history renders otherwise) and a
//!   completion that may re-tokenize differently;
//! - at the end of each request: the state after the prompt and completion stays with the
//!   cached sequence (it is the sequence's own state, not a copy).
//!
//! Off-grid snapshots (tails) are kept only above the highest grid one, so a long
//! conversation holds about one state per `EVERY` positions plus its last turns' tails.

/// Grid of snapshot positions while a prompt is read.
pub const EVERY: usize = 2048;
/// How far before a prompt's end the tail snapshot is taken.
pub const TAIL: usize = 16;
/// Shorter prompts get no tail snapshot: they cost little to recompute, and the snapshot
/// costs them an extra forward pass.
pub const TAIL_MIN_PROMPT: usize = 256;

fn tail(prompt_len: usize) -> Option<usize> {
    (prompt_len >= TAIL_MIN_PROMPT).then(|| prompt_len - TAIL)
}

/// Where a prefill chunk of at most `chunk` tokens from position `fed` ends for a prompt
/// of `prompt_len`: never past the next snapshot position, so the state there is seen.
pub fn chunk_end(fed: usize, chunk: usize, prompt_len: usize) -> usize {
    let grid = (fed / EVERY + 1) * EVERY;
    let end = (fed + chunk.max(1)).min(grid).min(prompt_len);
    match tail(prompt_len) {
        Some(t) if t > fed => end.min(t),
        _ => end,
    }
}

/// Whether the state after `len` positions of a prompt of `prompt_len` is snapshot.
pub fn snapshot_due(len: usize, prompt_len: usize) -> bool {
    len > 0 && len <= prompt_len && (len.is_multiple_of(EVERY) || tail(prompt_len) == Some(len))
}

/// How many snapshots reading a prompt of `prompt_len` takes (at most: a prompt resumed
/// from a checkpoint skips those below it): its grid positions and its tail. With the
/// sequence's own state, what memory admission reserves for a hybrid model's row.
pub fn snapshots(prompt_len: usize) -> usize {
    prompt_len / EVERY + tail(prompt_len).is_some_and(|t| !t.is_multiple_of(EVERY)) as usize
}

/// The longest prefix of at most `n` positions that can be restored from states at
/// positions `at` (ascending): the newest at or below `n`, else nothing.
pub fn restorable(at: impl IntoIterator<Item = usize>, n: usize) -> usize {
    at.into_iter().take_while(|&p| p <= n).last().unwrap_or(0)
}

/// Drop the snapshots not worth keeping from `list` (ascending positions): every grid
/// position stays, off-grid ones only above the highest grid position.
pub fn thin<T>(list: &mut Vec<(usize, T)>) {
    let top = list.iter().map(|c| c.0).filter(|p| p.is_multiple_of(EVERY)).max().unwrap_or(0);
    list.retain(|c| c.0.is_multiple_of(EVERY) || c.0 > top);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chunks a prompt of `len` is read in from `fed`, with `chunk`-token passes.
    fn chunks(mut fed: usize, chunk: usize, len: usize) -> Vec<usize> {
        let mut ends = Vec::new();
        while fed < len {
            fed = chunk_end(fed, chunk, len);
            ends.push(fed);
        }
        ends
    }

    #[test]
    fn chunks_stop_at_the_grid_and_the_tail() {
        // From zero in 512s: the grid falls on chunk ends anyway; the tail adds one stop.
        let ends = chunks(0, 512, 5000);
        assert_eq!(ends, vec![512, 1024, 1536, 2048, 2560, 3072, 3584, 4096, 4608, 4984, 5000]);
        // From a restored position off the grid: cut at the next grid point.
        assert_eq!(chunks(2100, 512, 4200), vec![2612, 3124, 3636, 4096, 4184, 4200]);
        // A short prompt reads in one pass; zero-token chunks still advance.
        assert_eq!(chunks(0, 512, 200), vec![200]);
        assert_eq!(chunks(0, 0, 3), vec![1, 2, 3]);
        // Past the tail already: only the grid.
        assert_eq!(chunks(4990, 512, 5000), vec![5000]);
    }

    #[test]
    fn snapshots_at_grid_points_and_the_tail_only() {
        let due: Vec<usize> = chunks(0, 512, 5000).into_iter().filter(|&e| snapshot_due(e, 5000)).collect();
        assert_eq!(due, vec![2048, 4096, 4984]);
        assert!(snapshot_due(4096, 4096), "a grid point at the prompt's end");
        assert!(!snapshot_due(184, 200), "no tail for a short prompt");
        assert!(!snapshot_due(0, 5000));
        assert!(snapshot_due(TAIL_MIN_PROMPT - TAIL, TAIL_MIN_PROMPT));
    }

    #[test]
    fn the_snapshot_count_is_what_reading_the_prompt_takes() {
        for len in [1, 255, 256, 2047, 2048, 2064, 2065, 4096, 5000, 8200] {
            let due = chunks(0, 512, len).into_iter().filter(|&e| snapshot_due(e, len)).count();
            assert_eq!(snapshots(len), due, "a prompt of {len}");
        }
        assert_eq!(
            (snapshots(255), snapshots(5000), snapshots(2064)),
            (0, 3, 1),
            "none; 2048, 4096, tail; on the grid"
        );
    }

    #[test]
    fn the_newest_state_at_or_below_the_prefix_is_restored() {
        let at = [2048, 4096, 4984, 5020];
        assert_eq!(restorable(at, 5020), 5020, "the whole sequence");
        assert_eq!(restorable(at, 5019), 4984);
        assert_eq!(restorable(at, 4983), 4096);
        assert_eq!(restorable(at, 4096), 4096);
        assert_eq!(restorable(at, 2047), 0, "below every state: nothing");
        assert_eq!(restorable([], 100), 0);
    }

    #[test]
    fn thinning_keeps_the_grid_and_the_tails_above_it() {
        let mut list: Vec<(usize, ())> = [1000, 2048, 3000, 4096, 4500, 4900].map(|p| (p, ())).to_vec();
        thin(&mut list);
        assert_eq!(list.iter().map(|c| c.0).collect::<Vec<_>>(), vec![2048, 4096, 4500, 4900]);
        let mut tails: Vec<(usize, ())> = vec![(300, ()), (900, ())];
        thin(&mut tails);
        assert_eq!(tails.len(), 2, "no grid point yet: every tail stays");
    }
}
