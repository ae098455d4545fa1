//! `gpt2` vocabularies: byte-level BPE with an explicit merge list (SmolLM2, StarCoder,
//! GPT-2 style). Token texts are in GPT-2's byte-to-unicode alphabet; pieces map back.

use std::collections::HashMap;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};

use super::{TokenKind, pre};
use crate::error::{Error, Result};
use crate::gguf::Gguf;

pub(super) fn build(
    g: &Gguf,
    texts: &[String],
    kinds: &[TokenKind],
) -> Result<(tokenizers::Tokenizer, Vec<Vec<u8>>, pre::Pre)> {
    // The pre-tokenizer first: an unknown one is the error to report, before any work.
    let pre = pre::lookup(g.opt_str("tokenizer.ggml.pre"))?;
    let merges: Vec<(String, String)> = g
        .str_array("tokenizer.ggml.merges")?
        .into_iter()
        .map(|m| {
            // llama.cpp splits at the first space after the first character.
            m.char_indices()
                .skip(1)
                .find(|&(_, c)| c == ' ')
                .map(|(i, _)| (m[..i].to_owned(), m[i + 1..].to_owned()))
                .ok_or_else(|| Error::Tokenizer(format!("bad merge {m:?}")))
        })
        .collect::<Result<_>>()?;
    let vocab: Vocab = texts.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(pre.ignore_merges)
        .build()
        .map_err(|e| Error::Tokenizer(e.to_string()))?;
    let mut tok = tokenizers::Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(pre::build(&pre)?));
    tok.with_decoder(Some(ByteLevelDecoder::default()));

    let unbyte = unicode_to_byte();
    let pieces = texts
        .iter()
        .zip(kinds)
        .map(|(t, k)| match k {
            TokenKind::Control | TokenKind::Unused => Vec::new(),
            TokenKind::UserDefined => t.as_bytes().to_vec(),
            _ => {
                // Every char of a byte-level token is one byte; anything else is kept as
                // its UTF-8 (llama.cpp does the same for malformed vocab entries).
                let mut out = Vec::with_capacity(t.len());
                for c in t.chars() {
                    match unbyte.get(&c) {
                        Some(&b) => out.push(b),
                        None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                    }
                }
                out
            }
        })
        .collect();
    Ok((tok, pieces, pre))
}

/// Inverse of GPT-2's `bytes_to_unicode`: printable bytes map to themselves, the other
/// 68 to U+0100.. in order.
pub(super) fn unicode_to_byte() -> HashMap<char, u8> {
    let mut map = HashMap::with_capacity(256);
    let mut next = 256u32;
    for b in 0u32..=255 {
        let printable = (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
        let c = if printable {
            b
        } else {
            next += 1;
            next - 1
        };
        map.insert(char::from_u32(c).expect("byte-level chars are valid scalars"), b as u8);
    }
    map
}

#[cfg(test)]
mod tests {
    #[test]
    fn byte_alphabet_round_trips() {
        let m = super::unicode_to_byte();
        assert_eq!(m.len(), 256);
        assert_eq!(m[&'Ġ'], b' ');
        assert_eq!(m[&'Ċ'], b'\n');
        assert_eq!(m[&'a'], b'a');
    }
}
