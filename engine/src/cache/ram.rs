//! The RAM tier: a byte-capped LRU of prefix-KV entries keyed by token ids.
//!
//! A lookup finds the entry sharing the longest prefix with a prompt and hands out a
//! fork of it (block references, no copy): hits never consume an entry. Storing an
//! entry drops the ones it extends (they are its prefixes), and is skipped when an
//! existing entry already extends it.

use std::sync::Arc;
use std::time::Instant;

use crate::kv::SeqCache;

pub struct Entry {
    pub id: u64,
    pub tokens: Arc<[u32]>,
    pub kv: SeqCache,
    pub last_used: Instant,
    /// A file with exactly these tokens is on disk.
    pub durable: bool,
}

impl Entry {
    pub fn bytes(&self) -> u64 {
        self.kv.bytes() as u64
    }
}

#[derive(Default)]
pub struct RamCache {
    pub max_bytes: u64,
    entries: Vec<Entry>,
    bytes: u64,
    next_id: u64,
}

pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl RamCache {
    pub fn new(max_bytes: u64) -> Self {
        Self { max_bytes, ..Default::default() }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The longest usable prefix of `prompt` held here (at most `limit` tokens), as a
    /// fork. An entry with recurrent state is usable only whole (`SeqCache::restorable`).
    /// The entry's LRU time is refreshed.
    pub fn lookup(&mut self, prompt: &[u32], limit: usize) -> Option<(usize, SeqCache)> {
        let (i, n) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, e.kv.restorable(common_prefix(&e.tokens, prompt).min(limit))))
            .max_by_key(|&(i, n)| (n, std::cmp::Reverse(i)))?;
        if n == 0 {
            return None;
        }
        let e = &mut self.entries[i];
        e.last_used = Instant::now();
        Some((n, e.kv.fork(n)))
    }

    /// Store `tokens` (KV `kv`). Returns the entries pushed out by the byte cap (oldest
    /// first), for the caller to demote.
    pub fn insert(&mut self, tokens: Arc<[u32]>, kv: SeqCache, durable: bool) -> Vec<Entry> {
        debug_assert_eq!(kv.len(), tokens.len());
        if tokens.is_empty() || self.max_bytes == 0 {
            return Vec::new();
        }
        if let Some(e) =
            self.entries.iter_mut().find(|e| e.tokens.len() >= tokens.len() && e.tokens.starts_with(&tokens))
        {
            e.last_used = Instant::now();
            e.durable |= durable && e.tokens.len() == tokens.len();
            return Vec::new();
        }
        let before = self.entries.len();
        self.entries.retain(|e| !tokens.starts_with(&e.tokens));
        if self.entries.len() != before {
            self.recount();
        }
        self.next_id += 1;
        let e = Entry { id: self.next_id, tokens, kv, last_used: Instant::now(), durable };
        self.bytes += e.bytes();
        self.entries.push(e);
        self.evict_to(self.max_bytes)
    }

    fn recount(&mut self) {
        self.bytes = self.entries.iter().map(Entry::bytes).sum();
    }

    /// Drop least-recently-used entries until at most `cap` bytes remain (the newest
    /// entry always stays, even alone over the cap).
    fn evict_to(&mut self, cap: u64) -> Vec<Entry> {
        let mut out = Vec::new();
        while self.bytes > cap && self.entries.len() > 1 {
            let (i, _) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.last_used).expect("non-empty");
            let e = self.entries.remove(i);
            self.bytes -= e.bytes();
            out.push(e);
        }
        out
    }

    /// Remove and return the entries unused since `before`.
    pub fn take_idle(&mut self, before: Instant) -> Vec<Entry> {
        let (idle, keep): (Vec<Entry>, Vec<Entry>) =
            std::mem::take(&mut self.entries).into_iter().partition(|e| e.last_used < before);
        self.entries = keep;
        self.recount();
        idle
    }

    /// Entries not yet on disk, most recently used first: `(id, tokens, kv)` snapshots.
    pub fn not_durable(&self) -> Vec<(u64, Arc<[u32]>, SeqCache)> {
        let mut v: Vec<&Entry> = self.entries.iter().filter(|e| !e.durable).collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.last_used));
        v.into_iter().map(|e| (e.id, e.tokens.clone(), e.kv.clone())).collect()
    }

    /// Whether any entry is not yet on disk (what the write-behind would write).
    pub fn any_not_durable(&self) -> bool {
        self.entries.iter().any(|e| !e.durable)
    }

    /// The least recent use of any entry (when idle demotion is next due).
    pub fn oldest_use(&self) -> Option<Instant> {
        self.entries.iter().map(|e| e.last_used).min()
    }

    pub fn mark_durable(&mut self, id: u64) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.id == id) {
            e.durable = true;
        }
    }

    pub fn clear(&mut self) -> Vec<Entry> {
        self.bytes = 0;
        std::mem::take(&mut self.entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{BLOCK_TOKENS, KvShape};

    const SHAPE: KvShape = KvShape { n_layers: 1, kv_dim: 2 };

    fn kv(n: usize) -> SeqCache {
        SeqCache::from_runs::<()>(SHAPE, n, |_, _, _, dst| {
            dst.fill(half::f16::ONE);
            Ok(())
        })
        .unwrap()
    }

    fn toks(v: &[u32]) -> Arc<[u32]> {
        v.into()
    }

    #[test]
    fn longest_prefix_wins_and_hits_do_not_consume() {
        let mut c = RamCache::new(u64::MAX);
        c.insert(toks(&[1, 2, 3, 4]), kv(4), false);
        c.insert(toks(&[1, 2, 9]), kv(3), false);
        let (n, fork) = c.lookup(&[1, 2, 3, 4, 5], 4).unwrap();
        assert_eq!((n, fork.len()), (4, 4));
        assert_eq!(c.lookup(&[1, 2, 3, 4, 5], 4).unwrap().0, 4, "still there");
        assert_eq!(c.lookup(&[1, 2, 3, 4], 3).unwrap().0, 3, "one prompt token is always left to compute");
        assert_eq!(c.lookup(&[1, 2, 9, 9], 3).unwrap().0, 3);
        assert!(c.lookup(&[7, 7], 1).is_none());
    }

    /// An entry with recurrent state serves only a prompt that extends all of it.
    #[test]
    fn recurrent_entries_restore_only_whole() {
        let shape = crate::recurrent::RecurrentShape { layers: 1, conv: 2, ssm: 4 };
        let mut whole = SeqCache::new(SHAPE);
        whole.recurrent_mut(shape).expect("fresh state");
        whole.reserve(4);
        whole.commit(4);
        let mut c = RamCache::new(u64::MAX);
        c.insert(toks(&[1, 2, 3, 4]), whole, false);
        let (n, fork) = c.lookup(&[1, 2, 3, 4, 5], 4).expect("the whole entry");
        assert_eq!((n, fork.len(), fork.has_recurrent()), (4, 4, true));
        assert!(c.lookup(&[1, 2, 3, 9], 3).is_none(), "a shorter prefix cannot be cut from the state");
        assert!(c.lookup(&[1, 2, 3, 4], 3).is_none(), "nor the prompt itself less its last token");
        c.insert(toks(&[1, 2, 7]), kv(3), false);
        assert_eq!(c.lookup(&[1, 2, 3, 9], 3).map(|(n, _)| n), Some(2), "a plain entry still forks");
    }

    /// With a checkpoint, a shorter shared prefix restores the checkpoint's position, and
    /// the longest usable prefix (not the longest shared one) picks the entry.
    #[test]
    fn recurrent_entries_restore_their_newest_checkpoint_within_the_prefix() {
        let shape = crate::recurrent::RecurrentShape { layers: 1, conv: 2, ssm: 4 };
        let mut hybrid = SeqCache::new(SHAPE);
        hybrid.recurrent_mut(shape).expect("fresh state");
        hybrid.reserve(3);
        hybrid.commit(3);
        hybrid.checkpoint();
        hybrid.recurrent_mut(shape).expect("own state");
        hybrid.reserve(3);
        hybrid.commit(3);
        let mut c = RamCache::new(u64::MAX);
        c.insert(toks(&[1, 2, 3, 4, 5, 6]), hybrid, false);
        let (n, fork) = c.lookup(&[1, 2, 3, 4, 9], 4).expect("the checkpoint");
        assert_eq!((n, fork.len(), fork.has_recurrent()), (3, 3, true));
        assert!(c.lookup(&[1, 2, 9], 2).is_none(), "below the checkpoint");
        c.insert(toks(&[1, 2, 3, 7]), kv(4), false);
        assert_eq!(c.lookup(&[1, 2, 3, 4, 9], 4).map(|(n, _)| n), Some(3), "a tie: the older entry");
        assert_eq!(c.lookup(&[1, 2, 3, 7, 9], 4).map(|(n, _)| n), Some(4), "the plain entry shares more");
    }

    #[test]
    fn an_extension_supersedes_its_prefixes() {
        let mut c = RamCache::new(u64::MAX);
        c.insert(toks(&[1, 2]), kv(2), false);
        c.insert(toks(&[1, 2, 3]), kv(3), false);
        assert_eq!(c.len(), 1);
        c.insert(toks(&[1, 2]), kv(2), false);
        assert_eq!(c.len(), 1, "a prefix of an existing entry adds nothing");
        c.insert(toks(&[1, 5]), kv(2), false);
        assert_eq!(c.len(), 2, "a sibling is its own entry");
    }

    #[test]
    fn byte_cap_evicts_least_recently_used() {
        let block = kv(1).bytes() as u64;
        let mut c = RamCache::new(2 * block);
        c.insert(toks(&[1]), kv(1), false);
        c.insert(toks(&[2]), kv(1), false);
        c.lookup(&[1, 0], 1);
        let out = c.insert(toks(&[3]), kv(1), false);
        assert_eq!(out.len(), 1);
        assert_eq!(&*out[0].tokens, &[2]);
        assert_eq!(c.bytes(), 2 * block);
        let big: Vec<u32> = (0..3 * BLOCK_TOKENS as u32).collect();
        let out = c.insert(big.clone().into(), kv(big.len()), false);
        assert_eq!(out.len(), 2);
        assert_eq!(c.len(), 1, "the newest entry stays even alone over the cap");
    }

    #[test]
    fn durability_and_idle() {
        let mut c = RamCache::new(u64::MAX);
        c.insert(toks(&[1]), kv(1), false);
        c.insert(toks(&[2]), kv(1), true);
        let todo = c.not_durable();
        assert_eq!(todo.len(), 1);
        assert!(c.any_not_durable());
        c.mark_durable(todo[0].0);
        assert!(c.not_durable().is_empty() && !c.any_not_durable());
        assert!(c.oldest_use().is_some());
        let idle = c.take_idle(Instant::now() + std::time::Duration::from_secs(1));
        assert_eq!(idle.len(), 2);
        assert!(c.is_empty() && c.bytes() == 0);
    }
}
