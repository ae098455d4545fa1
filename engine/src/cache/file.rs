//! One prompt-cache entry on disk: the KV of a token sequence (and a hybrid model's
//! recurrent states at some of its positions), in an immutable file.
//!
//! Layout (little-endian, see `docs/formats.md`): a fixed 256-byte header, the token
//! ids, a tensor table (one K and one V tensor per layer, `[n_tokens][kv_dim]` f16, then
//! per recurrent state a convolution and a delta-rule tensor, `[layers][floats]` f32;
//! each with an XXH3-64 checksum), zero padding to a 4 KiB-aligned body, the tensors, and
//! a 24-byte footer repeating the checksums so a torn or garbage tail is seen without
//! reading the body. Nothing here trusts a byte it has not checked: every offset and
//! length is checked with checked arithmetic against the real file size before the body
//! is mapped (`file_header.rs`).

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use half::f16;
use memmap2::Mmap;
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use crate::checkpoint;
use crate::kv::{KvShape, SeqCache};
use crate::recurrent::{RecurrentShape, RecurrentState};

pub const MAGIC: [u8; 8] = *b"CORRALKV";
pub const FOOTER_MAGIC: [u8; 8] = *b"KVCORRAL";
/// 2: recurrent states (format 1 held KV only).
pub const FORMAT_VERSION: u16 = 2;
/// Bumped whenever the meaning of the stored values changes (KV numerics, layout).
pub const KV_LAYOUT_VERSION: u32 = 1;
pub const DTYPE_F16: u32 = 1;
pub const FIXED_HEADER: usize = 256;
pub const TENSOR_ENTRY: usize = 40;
pub const FOOTER: usize = 24;
pub const BODY_ALIGN: u64 = 4096;
/// Longest sequence a file may hold (a bound on what a corrupt header can ask for).
pub const MAX_TOKENS: usize = 1 << 24;
pub(super) const CHECKSUM_AT: usize = 248;
/// Tensor kinds: a layer's K and V, a recurrent state's convolution and delta-rule parts.
pub const KIND_K: u32 = 0;
pub const KIND_V: u32 = 1;
pub const KIND_CONV: u32 = 2;
pub const KIND_SSM: u32 = 3;
/// Bytes written per step; the writer may pause between steps.
pub const WRITE_CHUNK: usize = 1 << 20;

/// What a file must match to be used by this engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub model_fingerprint: [u8; 32],
    pub tokenizer_hash: [u8; 32],
    pub shape: KvShape,
    /// A hybrid model's recurrent state shape (its files carry states); `None` otherwise.
    pub recurrent: Option<RecurrentShape>,
}

