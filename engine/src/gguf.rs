//! GGUF model files: open, validate, read metadata and tensors.
//!
//! Parsing is candle's bounded `gguf_file` reader; this module adds what a server needs
//! before it trusts a file: the magic is checked first (a clear "not a GGUF" error), and
//! every tensor's byte range is checked against the real file size, so a truncated
//! download is a typed error, never a short read or a SIGBUS while serving. Tensor bytes
//! are copied out of the map into candle-owned storage; the map is dropped after load.
//! Tensors of the types candle's reader does not know (the IQ4s, MXFP4) are found by a
//! scan of the header first and handed to it as Q4_0; their real type (`Stored`) and
//! byte ranges are kept here, and only our own kernels read them.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::Device;
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use memmap2::Mmap;

use crate::error::{Error, Result};

#[path = "gguf_stored.rs"]
mod stored;
pub use stored::Stored;
use stored::own_types;

pub struct Gguf {
    path: PathBuf,
    /// Shared with what reads the file after load (a mixture of experts' matrices).
    map: Arc<Mmap>,
    content: Content,
    /// The tensors of a type candle's reader does not know, with that type.
    own: HashMap<String, Stored>,
}

impl Gguf {
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| Error::Io { path: path.to_owned(), source };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if file.metadata().map_err(io)?.is_dir() {
            return Err(io(std::io::Error::other("is a directory")));
        }
        if len < 8 {
            return Err(Error::NotGguf { path: path.to_owned() });
        }
        // SAFETY: the file is opened read-only and read through this map during load (and,
        // for a mixture of experts, whenever an expert is first used: `mapping`); every
        // range read below is bounds-checked against `len`. Model files are not expected
        // to be rewritten while a model is loaded (a concurrent truncation would be a
        // SIGBUS, the same contract as llama.cpp's mmap loading).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        if &map[..4] != b"GGUF" {
            return Err(Error::NotGguf { path: path.to_owned() });
        }
        if zero_alignment(&map) {
            return Err(Error::BadGguf { path: path.to_owned(), reason: "general.alignment is 0".into() });
        }
        let own = own_types(&map);
        let header = own.as_ref().map_or(&map[..], |(header, _)| &header[..]);
        let content = Content::read(&mut Cursor::new(header))
            .map_err(|e| Error::BadGguf { path: path.to_owned(), reason: crate::error::candle_message(&e) })?;
        let own = own.map(|(_, own)| own).unwrap_or_default();
        let gguf = Self { path: path.to_owned(), map: Arc::new(map), content, own };
        gguf.check_tensor_ranges()?;
        Ok(gguf)
    }

    fn check_tensor_ranges(&self) -> Result<()> {
        let have = self.map.len() as u64;
        for (name, info) in &self.content.tensor_infos {
            let (start, end) = self.byte_range(name, info)?;
            if end > have || start > end {
                return Err(Error::Truncated { path: self.path.clone(), tensor: name.clone(), need: end, have });
            }
        }
        Ok(())
    }

    fn stored(&self, name: &str, info: &candle_core::quantized::gguf_file::TensorInfo) -> Stored {
        self.own.get(name).copied().unwrap_or(Stored::Ggml(info.ggml_dtype))
    }

    fn byte_range(&self, name: &str, info: &candle_core::quantized::gguf_file::TensorInfo) -> Result<(u64, u64)> {
        let dtype = self.stored(name, info);
        // Checked, zeros counted as 1: candle multiplies the dims unchecked (the element
        // count, the strides from the innermost out), so no partial product may overflow,
        // or a wrapped small size could pass the range check below.
        let dims = info.shape.dims();
        let bound = dims
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul((d as u64).max(1)))
            .ok_or_else(|| self.bad(format!("tensor {name}: element count overflows")))?;
        let elems = if dims.contains(&0) { 0 } else { bound };
        let block = dtype.block_size() as u64;
        if !elems.is_multiple_of(block) {
            return Err(self.bad(format!("tensor {name}: {elems} elements is not a multiple of {block}")));
        }
        let bytes = (elems / block)
            .checked_mul(dtype.type_size() as u64)
            .ok_or_else(|| self.bad(format!("tensor {name}: size overflows")))?;
        let start = self
            .content
            .tensor_data_offset
            .checked_add(info.offset)
            .ok_or_else(|| self.bad(format!("tensor {name}: offset overflows")))?;
        let end = start.checked_add(bytes).ok_or_else(|| self.bad(format!("tensor {name}: size overflows")))?;
        Ok((start, end))
    }

    fn bad(&self, reason: String) -> Error {
        Error::BadGguf { path: self.path.clone(), reason }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole file (for fingerprinting).
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The file's mapping, for weights read after load: a tensor's bytes are
    /// `mapping()[tensor_range(name)]`.
    pub(crate) fn mapping(&self) -> Arc<Mmap> {
        Arc::clone(&self.map)
    }

    /// Where a tensor's bytes lie in the file, and its format.
    pub(crate) fn tensor_range(&self, name: &str) -> Result<(std::ops::Range<usize>, Stored)> {
        let (bytes, dtype) = self.raw_stored(name)?;
        let start = bytes.as_ptr() as usize - self.map.as_ptr() as usize;
        Ok((start..start + bytes.len(), dtype))
    }

    /// BLAKE3 over the tokenizer's metadata (`tokenizer.ggml.*`, keys in order).
    pub fn tokenizer_hash(&self) -> [u8; 32] {
        let mut keys: Vec<&String> =
            self.content.metadata.keys().filter(|k| k.starts_with("tokenizer.ggml.")).collect();
        keys.sort();
        let mut h = blake3::Hasher::new();
        for k in keys {
            h.update(k.as_bytes());
            h.update(format!("{:?}", self.content.metadata[k]).as_bytes());
        }
        *h.finalize().as_bytes()
    }

    pub fn file_len(&self) -> u64 {
        self.map.len() as u64
    }

    pub fn architecture(&self) -> Result<&str> {
        self.str("general.architecture")
    }

    fn value(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    fn missing(key: &str) -> Error {
        Error::Metadata { key: key.to_owned() }
    }

    pub fn has(&self, key: &str) -> bool {
        self.value(key).is_some()
    }

    pub fn str(&self, key: &str) -> Result<&str> {
        match self.value(key) {
            Some(Value::String(s)) => Ok(s),
            _ => Err(Self::missing(key)),
        }
    }

    pub fn opt_str(&self, key: &str) -> Option<&str> {
        self.str(key).ok()
    }

    /// Any integer type that fits a u32 (writers differ in which width they use).
    pub fn u32(&self, key: &str) -> Result<u32> {
        let v = match self.value(key) {
            Some(Value::U8(v)) => Some(*v as u64),
            Some(Value::U16(v)) => Some(*v as u64),
            Some(Value::U32(v)) => Some(*v as u64),
            Some(Value::U64(v)) => Some(*v),
            Some(Value::I8(v)) => u64::try_from(*v).ok(),
            Some(Value::I16(v)) => u64::try_from(*v).ok(),
            Some(Value::I32(v)) => u64::try_from(*v).ok(),
            Some(Value::I64(v)) => u64::try_from(*v).ok(),
            _ => None,
        };
        v.and_then(|v| u32::try_from(v).ok()).ok_or_else(|| Self::missing(key))
    }

    pub fn opt_u32(&self, key: &str) -> Option<u32> {
        self.u32(key).ok()
    }

    pub fn f32(&self, key: &str) -> Result<f32> {
        match self.value(key) {
            Some(Value::F32(v)) => Ok(*v),
            Some(Value::F64(v)) => Ok(*v as f32),
            _ => Err(Self::missing(key)),
        }
    }

    pub fn opt_f32(&self, key: &str) -> Option<f32> {
        self.f32(key).ok()
    }

    pub fn opt_bool(&self, key: &str) -> Option<bool> {
        match self.value(key) {
            Some(Value::Bool(b)) => Some(*b),
            _ => None,
        }
    }

    fn array(&self, key: &str) -> Result<&[Value]> {
        match self.value(key) {
            Some(Value::Array(v)) => Ok(v),
            _ => Err(Self::missing(key)),
        }
    }

    pub fn str_array(&self, key: &str) -> Result<Vec<&str>> {
        self.array(key)?
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.as_str()),
                _ => Err(Self::missing(key)),
            })
            .collect()
    }

    pub fn f32_array(&self, key: &str) -> Result<Vec<f32>> {
        self.array(key)?
            .iter()
            .map(|v| match v {
                Value::F32(x) => Ok(*x),
                _ => Err(Self::missing(key)),
            })
            .collect()
    }

    pub fn i32_array(&self, key: &str) -> Result<Vec<i32>> {
        self.array(key)?
            .iter()
            .map(|v| match v {
                Value::I32(x) => Ok(*x),
                Value::U32(x) => i32::try_from(*x).map_err(|_| Self::missing(key)),
                Value::U8(x) => Ok(*x as i32),
                // llama.cpp's converter writes per-layer flags (qwen35's recurrent layers) as bools.
                Value::Bool(x) => Ok(i32::from(*x)),
                _ => Err(Self::missing(key)),
            })
            .collect()
    }

    /// The names of the file's tensors, in no particular order.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.content.tensor_infos.keys().map(String::as_str)
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Dimensions of a tensor, outermost first (`[rows, cols]` for a weight matrix).
    pub fn dims(&self, name: &str) -> Result<Vec<usize>> {
        self.content
            .tensor_infos
            .get(name)
            .map(|i| i.shape.dims().to_vec())
            .ok_or_else(|| Error::Tensor { name: name.to_owned(), reason: "missing".into() })
    }

    /// A tensor's stored bytes and format, of a type candle reads.
    pub fn raw(&self, name: &str) -> Result<(&[u8], GgmlDType)> {
        match self.raw_stored(name)? {
            (bytes, Stored::Ggml(dtype)) => Ok((bytes, dtype)),
            (_, other) => Err(Error::Tensor {
                name: name.to_owned(),
                reason: format!("{other:?}: only the CPU's own kernels read it"),
            }),
        }
    }

    /// A tensor's stored bytes and format, whatever the type.
    pub fn raw_stored(&self, name: &str) -> Result<(&[u8], Stored)> {
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| Error::Tensor { name: name.to_owned(), reason: "missing".into() })?;
        let (start, end) = self.byte_range(name, info)?;
        // Ranges were validated against the map length at open.
        Ok((&self.map[start as usize..end as usize], self.stored(name, info)))
    }

    /// `raw_rows` of a type candle reads.
    pub fn raw_rows(&self, name: &str, rows: std::ops::Range<usize>) -> Result<(&[u8], GgmlDType)> {
        match self.raw_rows_stored(name, rows)? {
            (bytes, Stored::Ggml(dtype)) => Ok((bytes, dtype)),
            (_, other) => Err(Error::Tensor {
                name: name.to_owned(),
                reason: format!("{other:?}: only the CPU's own kernels read it"),
            }),
        }
    }

    /// Rows `rows` of a 2-D tensor (`[rows, cols]`, outermost first): their stored bytes and
    /// format. Fused weights (phi3's `attn_qkv`, its gate|up `ffn_up`) are split this way,
    /// each part a matrix of its own whose rows are the file's, bit for bit.
    pub fn raw_rows_stored(&self, name: &str, rows: std::ops::Range<usize>) -> Result<(&[u8], Stored)> {
        let dims = self.dims(name)?;
        let (bytes, dtype) = self.raw_stored(name)?;
        let bad = |reason: String| Error::Tensor { name: name.to_owned(), reason };
        let [n, k] = dims[..] else { return Err(bad(format!("shape {dims:?} is not a matrix"))) };
        if rows.start > rows.end || rows.end > n || !k.is_multiple_of(dtype.block_size()) {
            return Err(bad(format!("rows {rows:?} of a [{n}, {k}] {dtype:?} matrix")));
        }
        let row = k / dtype.block_size() * dtype.type_size();
        Ok((&bytes[rows.start * row..rows.end * row], dtype))
    }

    /// A tensor in its stored (possibly quantized) format, copied into candle storage.
    pub fn qtensor(&self, name: &str) -> Result<QTensor> {
        let (bytes, dtype) = self.raw(name)?;
        qtensor_of(bytes, dtype, self.content.tensor_infos[name].shape.clone())
    }

    /// `qtensor` of rows `rows` of a matrix (`raw_rows`).
    pub fn qtensor_rows(&self, name: &str, rows: std::ops::Range<usize>) -> Result<QTensor> {
        let k = self.dims(name)?.get(1).copied().unwrap_or(0);
        let n = rows.len();
        let (bytes, dtype) = self.raw_rows(name, rows)?;
        qtensor_of(bytes, dtype, (n, k).into())
    }

    /// A small tensor (norm weights) as f32, dequantized if needed.
    pub fn f32_tensor(&self, name: &str, expect_len: usize) -> Result<Vec<f32>> {
        let t = self.qtensor(name)?.dequantize(&Device::Cpu)?;
        let v = t.flatten_all()?.to_vec1::<f32>()?;
        if v.len() != expect_len {
            return Err(Error::Tensor {
                name: name.to_owned(),
                reason: format!("has {} elements, expected {expect_len}", v.len()),
            });
        }
        Ok(v)
    }
}

