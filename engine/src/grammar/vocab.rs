//! The model's vocabulary as llguidance sees it: one byte string per token id.
//!
//! Ordinary tokens are their decoded bytes (the same bytes streaming output is built
//! from). Control, unused and unknown tokens are "special": llguidance's convention is
//! the byte 0xFF followed by the token text, which no UTF-8 grammar can match, so a
//! grammar never emits them by accident. Every end-of-generation token is an EOS for
//! llguidance, so the mask allows ending exactly when the grammar is complete.

use toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use super::digits::DigitTable;
use crate::tokenizer::{TokenKind, Tokenizer};

pub struct Vocab {
    trie: TokTrie,
    pub digits: DigitTable,
}

impl Vocab {
    pub fn new(tok: &Tokenizer) -> Self {
        let words = words(tok);
        let eog = tok.eog_tokens();
        let eos = tok.eos().or_else(|| eog.first().copied()).unwrap_or(0);
        let mut info = TokRxInfo::new(words.len() as u32, eos);
        info.tok_bos = tok.bos();
        let trie = TokTrie::from(&info, &words);
        let trie = if eog.is_empty() { trie } else { trie.with_eos_tokens(&eog) };
        Self { trie, digits: DigitTable::new(&words) }
    }
}

impl TokenizerEnv for Vocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Only used by llguidance for forced-token shortcuts, which corral does not take:
    /// a greedy split over the trie is enough (and is declared non-canonical).
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

const SPECIAL_MARKER: u8 = TokTrie::SPECIAL_TOKEN_MARKER;

/// The byte string of every token id, in llguidance's convention.
fn words(tok: &Tokenizer) -> Vec<Vec<u8>> {
    (0..tok.vocab_size() as u32)
        .map(|id| match tok.kind(id) {
            Some(TokenKind::Control | TokenKind::Unused | TokenKind::Unknown) => {
                match tok.token_text(id).filter(|t| !t.is_empty()) {
                    Some(t) => [&[SPECIAL_MARKER], t.as_bytes()].concat(),
                    None => Vec::new(),
                }
            }
            // A lone 0xFF byte would read as the special-token marker; it is never
            // valid UTF-8 anyway, so the token simply stays out of the trie.
            _ if tok.piece(id) == [SPECIAL_MARKER] => Vec::new(),
            _ => tok.piece(id).to_vec(),
        })
        .collect()
}