/// Why a file was not used. Every one is a cache miss; `Newer` files are left alone
/// (a newer corral may still want them), the others are deleted.
#[derive(Debug, thiserror::Error)]
pub enum Reject {
    #[error("reading the file: {0}")]
    Io(#[from] io::Error),
    #[error("not a corral KV file (bad magic)")]
    Magic,
    #[error("format version {0} is newer than this corral's {FORMAT_VERSION}")]
    Newer(u16),
    #[error("format version {0} is older than this corral's {FORMAT_VERSION}")]
    Older(u16),
    #[error("header checksum mismatch")]
    HeaderChecksum,
    #[error("bad header: {0}")]
    Header(String),
    #[error("written for another model (fingerprint differs)")]
    OtherModel,
    #[error("written with another tokenizer")]
    OtherTokenizer,
    #[error("KV or recurrent shape or layout differs from this model's")]
    Shape,
    #[error("file size {have} does not match its header ({want})")]
    Size { have: u64, want: u64 },
    #[error("footer mismatch (torn or overwritten tail)")]
    Footer,
    #[error("tensor {0} checksum mismatch")]
    TensorChecksum(usize),
}

impl Reject {
    /// Whether the file should be deleted (it can never be valid for anyone).
    pub fn is_garbage(&self) -> bool {
        !matches!(self, Reject::Newer(_) | Reject::Io(_))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorEntry {
    /// The layer (K, V), or the token position a recurrent state belongs to.
    pub layer: u32,
    /// `KIND_K`, `KIND_V`, `KIND_CONV` or `KIND_SSM`.
    pub kind: u32,
    /// From the start of the body.
    pub offset: u64,
    pub len: u64,
    pub rows: u32,
    pub cols: u32,
    pub checksum: u64,
}

/// A checked header.
#[derive(Clone, Debug)]
pub struct Header {
    pub identity: Identity,
    pub prefix_key: [u8; 32],
    pub tokens: Vec<u32>,
    pub tensors: Vec<TensorEntry>,
    /// Token positions with a recurrent state, ascending (the last is `tokens.len()`);
    /// empty for a model without recurrent layers.
    pub states: Vec<u32>,
    pub body_offset: u64,
    pub body_len: u64,
    pub header_checksum: u64,
    pub body_checksum: u64,
    pub created_unix: u64,
    pub file_len: u64,
}

/// BLAKE3 of the token ids: the content address of an entry.
pub fn prefix_key(tokens: &[u32]) -> [u8; 32] {
    *blake3::hash(bytemuck::cast_slice(tokens)).as_bytes()
}

/// File name of the entry for `tokens`.
pub fn file_name(tokens: &[u32]) -> String {
    let key = prefix_key(tokens);
    let hex: String = key[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{hex}.kv")
}

pub use super::file_header::read_header;
use super::file_header::{body_checksum, encode_header, header_len};

/// Map a checked file and build the sequence of its first `n` positions: for a file with
/// recurrent states, of its newest state at or below `n` (`checkpoint::restorable`), with
/// the states up to it; fewer than `n` positions, or none, may come back. With `verify`,
/// every tensor's checksum is checked first (the whole body is read).
pub fn restore(path: &Path, h: &Header, n: usize, verify: bool) -> Result<SeqCache, Reject> {
    let f = File::open(path)?;
    if f.metadata()?.len() != h.file_len {
        return Err(Reject::Size { have: f.metadata()?.len(), want: h.file_len });
    }
    // SAFETY: published cache files are immutable (written under a temp name, renamed,
    // never reopened for writing or truncated; eviction unlinks, which keeps the inode
    // alive for this map) and live in a 0700 directory of ours. The length was checked
    // just above, and every range below is within it.
    let map = unsafe { Mmap::map(&f) }?;
    let body = &map[h.body_offset as usize..(h.body_offset + h.body_len) as usize];
    let bytes = |t: &TensorEntry| &body[t.offset as usize..(t.offset + t.len) as usize];
    if verify {
        for (i, t) in h.tensors.iter().enumerate() {
            if xxh3_64(bytes(t)) != t.checksum {
                return Err(Reject::TensorChecksum(i));
            }
        }
    }
    let mut n = n.min(h.tokens.len());
    if !h.states.is_empty() {
        n = checkpoint::restorable(h.states.iter().map(|&p| p as usize), n);
    }
    let d = h.identity.shape.kv_dim;
    let mut kv = SeqCache::from_runs::<Reject>(h.identity.shape, n, |layer, which, pos0, dst| {
        let t = &h.tensors[layer * 2 + which];
        let start = t.offset as usize + pos0 * d * 2;
        let src = &body[start..start + dst.len() * 2];
        bytemuck::cast_slice_mut::<f16, u8>(dst).copy_from_slice(src);
        Ok(())
    })?;
    if let (Some(shape), true) = (h.identity.recurrent, n > 0) {
        let pairs = h.tensors[2 * h.identity.shape.n_layers..].chunks_exact(2);
        let states = pairs
            .filter(|p| p[0].layer as usize <= n)
            .map(|p| {
                let state = RecurrentState::from_parts(shape, floats(bytes(&p[0])), floats(bytes(&p[1])));
                Ok((p[0].layer as usize, Arc::new(state.ok_or(Reject::Shape)?)))
            })
            .collect::<Result<Vec<_>, Reject>>()?;
        if !kv.set_states(states) {
            return Err(Reject::Header("recurrent states do not end at the restored position".into()));
        }
    }
    Ok(kv)
}

/// Little-endian f32s from bytes at any alignment.
fn floats(bytes: &[u8]) -> Vec<f32> {
    let n = bytes.len() / 4;
    let mut v = vec![0f32; n];
    bytemuck::cast_slice_mut::<f32, u8>(&mut v).copy_from_slice(&bytes[..n * 4]);
    v
}

/// Check every checksum of a file (for tests and `corral` tooling).
pub fn verify(path: &Path, expect: &Identity) -> Result<Header, Reject> {
    let h = read_header(path, expect)?;
    restore(path, &h, 0, true)?;
    Ok(h)
}

/// Where a write stopped.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("writing {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// Write the entry for `tokens` (whose KV is `kv`, `kv.len() == tokens.len()`) into
/// `dir` and publish it: temp file (O_EXCL, 0600) → fsync → rename → fsync(dir).
/// `pause` is called between chunks and may block (the writer yields to requests).
/// On any error the temp file is removed and nothing is published.
pub fn write(
    dir: &Path,
    id: &Identity,
    tokens: &[u32],
    kv: &SeqCache,
    pause: &mut dyn FnMut(),
) -> Result<PathBuf, WriteError> {
    assert_eq!(kv.len(), tokens.len(), "an entry's KV covers exactly its tokens");
    let final_path = dir.join(file_name(tokens));
    let tmp = dir.join(format!(".tmp-{}-{:016x}.kv", std::process::id(), rand::random::<u64>()));
    let io = |source| WriteError::Io { path: tmp.clone(), source };
    let result = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        write_body(&mut f, id, tokens, kv, pause)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &final_path)?;
        File::open(dir)?.sync_all()
    })();
    match result {
        Ok(()) => Ok(final_path),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(io(e))
        }
    }
}