/// Stored bytes as a candle tensor. candle casts them to its block structs and asserts
/// alignment (at most 4 for every ggml block). GGUF aligns data to 32, but a file may lie
/// (and a row range starts anywhere): copy if so, into u32s (a copy as a Vec<u8> is not
/// aligned by contract, and an empty one's pointer is 1).
pub(crate) fn qtensor_of(bytes: &[u8], dtype: GgmlDType, shape: candle_core::Shape) -> Result<QTensor> {
    let copy: Vec<u32>;
    let data = if (bytes.as_ptr() as usize).is_multiple_of(4) {
        bytes
    } else {
        let mut words = vec![0u32; bytes.len().div_ceil(4)];
        bytemuck::cast_slice_mut::<u32, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        copy = words;
        &bytemuck::cast_slice::<u32, u8>(&copy)[..bytes.len()]
    };
    let storage = QStorage::from_data(Cow::Borrowed(data), &Device::Cpu, dtype)?;
    Ok(QTensor::new(storage, shape)?)
}

/// Whether the metadata sets `general.alignment` to 0. candle's reader divides by it
/// when it is an integer of at most 32 bits, so a 0 would panic (abort the engine)
/// instead of failing. Anything else malformed is left to that reader to name.
fn zero_alignment(bytes: &[u8]) -> bool {
    let scan = || -> Option<bool> {
        let v1 = u32::from_le_bytes(bytes.get(4..8)?.try_into().ok()?) == 1;
        let mut w = Walk { rest: bytes.get(8..)?, v1 };
        let (_tensors, kvs) = (w.len()?, w.len()?);
        let mut zero = false;
        for _ in 0..kvs {
            let n = w.len()?;
            let key = w.take(n)?;
            let ty = w.u32()?;
            // candle drops a key's trailing NULs; a repeated key: the last one counts.
            let key = &key[..key.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1)];
            if key == b"general.alignment" && ty <= 5 {
                let v = w.take(1 << (ty / 2))?;
                zero = v.iter().all(|&b| b == 0);
            } else {
                w.skip(ty, 0)?;
            }
        }
        Some(zero)
    };
    scan().unwrap_or(false)
}

/// A walk over GGUF metadata values (version 1 writes lengths as u32, later ones as u64).
struct Walk<'a> {
    rest: &'a [u8],
    v1: bool,
}

impl<'a> Walk<'a> {
    fn take(&mut self, n: u64) -> Option<&'a [u8]> {
        let n = usize::try_from(n).ok().filter(|&n| n <= self.rest.len())?;
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn len(&mut self) -> Option<u64> {
        if self.v1 { self.u32().map(u64::from) } else { Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?)) }
    }

    /// Past one value of type `ty` (every value is at least one byte, so a walk over a
    /// huge declared array ends where the bytes do).
    fn skip(&mut self, ty: u32, depth: u32) -> Option<()> {
        let size = match ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            10..=12 => 8,
            8 => self.len()?,
            9 if depth < 64 => {
                let (ty, n) = (self.u32()?, self.len()?);
                for _ in 0..n {
                    self.skip(ty, depth + 1)?;
                }
                return Some(());
            }
            _ => return None,
        };
        self.take(size).map(|_| ())
    }
}

#[cfg(test)]
#[path = "gguf_tests.rs"]
mod tests;
