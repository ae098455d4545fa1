//! Prompt-cache files (`cache::file`, layout in docs/formats.md). The first byte picks
//! what the rest is:
//!
//! - 0: a whole file. Reading its header, restoring and verifying it never panic.
//! - 1: edits to a valid file (set, flip, insert, cut bytes). A file that still passes
//!   every check (header, footer, tensor checksums) holds exactly the original tokens
//!   and KV: a corrupted entry is a miss, never a wrong answer.
//! - 2: the same edits, then the header and footer checksums recomputed (a writer bug,
//!   or a file forged by someone who can write the cache directory). Whatever the header
//!   then claims, restoring reads only inside the file: no panic, no out-of-bounds.

use std::sync::OnceLock;

use corral_engine::cache::file::{self, Identity};
use corral_engine::kv::{KvShape, SeqCache};
use half::f16;
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use crate::scratch;

const SHAPE: KvShape = KvShape { n_layers: 2, kv_dim: 4 };
/// More than one KV block (32 positions), so restores cross a block boundary.
const N_TOKENS: usize = 33;
const CHECKSUM_AT: usize = 248;

fn identity() -> Identity {
    Identity { model_fingerprint: [7; 32], tokenizer_hash: [9; 32], shape: SHAPE, recurrent: None }
}

struct Valid {
    bytes: Vec<u8>,
    tokens: Vec<u32>,
    kv: SeqCache,
}

/// A valid file, written once by the engine's own writer.
fn valid() -> &'static Valid {
    static V: OnceLock<Valid> = OnceLock::new();
    V.get_or_init(|| {
        let tokens: Vec<u32> = (0..N_TOKENS as u32).map(|i| i * 7 + 1).collect();
        let kv = SeqCache::from_runs::<()>(SHAPE, N_TOKENS, |layer, which, pos0, dst| {
            for (i, x) in dst.iter_mut().enumerate() {
                *x = f16::from_f32((layer * 1000 + which * 100 + pos0) as f32 + i as f32 * 0.5);
            }
            Ok(())
        })
        .expect("fill never fails");
        let dir = std::env::temp_dir().join(format!("corral-fuzz-kv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let path = file::write(&dir, &identity(), &tokens, &kv, &mut || {}).expect("the valid file is written");
        let bytes = std::fs::read(&path).expect("the valid file reads back");
        let _ = std::fs::remove_dir_all(&dir);
        Valid { bytes, tokens, kv }
    })
}

/// Every K and V value, as bits.
fn planes(kv: &SeqCache) -> Vec<Vec<u16>> {
    (0..SHAPE.n_layers)
        .flat_map(|l| (0..2).map(move |w| kv.runs(l, w).flatten().map(|x| x.to_bits()).collect()))
        .collect()
}

/// Apply 4-byte edits `[op, pos_lo, pos_hi, value]`.
fn edit(mut bytes: Vec<u8>, ops: &[u8]) -> Vec<u8> {
    for op in ops.chunks_exact(4) {
        let pos = u16::from_le_bytes([op[1], op[2]]) as usize % (bytes.len() + 1);
        let at = pos.min(bytes.len().saturating_sub(1));
        match op[0] % 4 {
            0 if !bytes.is_empty() => bytes[at] ^= op[3].max(1),
            1 if !bytes.is_empty() => bytes[at] = op[3],
            2 => bytes.truncate(pos),
            3 => bytes.insert(pos, op[3]),
            _ => {}
        }
    }
    bytes
}

fn le_u32(b: &[u8], at: usize) -> Option<usize> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?) as usize)
}

/// Recompute the prefix key, the header checksum and the footer from what the header
/// says (as far as the bytes reach).
fn reseal(b: &mut [u8]) {
    let (Some(hlen), Some(n_tokens), Some(n_tensors)) = (le_u32(b, 12), le_u32(b, 112), le_u32(b, 132)) else {
        return;
    };
    let table = 256 + 4 * n_tokens;
    if let Some(tokens) = b.get(256..table) {
        let key = *blake3::hash(tokens).as_bytes();
        b[80..112].copy_from_slice(&key);
    }
    let mut body = Xxh3::new();
    for i in 0..n_tensors.min(8192) {
        match b.get(table + 40 * i + 32..table + 40 * i + 40) {
            Some(sum) => body.update(sum),
            None => break,
        }
    }
    let Some(header) = b.get_mut(..hlen) else { return };
    if header.len() < 256 {
        return;
    }
    header[CHECKSUM_AT..CHECKSUM_AT + 8].fill(0);
    let sum = xxh3_64(header).to_le_bytes();
    header[CHECKSUM_AT..CHECKSUM_AT + 8].copy_from_slice(&sum);
    if b.len() >= hlen + 24 {
        let foot = b.len() - 24;
        b[foot..foot + 8].copy_from_slice(b"KVCORRAL");
        b[foot + 8..foot + 16].copy_from_slice(&body.digest().to_le_bytes());
        b[foot + 16..].copy_from_slice(&sum);
    }
}

/// Read, restore (all of it and a prefix, unverified and verified) and verify `bytes`;
/// the tokens and KV when every check passes.
fn load(bytes: &[u8]) -> Option<(Vec<u32>, SeqCache)> {
    scratch::with_file(bytes, |path| {
        let h = file::read_header(path, &identity()).ok()?;
        assert!(!h.tokens.is_empty() && h.file_len == bytes.len() as u64);
        for (n, verify) in [(h.tokens.len(), false), (h.tokens.len() / 2, false), (usize::MAX, true)] {
            if let Ok(kv) = file::restore(path, &h, n, verify) {
                assert_eq!(kv.len(), n.min(h.tokens.len()));
            }
        }
        file::verify(path, &identity()).ok()?;
        let kv = file::restore(path, &h, h.tokens.len(), true).ok()?;
        Some((h.tokens, kv))
    })
}

/// The fuzz target `cache_file` (fuzz/targets/fuzz_targets/cache_file.rs): one input.
pub fn cache_file(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let v = valid();
    match mode % 3 {
        0 => {
            load(rest);
        }
        1 => {
            let bytes = edit(v.bytes.clone(), rest);
            if let Some((tokens, kv)) = load(&bytes) {
                assert_eq!(tokens, v.tokens, "a corrupted file was accepted with other tokens");
                assert_eq!(planes(&kv), planes(&v.kv), "a corrupted file was accepted with other KV");
            }
        }
        _ => {
            let mut bytes = edit(v.bytes.clone(), rest);
            reseal(&mut bytes);
            load(&bytes);
        }
    }
}
