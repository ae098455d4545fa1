//! A prompt-cache file's header and footer: encoding them, and reading them back with
//! every count, shape, offset and length checked (checked arithmetic, against the real
//! file size) before anything trusts them. The layout is `docs/formats.md`'s; the body's
//! tensors are `file.rs`'s.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use super::file::*;

/// Most KV layers, and most recurrent states, a header may claim.
const MAX_LAYERS: usize = 4096;
const MAX_STATES: usize = 4096;

pub(super) fn header_len(n_tokens: usize, n_tensors: usize) -> usize {
    FIXED_HEADER + n_tokens * 4 + n_tensors * TENSOR_ENTRY
}

pub(super) fn body_checksum(tensors: &[TensorEntry]) -> u64 {
    let mut h = Xxh3::new();
    for t in tensors {
        h.update(&t.checksum.to_le_bytes());
    }
    h.digest()
}

/// The recurrent shape fields of a header: layers, conv and ssm floats per layer (zeros
/// for a model without recurrent layers).
fn recurrent_fields(id: &Identity) -> [u32; 3] {
    id.recurrent.map_or([0; 3], |r| [r.layers as u32, r.conv as u32, r.ssm as u32])
}

pub(super) fn encode_header(h: &Header) -> Vec<u8> {
    let id = &h.identity;
    let mut b = Vec::with_capacity(header_len(h.tokens.len(), h.tensors.len()));
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(&(header_len(h.tokens.len(), h.tensors.len()) as u32).to_le_bytes());
    b.extend_from_slice(&id.model_fingerprint);
    b.extend_from_slice(&id.tokenizer_hash);
    b.extend_from_slice(&h.prefix_key);
    for v in [h.tokens.len() as u32, id.shape.n_layers as u32, id.shape.kv_dim as u32, DTYPE_F16, KV_LAYOUT_VERSION] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(&(h.tensors.len() as u32).to_le_bytes());
    for v in [h.body_offset, h.body_len, h.created_unix] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    for v in recurrent_fields(id).into_iter().chain([h.states.len() as u32]) {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.resize(FIXED_HEADER, 0);
    b.extend_from_slice(bytemuck::cast_slice(&h.tokens));
    for t in &h.tensors {
        for v in [t.layer, t.kind] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in [t.offset, t.len] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in [t.rows, t.cols] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&t.checksum.to_le_bytes());
    }
    let sum = xxh3_64(&b);
    b[CHECKSUM_AT..CHECKSUM_AT + 8].copy_from_slice(&sum.to_le_bytes());
    b
}

struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let (a, rest) = self.0.split_at(N);
        self.0 = rest;
        a.try_into().expect("split_at(N)")
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}

fn bad(msg: impl Into<String>) -> Reject {
    Reject::Header(msg.into())
}

/// Read and check a file's header and footer (not the body's checksums: see `restore`).
pub fn read_header(path: &Path, expect: &Identity) -> Result<Header, Reject> {
    let mut f = File::open(path)?;
    let file_len = f.metadata()?.len();
    let mut fixed = [0u8; FIXED_HEADER];
    if file_len < (FIXED_HEADER + FOOTER) as u64 {
        // Too short to be anything; a zero-length or torn file.
        let n = f.read(&mut fixed)?;
        if n < 8 || fixed[..8] != MAGIC {
            return Err(Reject::Magic);
        }
        return Err(Reject::Size { have: file_len, want: (FIXED_HEADER + FOOTER) as u64 });
    }
    f.read_exact(&mut fixed)?;
    let mut c = Cursor(&fixed);
    if c.take::<8>() != MAGIC {
        return Err(Reject::Magic);
    }
    let version = c.u16();
    if version > FORMAT_VERSION {
        return Err(Reject::Newer(version));
    }
    if version < FORMAT_VERSION {
        return Err(Reject::Older(version));
    }
    let _flags = c.u16();
    let hlen = c.u32() as usize;
    let fingerprint: [u8; 32] = c.take();
    let tokenizer: [u8; 32] = c.take();
    let prefix: [u8; 32] = c.take();
    let (n_tokens, n_layers, kv_dim, dtype, layout, n_tensors) =
        (c.u32() as usize, c.u32() as usize, c.u32() as usize, c.u32(), c.u32(), c.u32() as usize);
    let (body_offset, body_len, created_unix) = (c.u64(), c.u64(), c.u64());
    let recurrent = [c.u32(), c.u32(), c.u32()];
    let n_states = c.u32() as usize;
    if n_tokens == 0 || n_tokens > MAX_TOKENS || n_layers > MAX_LAYERS || n_states > MAX_STATES {
        return Err(bad(format!("{n_tokens} tokens, {n_layers} layers, {n_states} states")));
    }
    if n_tensors != 2 * n_layers + 2 * n_states {
        return Err(bad(format!("{n_tensors} tensors for {n_layers} layers and {n_states} states")));
    }
    if hlen != header_len(n_tokens, n_tensors) || hlen as u64 > file_len {
        return Err(bad(format!("header length {hlen}")));
    }
    let mut rest = vec![0u8; hlen - FIXED_HEADER];
    f.read_exact(&mut rest)?;
    let mut whole = fixed.to_vec();
    whole.extend_from_slice(&rest);
    let stored = u64::from_le_bytes(whole[CHECKSUM_AT..CHECKSUM_AT + 8].try_into().expect("8 bytes"));
    whole[CHECKSUM_AT..CHECKSUM_AT + 8].fill(0);
    if xxh3_64(&whole) != stored {
        return Err(Reject::HeaderChecksum);
    }
    if fingerprint != expect.model_fingerprint {
        return Err(Reject::OtherModel);
    }
    if tokenizer != expect.tokenizer_hash {
        return Err(Reject::OtherTokenizer);
    }
    if n_layers != expect.shape.n_layers
        || kv_dim != expect.shape.kv_dim
        || dtype != DTYPE_F16
        || layout != KV_LAYOUT_VERSION
        || recurrent != recurrent_fields(expect)
    {
        return Err(Reject::Shape);
    }
    if expect.recurrent.is_some() != (n_states > 0) {
        return Err(bad(format!("{n_states} recurrent states for this model")));
    }
    let tokens: Vec<u32> =
        rest[..n_tokens * 4].chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes"))).collect();
    if prefix_key(&tokens) != prefix {
        return Err(bad("prefix key does not match the token ids"));
    }
    let mut c = Cursor(&rest[n_tokens * 4..]);
    let tensors: Vec<TensorEntry> = (0..n_tensors)
        .map(|_| TensorEntry {
            layer: c.u32(),
            kind: c.u32(),
            offset: c.u64(),
            len: c.u64(),
            rows: c.u32(),
            cols: c.u32(),
            checksum: c.u64(),
        })
        .collect();
    let want_len = body_offset
        .checked_add(body_len)
        .and_then(|x| x.checked_add(FOOTER as u64))
        .ok_or_else(|| bad("body range overflows"))?;
    if body_offset < hlen as u64 || !body_offset.is_multiple_of(BODY_ALIGN) {
        return Err(bad(format!("body offset {body_offset}")));
    }
    if want_len != file_len {
        return Err(Reject::Size { have: file_len, want: want_len });
    }
    let (kv, states) = tensors.split_at(2 * n_layers);
    check_kv_table(kv, n_tokens, kv_dim, body_len)?;
    let states = check_state_table(states, n_tokens, recurrent, body_len)?;
    check_end_to_end(&tensors, body_len)?;
    let header = Header {
        identity: expect.clone(),
        prefix_key: prefix,
        tokens,
        body_checksum: body_checksum(&tensors),
        tensors,
        states,
        body_offset,
        body_len,
        header_checksum: stored,
        created_unix,
        file_len,
    };
    read_footer(&mut f, &header)?;
    Ok(header)
}

