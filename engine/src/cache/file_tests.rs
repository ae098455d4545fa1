use std::sync::Arc;

use super::*;
use crate::kv::BLOCK_TOKENS;
use crate::recurrent::{RecurrentShape, RecurrentState};

const SHAPE: KvShape = KvShape { n_layers: 3, kv_dim: 8 };

fn identity() -> Identity {
    Identity { model_fingerprint: [7; 32], tokenizer_hash: [9; 32], shape: SHAPE, recurrent: None }
}

fn kv(n: usize) -> SeqCache {
    SeqCache::from_runs::<()>(SHAPE, n, |layer, which, pos0, dst| {
        for (i, x) in dst.iter_mut().enumerate() {
            *x = f16::from_f32((layer * 1000 + which * 100 + pos0) as f32 + i as f32 * 0.5);
        }
        Ok(())
    })
    .unwrap()
}

fn same(a: &SeqCache, b: &SeqCache, n: usize) -> bool {
    (0..SHAPE.n_layers).all(|l| {
        (0..2).all(|w| {
            let x: Vec<f16> = a.runs(l, w).flatten().copied().take(n * SHAPE.kv_dim).collect();
            let y: Vec<f16> = b.runs(l, w).flatten().copied().take(n * SHAPE.kv_dim).collect();
            x == y
        })
    })
}