fn kv_order(shape: &KvShape) -> impl Iterator<Item = (usize, usize)> {
    (0..shape.n_layers).flat_map(|l| (0..2).map(move |w| (l, w)))
}

/// The body's tensors after the KV: each recurrent state's parts, as (position, kind,
/// `[layers][floats]` f32). An entry of a hybrid model must have states of its shape, and
/// another model's none.
fn state_parts<'a>(id: &Identity, kv: &'a SeqCache) -> io::Result<Vec<(usize, u32, &'a [f32])>> {
    let mut parts = Vec::new();
    for (pos, st) in kv.states() {
        if Some(st.shape()) != id.recurrent {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a recurrent state of another shape"));
        }
        parts.extend([(pos, KIND_CONV, st.conv()), (pos, KIND_SSM, st.ssm())]);
    }
    if id.recurrent.is_some() && parts.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "a hybrid model's entry without its recurrent state"));
    }
    Ok(parts)
}

fn write_body(f: &mut File, id: &Identity, tokens: &[u32], kv: &SeqCache, pause: &mut dyn FnMut()) -> io::Result<()> {
    let shape = id.shape;
    let tensor_len = (tokens.len() * shape.kv_dim * 2) as u64;
    let states = state_parts(id, kv)?;
    // Checksums first (one pass over the KV and states in memory), so the header can be
    // written before the body and the file is written front to back.
    let mut tensors = Vec::with_capacity(2 * shape.n_layers + states.len());
    for (i, (layer, which)) in kv_order(&shape).enumerate() {
        let mut h = Xxh3::new();
        for run in kv.runs(layer, which) {
            h.update(bytemuck::cast_slice(run));
        }
        tensors.push(TensorEntry {
            layer: layer as u32,
            kind: which as u32,
            offset: i as u64 * tensor_len,
            len: tensor_len,
            rows: tokens.len() as u32,
            cols: shape.kv_dim as u32,
            checksum: h.digest(),
        });
    }
    let mut offset = tensor_len * 2 * shape.n_layers as u64;
    let layers = id.recurrent.map_or(0, |r| r.layers);
    for &(pos, kind, values) in &states {
        let bytes: &[u8] = bytemuck::cast_slice(values);
        tensors.push(TensorEntry {
            layer: pos as u32,
            kind,
            offset,
            len: bytes.len() as u64,
            rows: layers as u32,
            cols: (values.len() / layers.max(1)) as u32,
            checksum: xxh3_64(bytes),
        });
        offset += bytes.len() as u64;
    }
    let hlen = header_len(tokens.len(), tensors.len()) as u64;
    let body_offset = hlen.div_ceil(BODY_ALIGN) * BODY_ALIGN;
    let header = Header {
        identity: id.clone(),
        prefix_key: prefix_key(tokens),
        tokens: tokens.to_vec(),
        body_checksum: body_checksum(&tensors),
        tensors,
        states: states.iter().step_by(2).map(|s| s.0 as u32).collect(),
        body_offset,
        body_len: offset,
        header_checksum: 0,
        created_unix: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        file_len: 0,
    };
    let mut head = encode_header(&header);
    let header_checksum = u64::from_le_bytes(head[CHECKSUM_AT..CHECKSUM_AT + 8].try_into().expect("8 bytes"));
    head.resize(body_offset as usize, 0);
    let mut buf: Vec<u8> = head;
    let mut put = |buf: &mut Vec<u8>, mut bytes: &[u8]| -> io::Result<()> {
        while !bytes.is_empty() {
            let take = bytes.len().min(WRITE_CHUNK.saturating_sub(buf.len()).max(1));
            buf.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if buf.len() >= WRITE_CHUNK {
                f.write_all(buf)?;
                buf.clear();
                pause();
            }
        }
        Ok(())
    };
    for (layer, which) in kv_order(&shape) {
        for run in kv.runs(layer, which) {
            put(&mut buf, bytemuck::cast_slice(run))?;
        }
    }
    for &(_, _, values) in &states {
        put(&mut buf, bytemuck::cast_slice(values))?;
    }
    buf.extend_from_slice(&FOOTER_MAGIC);
    buf.extend_from_slice(&header.body_checksum.to_le_bytes());
    buf.extend_from_slice(&header_checksum.to_le_bytes());
    f.write_all(&buf)
}

#[cfg(target_endian = "big")]
compile_error!("the KV file format is little-endian; big-endian hosts need byte swapping here");

#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;
