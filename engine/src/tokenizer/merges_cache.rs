//! A file cache of the ranked merge list a SentencePiece vocabulary becomes (`spm.rs`).
//!
//! Finding every two-piece split of Gemma's 262k pieces and ranking them by score is a
//! quarter of the tokenizer's construction, and the tokenizer is the longest job of an
//! engine start (a model switch). The list depends only on the pieces and their scores, so
//! it is kept as one small file per vocabulary, named by a BLAKE3 hash of exactly those,
//! under the prompt cache's directory: `<dir>/tokenizers/<hash>.merges`.
//!
//! Format (little-endian): magic `CRLMRG01`, the 32-byte key, the merge count `n`, `n`
//! pairs `(piece id u32, split byte offset u32)` in rank order, and an xxh3-64 of all that
//! came before. Anything that does not check out — size, magic, key, checksum, an id
//! outside the vocabulary, a split that is not inside the piece on a character boundary —
//! is a miss, and the list is computed again and the file rewritten. Files are written to
//! a temporary name and renamed, so a reader never sees half a file.

use std::io::Write;
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::xxh3_64;

const MAGIC: &[u8; 8] = b"CRLMRG01";
const HEADER: usize = 8 + 32 + 8;

/// The file a vocabulary's merges live in, if the directory is usable.
pub(super) fn path(dir: &Path, texts: &[String], scores: &[f32]) -> Option<(PathBuf, [u8; 32])> {
    let sub = dir.join("tokenizers");
    for d in [dir, sub.as_path()] {
        if let Err(e) = corral_net::dirs::ensure_dir(d, corral_net::dirs::Access::NoForeignWrites) {
            tracing::debug!(error = %e, "tokenizer cache directory unusable");
            return None;
        }
    }
    let key = key(texts, scores);
    let name: String = key[..16].iter().map(|b| format!("{b:02x}")).collect();
    Some((sub.join(format!("{name}.merges")), key))
}

fn key(texts: &[String], scores: &[f32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(&(texts.len() as u64).to_le_bytes());
    for t in texts {
        h.update(&(t.len() as u32).to_le_bytes());
        h.update(t.as_bytes());
    }
    for s in scores {
        h.update(&s.to_bits().to_le_bytes());
    }
    *h.finalize().as_bytes()
}

/// The ranked `(piece, split)` list stored at `path`, if it is there and checks out.
pub(super) fn load(path: &Path, key: &[u8; 32], texts: &[String]) -> Option<Vec<(u32, u32)>> {
    let bytes = std::fs::read(path).ok()?;
    let parsed = parse(&bytes, key, texts);
    if parsed.is_none() {
        tracing::warn!(file = %path.display(), "ignoring a bad tokenizer cache file");
    }
    parsed
}

fn parse(bytes: &[u8], key: &[u8; 32], texts: &[String]) -> Option<Vec<(u32, u32)>> {
    let body_len = bytes.len().checked_sub(8)?;
    if body_len < HEADER || &bytes[..8] != MAGIC || &bytes[8..40] != key {
        return None;
    }
    let n = u64::from_le_bytes(bytes[40..48].try_into().ok()?) as usize;
    if n.checked_mul(8)?.checked_add(HEADER)? != body_len {
        return None;
    }
    let stored = u64::from_le_bytes(bytes[body_len..].try_into().ok()?);
    if xxh3_64(&bytes[..body_len]) != stored {
        return None;
    }
    let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let (id, split) = (u32_at(HEADER + 8 * i), u32_at(HEADER + 8 * i + 4));
        let t = texts.get(id as usize)?;
        let s = split as usize;
        if s == 0 || s >= t.len() || !t.is_char_boundary(s) {
            return None;
        }
        out.push((id, split));
    }
    Some(out)
}

/// Write the list (best effort: a failure only means computing it again next time).
pub(super) fn store(path: &Path, key: &[u8; 32], ranked: &[(u32, u32)]) {
    let mut b = Vec::with_capacity(HEADER + 8 * ranked.len() + 8);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(key);
    b.extend_from_slice(&(ranked.len() as u64).to_le_bytes());
    for &(id, split) in ranked {
        b.extend_from_slice(&id.to_le_bytes());
        b.extend_from_slice(&split.to_le_bytes());
    }
    let sum = xxh3_64(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let written =
        std::fs::File::create(&tmp).and_then(|mut f| f.write_all(&b)).and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        tracing::debug!(file = %path.display(), error = %e, "could not write the tokenizer cache");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts() -> Vec<String> {
        ["a", "b", "ab", "▁é", "▁éa"].iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn round_trip_and_every_bad_file_is_a_miss() {
        let dir = std::env::temp_dir().join(format!("corral-merges-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (texts, scores) = (texts(), [0.0, 0.0, -1.0, -2.0, -3.0]);
        let (path, key) = path(&dir, &texts, &scores).unwrap();
        assert!(load(&path, &key, &texts).is_none(), "nothing stored yet");
        let ranked = vec![(2, 1), (4, 5)];
        store(&path, &key, &ranked);
        assert_eq!(load(&path, &key, &texts), Some(ranked.clone()));
        let good = std::fs::read(&path).unwrap();
        let other_key = super::key(&texts, &[1.0, 0.0, -1.0, -2.0, -3.0]);
        assert_ne!(other_key, key, "the key covers the scores");
        assert!(parse(&good, &other_key, &texts).is_none());
        let mut flipped = good.clone();
        flipped[HEADER + 1] ^= 1;
        assert!(parse(&flipped, &key, &texts).is_none(), "checksum");
        assert!(parse(&good[..good.len() - 3], &key, &texts).is_none(), "truncated");
        assert!(parse(&good, &key, &texts[..2]).is_none(), "an id outside the vocabulary");
        // A split inside a multi-byte character, with a valid checksum.
        let p2 = dir.join("bad.merges");
        store(&p2, &key, &[(3, 2)]);
        assert!(load(&p2, &key, &texts).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
