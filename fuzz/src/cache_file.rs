//! Prompt-cache files (`cache::file`, layout in docs/formats.md): `cache_file` on a plain
//! model's file (KV only), `cache_file_hybrid` on a hybrid model's (KV and recurrent
//! states at two positions, format 2's state section). The first byte picks what the rest
//! is:
//!
//! - 0: a whole file. Reading its header, restoring and verifying it never panic.
//! - 1: edits to a valid file (set, flip, insert, cut bytes). A file that still passes
//!   every check (header, footer, tensor checksums) holds exactly the original tokens
//!   and KV: a corrupted entry is a miss, never a wrong answer.
//! - 2: the same edits, then the header and footer checksums recomputed (a writer bug,
//!   or a file forged by someone who can write the cache directory). Whatever the header
//!   then claims, restoring reads only inside the file: no panic, no out-of-bounds, and
//!   no more recurrent state built than the file's body holds (a forged table that
//!   points many states at the same bytes must not multiply an allocation).

use std::sync::OnceLock;

use std::sync::Arc;

use corral_engine::cache::file::{self, Identity};
use corral_engine::checkpoint;
use corral_engine::kv::{KvShape, SeqCache};
use corral_engine::recurrent::{RecurrentShape, RecurrentState};
use half::f16;
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use crate::scratch;

const SHAPE: KvShape = KvShape { n_layers: 2, kv_dim: 4 };
/// More than one KV block (32 positions), so restores cross a block boundary.
const N_TOKENS: usize = 33;
const CHECKSUM_AT: usize = 248;
/// The hybrid file's recurrent state shape, and the positions it holds states at.
const RECURRENT: RecurrentShape = RecurrentShape { layers: 2, conv: 3, ssm: 8 };
const STATES_AT: [usize; 2] = [16, N_TOKENS];

fn identity(recurrent: Option<RecurrentShape>) -> Identity {
    Identity { model_fingerprint: [7; 32], tokenizer_hash: [9; 32], shape: SHAPE, recurrent }
}

struct Valid {
    id: Identity,
    bytes: Vec<u8>,
    tokens: Vec<u32>,
    kv: SeqCache,
}

/// A valid file, written once by the engine's own writer: a plain model's, or a hybrid
/// model's with a recurrent state (whose values tell its position) at each of `STATES_AT`.
fn valid(hybrid: bool) -> &'static Valid {
    static PLAIN: OnceLock<Valid> = OnceLock::new();
    static HYBRID: OnceLock<Valid> = OnceLock::new();
    (if hybrid { &HYBRID } else { &PLAIN }).get_or_init(|| {
        let id = identity(hybrid.then_some(RECURRENT));
        let tokens: Vec<u32> = (0..N_TOKENS as u32).map(|i| i * 7 + 1).collect();
        let mut kv = SeqCache::from_runs::<()>(SHAPE, N_TOKENS, |layer, which, pos0, dst| {
            for (i, x) in dst.iter_mut().enumerate() {
                *x = f16::from_f32((layer * 1000 + which * 100 + pos0) as f32 + i as f32 * 0.5);
            }
            Ok(())
        })
        .expect("fill never fails");
        if hybrid {
            let v = |n: usize, pos: usize| (0..n).map(|i| (pos * 100 + i) as f32).collect();
            let states = STATES_AT.map(|p| {
                let parts = (v(RECURRENT.layers * RECURRENT.conv, p), v(RECURRENT.layers * RECURRENT.ssm, p + 50));
                (p, Arc::new(RecurrentState::from_parts(RECURRENT, parts.0, parts.1).expect("the shape's sizes")))
            });
            assert!(kv.set_states(states.to_vec()), "states ascending, the last at the end");
        }
        let dir = std::env::temp_dir().join(format!("corral-fuzz-kv-{}-{hybrid}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let path = file::write(&dir, &id, &tokens, &kv, &mut || {}).expect("the valid file is written");
        let bytes = std::fs::read(&path).expect("the valid file reads back");
        let _ = std::fs::remove_dir_all(&dir);
        Valid { id, bytes, tokens, kv }
    })
}

/// Every K and V plane's values, and every recurrent state's position and values, as bits.
type Contents = (Vec<Vec<u16>>, Vec<(usize, Vec<u32>)>);

fn contents(kv: &SeqCache) -> Contents {
    let planes = (0..SHAPE.n_layers)
        .flat_map(|l| (0..2).map(move |w| kv.runs(l, w).flatten().map(|x| x.to_bits()).collect()))
        .collect();
    let states = kv.states().map(|(p, s)| (p, s.conv().iter().chain(s.ssm()).map(|x| x.to_bits()).collect()));
    (planes, states.collect())
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
/// the tokens and KV when every check passes. A restore gives the prefix the header's
/// states allow (all of it without states), with states only where the header has them,
/// built from no more bytes than the body holds.
fn load(bytes: &[u8], id: &Identity) -> Option<(Vec<u32>, SeqCache)> {
    scratch::with_file(bytes, |path| {
        let h = file::read_header(path, id).ok()?;
        assert!(!h.tokens.is_empty() && h.file_len == bytes.len() as u64);
        assert_eq!(h.states.is_empty(), id.recurrent.is_none(), "states exactly for a hybrid model");
        let declared = h.tensors.iter().try_fold(0u64, |sum, t| sum.checked_add(t.len));
        assert!(declared.is_some_and(|d| d <= h.body_len), "tensors of {declared:?} bytes in a body of {}", h.body_len);
        let at: Vec<usize> = h.states.iter().map(|&p| p as usize).collect();
        for (n, verify) in [(h.tokens.len(), false), (h.tokens.len() / 2, false), (usize::MAX, true)] {
            if let Ok(kv) = file::restore(path, &h, n, verify) {
                let n = n.min(h.tokens.len());
                assert_eq!(kv.len(), if at.is_empty() { n } else { checkpoint::restorable(at.iter().copied(), n) });
                assert!(
                    kv.states().all(|(p, _)| at.contains(&p) && p <= kv.len()),
                    "states of the header's, up to len"
                );
            }
        }
        file::verify(path, id).ok()?;
        let kv = file::restore(path, &h, h.tokens.len(), true).ok()?;
        Some((h.tokens, kv))
    })
}

fn run(data: &[u8], hybrid: bool) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let v = valid(hybrid);
    match mode % 3 {
        0 => {
            load(rest, &v.id);
        }
        1 => {
            let bytes = edit(v.bytes.clone(), rest);
            if let Some((tokens, kv)) = load(&bytes, &v.id) {
                assert_eq!(tokens, v.tokens, "a corrupted file was accepted with other tokens");
                assert!(contents(&kv) == contents(&v.kv), "a corrupted file was accepted with other KV or states");
            }
        }
        _ => {
            let mut bytes = edit(v.bytes.clone(), rest);
            reseal(&mut bytes);
            load(&bytes, &v.id);
        }
    }
}

/// The fuzz target `cache_file` (fuzz/targets/fuzz_targets/cache_file.rs): one input.
pub fn cache_file(data: &[u8]) {
    run(data, false);
}

/// The fuzz target `cache_file_hybrid` (fuzz/targets/fuzz_targets/cache_file_hybrid.rs):
/// one input, on the hybrid model's file.
pub fn cache_file_hybrid(data: &[u8]) {
    run(data, true);
}
