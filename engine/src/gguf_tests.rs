//! GGUF files built byte by byte: what `Gguf::open` refuses and what it loads.

use super::*;

fn s(out: &mut Vec<u8>, v: &str) {
    out.extend((v.len() as u64).to_le_bytes());
    out.extend(v.as_bytes());
}

/// A GGUF v3 file with no metadata: `tensors` as (name, dims innermost first, ggml
/// type, offset into the data), then `data` (aligned to 32, the default).
fn gguf(tensors: &[(&str, &[u64], u32, u64)], data: &[u8]) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend(0u64.to_le_bytes());
    for (name, dims, ty, offset) in tensors {
        s(&mut out, name);
        out.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
        out.extend(ty.to_le_bytes());
        out.extend(offset.to_le_bytes());
    }
    out.resize(out.len().next_multiple_of(32), 0);
    out.extend(data);
    out
}

fn open(tag: &str, bytes: &[u8]) -> Result<Gguf> {
    let path = std::env::temp_dir().join(format!("corral-gguf-{tag}-{}.gguf", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    let g = Gguf::open(&path);
    std::fs::remove_file(&path).unwrap();
    g
}

#[test]
fn a_small_file_opens() {
    let g = open("ok", &gguf(&[("t", &[4], 0, 0)], &[0; 16])).unwrap();
    assert_eq!(g.raw("t").unwrap().0.len(), 16);
    assert_eq!(g.tensor_names().collect::<Vec<_>>(), ["t"]);
    assert_eq!(g.f32_tensor("t", 4).unwrap(), [0.0; 4]);
}

/// Found by the `gguf_header` fuzz target: candle's element count multiplies the
/// dims unchecked (a panic with overflow checks, a wrapped small size without), and
/// its strides do too, even for a tensor with a zero dim.
#[test]
fn dims_whose_product_overflows_are_refused() {
    let huge = 1u64 << 32;
    // Also with a zero dim: candle's strides multiply the others first.
    for dims in [&[huge, huge, huge, 32][..], &[huge, huge, 0]] {
        let e = open("dims", &gguf(&[("t", dims, 0, 0)], &[0; 16])).err().unwrap();
        assert!(e.to_string().contains("element count overflows"), "{dims:?}: {e}");
    }
}

fn kv(key: &str, ty: u32, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    s(&mut out, key);
    out.extend(ty.to_le_bytes());
    out.extend(value);
    out
}

/// Reproduced by the `gguf_header` fuzz target (seed `alignment-zero`): candle divides
/// by `general.alignment`, so a 0 there panicked instead of failing.
#[test]
fn a_zero_alignment_is_refused() {
    let with = |kvs: &[Vec<u8>]| {
        let mut g = gguf(&[("t", &[4], 0, 0)], &[0; 16]);
        g[16..24].copy_from_slice(&(kvs.len() as u64).to_le_bytes());
        g.splice(24..24, kvs.concat());
        open("align", &g)
    };
    let mut names = Vec::new();
    s(&mut names, "a");
    let array = [&8u32.to_le_bytes()[..], &1u64.to_le_bytes(), &names].concat();
    for ty in 0..=5u32 {
        let zero = vec![0u8; 1 << (ty / 2)];
        let e = with(&[kv("x.names", 9, &array), kv("general.alignment\0", ty, &zero)]).err().unwrap();
        assert!(e.to_string().contains("general.alignment is 0"), "type {ty}: {e}");
    }
    // The last of a repeated key counts; a 64-bit alignment is ignored by candle.
    let ok = with(&[kv("general.alignment", 4, &0u32.to_le_bytes()), kv("general.alignment", 4, &[32, 0, 0, 0])]);
    assert!(ok.is_ok());
    assert!(with(&[kv("general.alignment", 10, &0u64.to_le_bytes())]).is_ok());
}

/// Found by the `gguf_header` fuzz target: a tensor at an offset that is not a
/// multiple of 4 is copied before candle reads it, and the copy of an empty one was
/// a `Vec<u8>` whose dangling pointer (1) failed candle's alignment assertion.
#[test]
fn tensors_at_odd_offsets_load() {
    let g = open("odd", &gguf(&[("empty", &[0], 0, 1), ("t", &[2], 0, 3)], &[0; 16])).unwrap();
    assert!(g.f32_tensor("empty", 0).unwrap().is_empty());
    assert_eq!(g.f32_tensor("t", 2).unwrap(), [0.0; 2]);
}

/// IQ4_NL and IQ4_XS tensors, which candle's reader refuses, open with their own type and
/// byte ranges (18 bytes per 32 values, 136 per 256); `raw` (candle's types) refuses them.
#[test]
fn iq4_tensors_open_with_their_own_type() {
    let g =
        open("iq4", &gguf(&[("nl", &[64], 20, 0), ("xs", &[256], 23, 64), ("f", &[2], 0, 224)], &[7; 232])).unwrap();
    let (nl, t) = g.raw_stored("nl").unwrap();
    assert_eq!((nl.len(), t), (36, Stored::Iq4Nl));
    let (xs, t) = g.raw_stored("xs").unwrap();
    assert_eq!((xs.len(), t), (136, Stored::Iq4Xs));
    assert_eq!(g.raw_stored("f").unwrap().1, Stored::Ggml(GgmlDType::F32));
    assert!(g.raw("xs").is_err());
    // Past the end of the file: a truncated IQ4 tensor is refused like any other.
    let e = open("iq4-short", &gguf(&[("xs", &[512], 23, 0)], &[0; 200])).err().unwrap();
    assert!(e.to_string().contains("xs"), "{e}");
}