/// A tensor's bytes lie inside the body and are exactly `rows · cols · size` long.
fn fits(t: &TensorEntry, size: u64, body_len: u64) -> bool {
    let want = u64::from(t.rows).checked_mul(u64::from(t.cols)).and_then(|x| x.checked_mul(size));
    t.offset.checked_add(t.len).is_some_and(|end| end <= body_len) && want == Some(t.len)
}

/// The K and V entries: layer by layer, K then V, `[n_tokens][kv_dim]` f16 each.
fn check_kv_table(kv: &[TensorEntry], n_tokens: usize, kv_dim: usize, body_len: u64) -> Result<(), Reject> {
    for (i, t) in kv.iter().enumerate() {
        if (t.layer as usize, t.kind) != (i / 2, (i % 2) as u32)
            || t.rows as usize != n_tokens
            || t.cols as usize != kv_dim
            || !fits(t, 2, body_len)
        {
            return Err(bad(format!("tensor entry for layer {} kind {}", t.layer, t.kind)));
        }
    }
    Ok(())
}

/// The recurrent entries: per state a conv and an ssm tensor (`[layers][floats]` f32)
/// at the same token position, positions ascending from 1, the last `n_tokens`. Returns
/// the positions.
fn check_state_table(
    states: &[TensorEntry],
    n_tokens: usize,
    [layers, conv, ssm]: [u32; 3],
    body_len: u64,
) -> Result<Vec<u32>, Reject> {
    let mut positions: Vec<u32> = Vec::with_capacity(states.len() / 2);
    for pair in states.chunks_exact(2) {
        let pos = pair[0].layer;
        let after_last = positions.last().is_none_or(|&p| pos > p);
        let kinds = [(KIND_CONV, conv), (KIND_SSM, ssm)];
        let shaped = pair.iter().zip(kinds).all(|(t, (kind, cols))| {
            t.layer == pos && t.kind == kind && t.rows == layers && t.cols == cols && fits(t, 4, body_len)
        });
        if pos == 0 || pos as usize > n_tokens || !after_last || !shaped {
            return Err(bad(format!("recurrent state entry at position {pos}")));
        }
        positions.push(pos);
    }
    if positions.last().is_some_and(|&p| p as usize != n_tokens) {
        return Err(bad("the last recurrent state is not at the end of the tokens"));
    }
    Ok(positions)
}

/// The tensors lie end to end in table order from the body's start and fill it, as the
/// writer lays them: no two share bytes, so restoring builds no more than the file holds
/// (a forged table pointing many states at one state's bytes would multiply it).
fn check_end_to_end(tensors: &[TensorEntry], body_len: u64) -> Result<(), Reject> {
    let mut end = 0u64;
    for (i, t) in tensors.iter().enumerate() {
        if t.offset != end {
            return Err(bad(format!("tensor {i} at offset {} (the previous one ends at {end})", t.offset)));
        }
        end = t.offset.checked_add(t.len).ok_or_else(|| bad("tensor range overflows"))?;
    }
    if end != body_len {
        return Err(bad(format!("tensors end at {end}, the body at {body_len}")));
    }
    Ok(())
}

fn read_footer(f: &mut File, h: &Header) -> Result<(), Reject> {
    f.seek(SeekFrom::Start(h.file_len - FOOTER as u64))?;
    let mut foot = [0u8; FOOTER];
    f.read_exact(&mut foot)?;
    let mut c = Cursor(&foot);
    if c.take::<8>() != FOOTER_MAGIC || c.u64() != h.body_checksum || c.u64() != h.header_checksum {
        return Err(Reject::Footer);
    }
    Ok(())
}
