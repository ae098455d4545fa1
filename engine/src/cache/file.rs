//! One prompt-cache entry on disk: the KV of a token sequence, in an immutable file.
//!
//! Layout (little-endian, see `docs/formats.md`): a fixed 256-byte header, the token
//! ids, a tensor table (one K and one V tensor per layer, `[n_tokens][kv_dim]` f16, each
//! with an XXH3-64 checksum), zero padding to a 4 KiB-aligned body, the tensors, and a
//! 24-byte footer repeating the checksums so a torn or garbage tail is seen without
//! reading the body. Nothing here trusts a byte it has not checked: every offset and
//! length is checked with checked arithmetic against the real file size before the body
//! is mapped.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use half::f16;
use memmap2::Mmap;
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use crate::kv::{KvShape, SeqCache};

pub const MAGIC: [u8; 8] = *b"CORRALKV";
pub const FOOTER_MAGIC: [u8; 8] = *b"KVCORRAL";
pub const FORMAT_VERSION: u16 = 1;
/// Bumped whenever the meaning of the stored values changes (KV numerics, layout).
pub const KV_LAYOUT_VERSION: u32 = 1;
pub const DTYPE_F16: u32 = 1;
pub const FIXED_HEADER: usize = 256;
pub const TENSOR_ENTRY: usize = 40;
pub const FOOTER: usize = 24;
pub const BODY_ALIGN: u64 = 4096;
/// Longest sequence a file may hold (a bound on what a corrupt header can ask for).
pub const MAX_TOKENS: usize = 1 << 24;
const CHECKSUM_AT: usize = 248;
/// Bytes written per step; the writer may pause between steps.
pub const WRITE_CHUNK: usize = 1 << 20;

/// What a file must match to be used by this engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub model_fingerprint: [u8; 32],
    pub tokenizer_hash: [u8; 32],
    pub shape: KvShape,
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
    #[error("KV shape or layout differs from this model's")]
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
    pub layer: u32,
    /// 0 = K, 1 = V.
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

fn header_len(n_tokens: usize, n_tensors: usize) -> usize {
    FIXED_HEADER + n_tokens * 4 + n_tensors * TENSOR_ENTRY
}

fn tensor_order(shape: &KvShape) -> impl Iterator<Item = (usize, usize)> {
    (0..shape.n_layers).flat_map(|l| (0..2).map(move |w| (l, w)))
}

fn body_checksum(tensors: &[TensorEntry]) -> u64 {
    let mut h = Xxh3::new();
    for t in tensors {
        h.update(&t.checksum.to_le_bytes());
    }
    h.digest()
}

fn encode_header(h: &Header) -> Vec<u8> {
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
    if n_tokens == 0 || n_tokens > MAX_TOKENS || n_tensors > 2 * 4096 {
        return Err(bad(format!("{n_tokens} tokens, {n_tensors} tensors")));
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
    {
        return Err(Reject::Shape);
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
    let row_bytes = (kv_dim as u64) * 2;
    let mut expected_order = tensor_order(&expect.shape);
    if tensors.len() != 2 * n_layers {
        return Err(bad("tensor table does not cover every layer"));
    }
    for t in &tensors {
        let (l, w) = expected_order.next().ok_or_else(|| bad("tensor table too long"))?;
        let end = t.offset.checked_add(t.len).ok_or_else(|| bad("tensor range overflows"))?;
        if (t.layer as usize, t.kind as usize) != (l, w)
            || t.rows as usize != n_tokens
            || t.cols as usize != kv_dim
            || Some(t.len) != (n_tokens as u64).checked_mul(row_bytes)
            || end > body_len
        {
            return Err(bad(format!("tensor entry for layer {} kind {}", t.layer, t.kind)));
        }
    }
    let header = Header {
        identity: expect.clone(),
        prefix_key: prefix,
        tokens,
        body_checksum: body_checksum(&tensors),
        tensors,
        body_offset,
        body_len,
        header_checksum: stored,
        created_unix,
        file_len,
    };
    read_footer(&mut f, &header)?;
    Ok(header)
}

fn read_footer(f: &mut File, h: &Header) -> Result<(), Reject> {
    use std::io::{Seek, SeekFrom};
    f.seek(SeekFrom::Start(h.file_len - FOOTER as u64))?;
    let mut foot = [0u8; FOOTER];
    f.read_exact(&mut foot)?;
    let mut c = Cursor(&foot);
    if c.take::<8>() != FOOTER_MAGIC || c.u64() != h.body_checksum || c.u64() != h.header_checksum {
        return Err(Reject::Footer);
    }
    Ok(())
}

/// Map a checked file and build the KV of its first `n` positions. With `verify`, every
/// tensor's checksum is checked first (the whole body is read).
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
    if verify {
        for (i, t) in h.tensors.iter().enumerate() {
            if xxh3_64(&body[t.offset as usize..(t.offset + t.len) as usize]) != t.checksum {
                return Err(Reject::TensorChecksum(i));
            }
        }
    }
    let n = n.min(h.tokens.len());
    let d = h.identity.shape.kv_dim;
    let kv = SeqCache::from_runs::<Reject>(h.identity.shape, n, |layer, which, pos0, dst| {
        let t = &h.tensors[layer * 2 + which];
        let start = t.offset as usize + pos0 * d * 2;
        let src = &body[start..start + dst.len() * 2];
        bytemuck::cast_slice_mut::<f16, u8>(dst).copy_from_slice(src);
        Ok(())
    })?;
    Ok(kv)
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

fn write_body(f: &mut File, id: &Identity, tokens: &[u32], kv: &SeqCache, pause: &mut dyn FnMut()) -> io::Result<()> {
    let shape = id.shape;
    let tensor_len = (tokens.len() * shape.kv_dim * 2) as u64;
    // Checksums first (one pass over the KV in memory), so the header can be written
    // before the body and the file is written front to back.
    let mut tensors = Vec::with_capacity(2 * shape.n_layers);
    for (i, (layer, which)) in tensor_order(&shape).enumerate() {
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
    let hlen = header_len(tokens.len(), tensors.len()) as u64;
    let body_offset = hlen.div_ceil(BODY_ALIGN) * BODY_ALIGN;
    let header = Header {
        identity: id.clone(),
        prefix_key: prefix_key(tokens),
        tokens: tokens.to_vec(),
        body_checksum: body_checksum(&tensors),
        tensors,
        body_offset,
        body_len: tensor_len * 2 * shape.n_layers as u64,
        header_checksum: 0,
        created_unix: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        file_len: 0,
    };
    let mut head = encode_header(&header);
    let header_checksum = u64::from_le_bytes(head[CHECKSUM_AT..CHECKSUM_AT + 8].try_into().expect("8 bytes"));
    head.resize(body_offset as usize, 0);
    let mut buf: Vec<u8> = head;
    for (layer, which) in tensor_order(&shape) {
        for run in kv.runs(layer, which) {
            buf.extend_from_slice(bytemuck::cast_slice(run));
            if buf.len() >= WRITE_CHUNK {
                f.write_all(&buf)?;
                buf.clear();
                pause();
            }
        }
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
