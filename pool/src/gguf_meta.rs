//! What the gateway needs to know about a model without starting an engine: a GGUF
//! file's architecture, training context length, chat template and file type
//! (quantization), read from its metadata header. Not a model loader — tensors are never read, and no model code is
//! linked (the engine owns that). The header is untrusted bytes: every length is
//! bounded, arrays are skipped without being read into memory, and a short or malformed
//! file is an error, never a panic.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GgufMeta {
    pub arch: String,
    /// `<arch>.context_length`.
    pub context_length: Option<u64>,
    pub chat_template: Option<String>,
    /// `general.file_type`: llama.cpp's `llama_ftype` (see `file_type_name`).
    pub file_type: Option<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum GgufMetaError {
    #[error("reading {0}")]
    Io(#[from] std::io::Error),
    #[error("not a GGUF file")]
    NotGguf,
    #[error("unsupported GGUF version {0}")]
    Version(u32),
    #[error("malformed GGUF header: {0}")]
    Malformed(&'static str),
}

/// Strings longer than this are refused (chat templates are a few KiB to ~100 KiB).
const MAX_STRING: u64 = 16 << 20;
const MAX_KV: u64 = 1 << 20;
const MAX_DEPTH: u32 = 4;

pub fn read(path: &Path) -> Result<GgufMeta, GgufMetaError> {
    parse(&mut BufReader::new(File::open(path)?))
}

pub fn parse<R: Read + Seek>(r: &mut R) -> Result<GgufMeta, GgufMetaError> {
    let mut magic = [0u8; 4];
    r.read_exact(&mut magic)?;
    if &magic != b"GGUF" {
        return Err(GgufMetaError::NotGguf);
    }
    let version = u32::from_le_bytes(bytes(r)?);
    if !(2..=3).contains(&version) {
        return Err(GgufMetaError::Version(version));
    }
    let _tensors = u64::from_le_bytes(bytes(r)?);
    let kv = u64::from_le_bytes(bytes(r)?);
    if kv > MAX_KV {
        return Err(GgufMetaError::Malformed("too many metadata keys"));
    }
    let mut meta = GgufMeta::default();
    let mut context: Vec<(String, u64)> = Vec::new();
    for _ in 0..kv {
        let key = string(r)?;
        let ty = u32::from_le_bytes(bytes(r)?);
        match (key.as_str(), ty) {
            ("general.architecture", 8) => meta.arch = string(r)?,
            ("tokenizer.chat_template", 8) => meta.chat_template = Some(string(r)?),
            ("general.file_type", 4 | 5) => meta.file_type = Some(u32::from_le_bytes(bytes(r)?)),
            (k, 4 | 10) if k.ends_with(".context_length") => {
                let v = if ty == 4 { u32::from_le_bytes(bytes(r)?) as u64 } else { u64::from_le_bytes(bytes(r)?) };
                context.push((k.trim_end_matches(".context_length").to_owned(), v));
            }
            _ => skip(r, ty, 0)?,
        }
    }
    meta.context_length = context.into_iter().find(|(a, _)| *a == meta.arch).map(|(_, v)| v);
    Ok(meta)
}

/// The name llama.cpp gives a `general.file_type` (`llama_ftype`): the quantization of
/// most of the file's tensors.
pub fn file_type_name(ft: u32) -> Option<&'static str> {
    Some(match ft {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        _ => return None,
    })
}

fn bytes<const N: usize, R: Read>(r: &mut R) -> Result<[u8; N], GgufMetaError> {
    let mut b = [0u8; N];
    r.read_exact(&mut b)?;
    Ok(b)
}

fn string<R: Read>(r: &mut R) -> Result<String, GgufMetaError> {
    let len = u64::from_le_bytes(bytes(r)?);
    if len > MAX_STRING {
        return Err(GgufMetaError::Malformed("string too long"));
    }
    let mut buf = vec![0u8; len as usize];
    r.read_exact(&mut buf)?;
    String::from_utf8(buf).map_err(|_| GgufMetaError::Malformed("string is not UTF-8"))
}

fn scalar_size(ty: u32) -> Option<u64> {
    match ty {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

/// Move `n` bytes on. Short hops are read and dropped: `BufReader::seek` throws its
/// buffer away on every call, which made skipping a 262,144-token vocabulary one 8 KiB
/// read per token (seconds before the gateway could listen).
fn advance<R: Read + Seek>(r: &mut R, n: i64) -> Result<(), GgufMetaError> {
    match u64::try_from(n) {
        Ok(short) if short <= 64 * 1024 => {
            std::io::copy(&mut r.by_ref().take(short), &mut std::io::sink())?;
        }
        _ => {
            r.seek(SeekFrom::Current(n))?;
        }
    }
    Ok(())
}

/// Move past one value of type `ty` without keeping it.
fn skip<R: Read + Seek>(r: &mut R, ty: u32, depth: u32) -> Result<(), GgufMetaError> {
    if let Some(n) = scalar_size(ty) {
        return advance(r, n as i64);
    }
    match ty {
        8 => {
            let len = u64::from_le_bytes(bytes(r)?);
            let len = i64::try_from(len).map_err(|_| GgufMetaError::Malformed("string too long"))?;
            advance(r, len)?;
        }
        9 if depth < MAX_DEPTH => {
            let elem = u32::from_le_bytes(bytes(r)?);
            let n = u64::from_le_bytes(bytes(r)?);
            match scalar_size(elem) {
                Some(size) => {
                    let total = n.checked_mul(size).and_then(|t| i64::try_from(t).ok());
                    advance(r, total.ok_or(GgufMetaError::Malformed("array too long"))?)?;
                }
                None => {
                    for _ in 0..n {
                        skip(r, elem, depth + 1)?;
                    }
                }
            }
        }
        9 => return Err(GgufMetaError::Malformed("arrays nested too deep")),
        _ => return Err(GgufMetaError::Malformed("unknown value type")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    fn s(out: &mut Vec<u8>, v: &str) {
        out.extend((v.len() as u64).to_le_bytes());
        out.extend(v.as_bytes());
    }

    fn header(kvs: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(0u64.to_le_bytes());
        out.extend((kvs.len() as u64).to_le_bytes());
        for (k, ty, v) in kvs {
            s(&mut out, k);
            out.extend(ty.to_le_bytes());
            out.extend(v);
        }
        out
    }

    fn str_val(v: &str) -> Vec<u8> {
        let mut out = Vec::new();
        s(&mut out, v);
        out
    }

    #[test]
    fn reads_arch_context_and_template_skipping_the_rest() {
        let mut tokens = 8u32.to_le_bytes().to_vec();
        tokens.extend(2u64.to_le_bytes());
        s(&mut tokens, "a");
        s(&mut tokens, "bc");
        let mut scores = 6u32.to_le_bytes().to_vec();
        scores.extend(3u64.to_le_bytes());
        scores.extend([0u8; 12]);
        let h = header(&[
            ("general.architecture", 8, str_val("gemma3")),
            ("tokenizer.ggml.tokens", 9, tokens),
            ("tokenizer.ggml.scores", 9, scores),
            ("llama.context_length", 4, 99u32.to_le_bytes().to_vec()),
            ("gemma3.context_length", 4, 32768u32.to_le_bytes().to_vec()),
            ("general.flag", 7, vec![1]),
            ("general.file_type", 4, 15u32.to_le_bytes().to_vec()),
            ("tokenizer.chat_template", 8, str_val("{{ x }}")),
        ]);
        let m = parse(&mut Cursor::new(h)).unwrap();
        assert_eq!(
            m,
            GgufMeta {
                arch: "gemma3".into(),
                context_length: Some(32768),
                chat_template: Some("{{ x }}".into()),
                file_type: Some(15),
            }
        );
        assert_eq!(m.file_type.and_then(file_type_name), Some("Q4_K_M"));
        assert_eq!(file_type_name(3), Some("Q4_1"));
        assert_eq!(file_type_name(4), None, "retired types have no name");
    }

    #[test]
    fn every_truncation_and_bad_header_is_an_error() {
        let h = header(&[("general.architecture", 8, str_val("llama")), ("tokenizer.chat_template", 8, str_val("t"))]);
        for n in 0..h.len() {
            assert!(parse(&mut Cursor::new(&h[..n])).is_err(), "cut at {n}");
        }
        assert!(matches!(parse(&mut Cursor::new(b"GGML....".to_vec())), Err(GgufMetaError::NotGguf)));
        let mut v1 = h.clone();
        v1[4] = 1;
        assert!(matches!(parse(&mut Cursor::new(v1)), Err(GgufMetaError::Version(1))));
        let huge = header(&[("k", 8, u64::MAX.to_le_bytes().to_vec())]);
        assert!(parse(&mut Cursor::new(huge)).is_err());
        let bad_type = header(&[("k", 77, vec![])]);
        assert!(parse(&mut Cursor::new(bad_type)).is_err());
    }
}
