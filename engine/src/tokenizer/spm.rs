//! `llama` vocabularies: SentencePiece-style pieces with scores (Gemma, Llama 2).
//!
//! llama.cpp segments such text by repeatedly merging the adjacent pair whose
//! concatenation is the highest-scoring vocabulary entry, falling back to `<0xXX>` byte
//! tokens for characters outside the vocabulary. A BPE whose merge ranks follow the
//! merged piece's score performs the same merges in the same order, so the vocabulary is
//! turned into such a merge list (every split of every piece into two pieces). With a
//! cache directory the ranked list is kept on disk (`merges_cache.rs`).

use std::path::Path;

use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::{NormalizerWrapper, Prepend, Replace, Sequence};

use super::{TokenKind, merges_cache};
use crate::error::{Error, Result};
use crate::gguf::Gguf;

const SPACE: char = '\u{2581}'; // ▁

pub(super) fn build(
    g: &Gguf,
    texts: &[String],
    kinds: &[TokenKind],
    cache: Option<&Path>,
) -> Result<(tokenizers::Tokenizer, Vec<Vec<u8>>)> {
    let scores = g.f32_array("tokenizer.ggml.scores")?;
    if scores.len() != texts.len() {
        return Err(Error::Tokenizer("scores and tokens differ in length".into()));
    }
    let vocab: Vocab = texts.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let cached = cache.and_then(|dir| merges_cache::path(dir, texts, &scores));
    let ranked = match cached.as_ref().and_then(|(path, key)| merges_cache::load(path, key, texts)) {
        Some(r) => r,
        None => {
            let r = ranked_splits(texts, &scores, &vocab);
            if let Some((path, key)) = &cached {
                merges_cache::store(path, key, &r);
            }
            r
        }
    };
    let merges = materialize(texts, &ranked);
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .build()
        .map_err(|e| Error::Tokenizer(e.to_string()))?;
    let mut tok = tokenizers::Tokenizer::new(bpe);
    let replace = Replace::new(" ", SPACE.to_string()).map_err(|e| Error::Tokenizer(e.to_string()))?;
    let normalizer: NormalizerWrapper = if g.opt_bool("tokenizer.ggml.add_space_prefix").unwrap_or(true) {
        Sequence::new(vec![Prepend::new(SPACE.to_string()).into(), replace.into()]).into()
    } else {
        replace.into()
    };
    tok.with_normalizer(Some(normalizer)).map_err(|e| Error::Tokenizer(e.to_string()))?;

    let pieces = texts
        .iter()
        .zip(kinds)
        .map(|(t, k)| match k {
            TokenKind::Control | TokenKind::Unused => Vec::new(),
            TokenKind::UserDefined => t.as_bytes().to_vec(),
            TokenKind::Byte => byte_token(t).map_or_else(|| t.as_bytes().to_vec(), |b| vec![b]),
            TokenKind::Normal | TokenKind::Unknown => t.replace(SPACE, " ").into_bytes(),
        })
        .collect();
    Ok((tok, pieces))
}

/// Every way of writing a piece as two pieces, highest merged score first, as (piece id,
/// split byte offset). Ties keep vocabulary order, which is stable across loads.
fn ranked_splits(texts: &[String], scores: &[f32], vocab: &Vocab) -> Vec<(u32, u32)> {
    let mut ranked: Vec<(f32, u32, u32)> = Vec::new(); // (score, merged id, split byte)
    for (id, t) in texts.iter().enumerate() {
        if t.chars().nth(1).is_none() {
            continue;
        }
        for (split, _) in t.char_indices().skip(1) {
            let (a, b) = t.split_at(split);
            if vocab.contains_key(a) && vocab.contains_key(b) {
                ranked.push((scores[id], id as u32, split as u32));
            }
        }
    }
    ranked.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
    ranked.into_iter().map(|(_, id, split)| (id, split)).collect()
}

/// The merges as the BPE builder takes them.
fn materialize(texts: &[String], ranked: &[(u32, u32)]) -> Vec<(String, String)> {
    ranked
        .iter()
        .map(|&(id, split)| {
            let (a, b) = texts[id as usize].split_at(split as usize);
            (a.to_owned(), b.to_owned())
        })
        .collect()
}

fn byte_token(t: &str) -> Option<u8> {
    let hex = t.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_tokens_parse() {
        assert_eq!(byte_token("<0x0A>"), Some(b'\n'));
        assert_eq!(byte_token("<0xFF>"), Some(0xff));
        assert_eq!(byte_token("<0xG1>"), None);
        assert_eq!(byte_token("hello"), None);
    }

    #[test]
    fn merges_follow_scores() {
        let texts: Vec<String> = ["a", "b", "c", "ab", "bc", "abc"].iter().map(|s| s.to_string()).collect();
        let scores = [0.0, 0.0, 0.0, -2.0, -1.0, -0.5];
        let vocab = texts.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let m = materialize(&texts, &ranked_splits(&texts, &scores, &vocab));
        let m: Vec<(&str, &str)> = m.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        assert_eq!(m, vec![("a", "bc"), ("ab", "c"), ("b", "c"), ("a", "b")]);
    }
}