struct Dir(PathBuf);
impl Dir {
    fn new(tag: &str) -> Self {
        let p =
            std::env::temp_dir().join(format!("corral-kvfile-{tag}-{}-{}", std::process::id(), rand::random::<u32>()));
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn written(dir: &Dir, n: usize) -> (PathBuf, Vec<u32>, SeqCache) {
    let tokens: Vec<u32> = (0..n as u32).map(|i| i * 7 + 1).collect();
    let kv = kv(n);
    let path = write(&dir.0, &identity(), &tokens, &kv, &mut || {}).unwrap();
    (path, tokens, kv)
}

#[test]
fn round_trip_whole_and_prefix() {
    let dir = Dir::new("rt");
    let (path, tokens, kv) = written(&dir, 2 * BLOCK_TOKENS + 5);
    assert_eq!(path.file_name().unwrap().to_str().unwrap(), file_name(&tokens));
    let h = read_header(&path, &identity()).unwrap();
    assert_eq!(h.tokens, tokens);
    assert_eq!(h.body_offset % BODY_ALIGN, 0);
    let back = restore(&path, &h, tokens.len(), true).unwrap();
    assert_eq!(back.len(), tokens.len());
    assert!(same(&back, &kv, tokens.len()));
    let part = restore(&path, &h, 40, false).unwrap();
    assert_eq!(part.len(), 40);
    assert!(same(&part, &kv, 40));
    verify(&path, &identity()).unwrap();
    let leftovers: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
        .collect();
    assert!(leftovers.is_empty());
}

fn rejects(path: &Path) -> Reject {
    verify(path, &identity()).expect_err("a damaged file must be rejected")
}

#[test]
fn every_truncation_is_rejected() {
    let dir = Dir::new("trunc");
    let (path, ..) = written(&dir, 40);
    let bytes = std::fs::read(&path).unwrap();
    let copy = dir.0.join("t.kv");
    for len in (0..bytes.len()).step_by(97).chain([bytes.len() - 1, bytes.len() - FOOTER, 8, 9, FIXED_HEADER]) {
        std::fs::write(&copy, &bytes[..len]).unwrap();
        rejects(&copy);
    }
    let mut longer = bytes.clone();
    longer.extend_from_slice(&[0; 100]);
    std::fs::write(&copy, &longer).unwrap();
    assert!(matches!(rejects(&copy), Reject::Size { .. }));
}

#[test]
fn every_bit_flip_is_detected() {
    let dir = Dir::new("flip");
    let (path, ..) = written(&dir, 40);
    every_bit_flip_is_detected_in(&dir, &path, &identity());
    let (path, ..) = written_hybrid(&dir, &[16, 40]);
    every_bit_flip_is_detected_in(&dir, &path, &hybrid_identity());
}

fn every_bit_flip_is_detected_in(dir: &Dir, path: &Path, id: &Identity) {
    let bytes = std::fs::read(path).unwrap();
    let copy = dir.0.join("f.kv");
    let h = read_header(path, id).unwrap();
    // Every byte of the header region, then a spread over padding, body and footer.
    let header_len = FIXED_HEADER + 40 * 4 + h.tensors.len() * TENSOR_ENTRY;
    let body_step = (bytes.len() / 300).max(1);
    let positions =
        (0..header_len).chain((header_len..bytes.len()).step_by(body_step)).chain(bytes.len() - FOOTER..bytes.len());
    for pos in positions {
        let padding = pos >= header_len && (pos as u64) < h.body_offset;
        if padding {
            continue; // padding is not covered (it carries nothing)
        }
        let mut b = bytes.clone();
        b[pos] ^= 1 << (pos % 8);
        std::fs::write(&copy, &b).unwrap();
        verify(&copy, id).expect_err("a damaged file must be rejected");
    }
}

#[test]
fn zero_filled_and_empty_files_are_rejected() {
    let dir = Dir::new("zero");
    let (path, ..) = written(&dir, 33);
    let len = std::fs::metadata(&path).unwrap().len() as usize;
    let copy = dir.0.join("z.kv");
    std::fs::write(&copy, vec![0u8; len]).unwrap();
    assert!(matches!(rejects(&copy), Reject::Magic));
    std::fs::write(&copy, b"").unwrap();
    assert!(matches!(rejects(&copy), Reject::Magic));
    // A 4 KiB block of zeros inside the body.
    let mut b = std::fs::read(&path).unwrap();
    let h = read_header(&path, &identity()).unwrap();
    let at = h.body_offset as usize + 100;
    b[at..(at + 4096).min(len - FOOTER)].fill(0);
    std::fs::write(&copy, &b).unwrap();
    assert!(matches!(rejects(&copy), Reject::TensorChecksum(_)));
}

#[test]
fn another_model_tokenizer_shape_or_version_is_rejected() {
    let dir = Dir::new("ident");
    let (path, ..) = written(&dir, 10);
    let mut other = identity();
    other.model_fingerprint[0] ^= 1;
    assert!(matches!(read_header(&path, &other), Err(Reject::OtherModel)));
    let mut other = identity();
    other.tokenizer_hash[31] ^= 1;
    assert!(matches!(read_header(&path, &other), Err(Reject::OtherTokenizer)));
    let mut other = identity();
    other.shape.kv_dim = 16;
    assert!(matches!(read_header(&path, &other), Err(Reject::Shape)));
    // The version is checked before the checksum, so only the version field matters.
    for (v, newer) in [(FORMAT_VERSION + 1, true), (0, false)] {
        let mut b = std::fs::read(&path).unwrap();
        b[8..10].copy_from_slice(&v.to_le_bytes());
        let copy = dir.0.join(format!("v{v}.kv"));
        std::fs::write(&copy, &b).unwrap();
        let e = read_header(&copy, &identity()).unwrap_err();
        assert_eq!(matches!(e, Reject::Newer(_)), newer, "{e}");
        assert_eq!(e.is_garbage(), !newer, "newer files are left for a newer corral");
    }
}

const RECURRENT: RecurrentShape = RecurrentShape { layers: 2, conv: 3, ssm: 5 };

fn hybrid_identity() -> Identity {
    Identity { recurrent: Some(RECURRENT), ..identity() }
}

/// A recurrent state whose values tell its position.
fn state(pos: usize) -> RecurrentState {
    let v = |n: usize, k: f32| (0..n).map(|i| pos as f32 * k + i as f32).collect();
    RecurrentState::from_parts(RECURRENT, v(6, 1.0), v(10, -0.5)).unwrap()
}

/// A hybrid entry of `at.last()` tokens with states at positions `at`.
fn written_hybrid(dir: &Dir, at: &[usize]) -> (PathBuf, Vec<u32>, SeqCache) {
    let n = *at.last().unwrap();
    let tokens: Vec<u32> = (0..n as u32).map(|i| i * 5 + 2).collect();
    let mut kv = kv(n);
    assert!(kv.set_states(at.iter().map(|&p| (p, Arc::new(state(p)))).collect()));
    let path = write(&dir.0, &hybrid_identity(), &tokens, &kv, &mut || {}).unwrap();
    (path, tokens, kv)
}

#[test]
fn recurrent_states_round_trip_and_a_prefix_restores_the_newest_within_it() {
    let dir = Dir::new("hybrid");
    let (path, tokens, kv) = written_hybrid(&dir, &[16, 40, 70]);
    let h = read_header(&path, &hybrid_identity()).unwrap();
    assert_eq!((h.states.clone(), h.tensors.len()), (vec![16, 40, 70], 6 + 6));
    for (n, want, states) in
        [(70, 70, vec![16, 40, 70]), (69, 40, vec![16, 40]), (40, 40, vec![16, 40]), (15, 0, vec![])]
    {
        let back = restore(&path, &h, n, true).unwrap();
        assert_eq!(back.len(), want, "restore({n})");
        assert!(same(&back, &kv, want));
        let got: Vec<(usize, RecurrentState)> = back.states().map(|(p, r)| (p, r.clone())).collect();
        let expected: Vec<(usize, RecurrentState)> = states.iter().map(|&p| (p, state(p))).collect();
        assert_eq!(got, expected, "restore({n})");
    }
    assert_eq!(tokens.len(), 70);
}

#[test]
fn a_corrupted_recurrent_section_is_rejected() {
    let dir = Dir::new("hybrid-bad");
    let (path, ..) = written_hybrid(&dir, &[16, 40]);
    let h = read_header(&path, &hybrid_identity()).unwrap();
    let copy = dir.0.join("r.kv");
    // One bit of each state tensor (convolution and delta rule, both states).
    for (i, t) in h.tensors.iter().enumerate().skip(6) {
        let mut b = std::fs::read(&path).unwrap();
        b[(h.body_offset + t.offset + t.len - 1) as usize] ^= 0x10;
        std::fs::write(&copy, &b).unwrap();
        let e = verify(&copy, &hybrid_identity()).unwrap_err();
        assert!(matches!(e, Reject::TensorChecksum(j) if j == i), "{e}");
        let h2 = read_header(&copy, &hybrid_identity()).unwrap();
        assert!(restore(&copy, &h2, 40, true).is_err(), "a verified restore refuses it");
    }
}

#[test]
fn recurrent_shapes_must_match() {
    let dir = Dir::new("hybrid-shape");
    let (hybrid, ..) = written_hybrid(&dir, &[40]);
    let (plain, ..) = written(&dir, 40);
    let other = Identity { recurrent: Some(RecurrentShape { ssm: 6, ..RECURRENT }), ..identity() };
    assert!(matches!(read_header(&hybrid, &other), Err(Reject::Shape)));
    assert!(matches!(read_header(&hybrid, &identity()), Err(Reject::Shape)), "states a plain model has no place for");
    assert!(matches!(read_header(&plain, &hybrid_identity()), Err(Reject::Shape)), "KV without the states");
    // A hybrid model's entry is written only with its states, of its shape.
    let tokens: Vec<u32> = (0..8).collect();
    assert!(write(&dir.0, &hybrid_identity(), &tokens, &kv(8), &mut || {}).is_err());
    let mut wrong = kv(8);
    wrong.set_states(vec![(8, Arc::new(RecurrentState::new(RecurrentShape { layers: 1, ..RECURRENT })))]);
    assert!(write(&dir.0, &hybrid_identity(), &tokens, &wrong, &mut || {}).is_err());
    let left: Vec<_> = std::fs::read_dir(&dir.0).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(left.len(), 2, "nothing half-written: {left:?}");
}

/// A table that points a state at another state's bytes (its checksums recomputed, as a
/// forger would) is refused: otherwise a few bytes could become many states in memory.
#[test]
fn tensors_that_share_bytes_are_refused() {
    let dir = Dir::new("hybrid-alias");
    let (path, ..) = written_hybrid(&dir, &[16, 40]);
    let h = read_header(&path, &hybrid_identity()).unwrap();
    let mut b = std::fs::read(&path).unwrap();
    // The second state's convolution tensor (entry 8) at the first one's offset.
    let at = FIXED_HEADER + 4 * h.tokens.len() + 8 * TENSOR_ENTRY + 8;
    b[at..at + 8].copy_from_slice(&h.tensors[6].offset.to_le_bytes());
    let hlen = header_len(h.tokens.len(), h.tensors.len());
    b[CHECKSUM_AT..CHECKSUM_AT + 8].fill(0);
    let sum = xxh3_64(&b[..hlen]).to_le_bytes();
    b[CHECKSUM_AT..CHECKSUM_AT + 8].copy_from_slice(&sum);
    let end = b.len();
    b[end - 8..].copy_from_slice(&sum);
    let copy = dir.0.join("alias.kv");
    std::fs::write(&copy, &b).unwrap();
    let e = read_header(&copy, &hybrid_identity()).unwrap_err();
    assert!(matches!(&e, Reject::Header(m) if m.contains("tensor 8 at offset")), "{e}");
}
