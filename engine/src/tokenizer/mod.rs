//! Tokenizer built from a GGUF's `tokenizer.ggml.*` metadata with the `tokenizers` crate.
//!
//! Parity target: the same ids as llama.cpp's tokenizer for the same file, with special
//! tokens parsed (as llama.cpp's server does for prompts) or not (`encode_unparsed`). Two
//! vocab kinds are supported: `gpt2` (byte-level BPE with merges, e.g. Llama 3, Qwen2,
//! SmolLM2; the pre-tokenizers are in `pre.rs`) and `llama` (SentencePiece-style scores,
//! e.g. Gemma, Phi-3). engine/tests/tokenizer_vocab.rs checks both against llama.cpp's
//! own tokenizer test data. Decoding does not go through `tokenizers`: every token has a
//! byte string (`piece`), so streaming output can be assembled byte-exactly and cut only
//! at UTF-8 boundaries (see `crate::detok`).

mod gpt2;
mod merges_cache;
mod pre;
mod spm;

use std::collections::HashSet;
use std::sync::OnceLock;

use tokenizers::AddedToken;

use crate::error::{Error, Result};
use crate::gguf::Gguf;

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenKind {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenKind {
    fn from_gguf(v: i32) -> Self {
        match v {
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Normal,
        }
    }
}

/// Token texts that end a turn in the chat formats we know; llama.cpp treats a control
/// token with one of these texts as end-of-generation even when `eos_token_id` differs.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "<|return|>",
    "<|call|>",
    "<｜end▁of▁sentence｜>",
];

pub use pre::names as gpt2_pre_tokenizers;

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// `inner` with control-token texts left as text, built on first use.
    unparsed: OnceLock<tokenizers::Tokenizer>,
    /// Bytes each token renders as (empty for control tokens).
    pieces: Vec<Vec<u8>>,
    texts: Vec<String>,
    kinds: Vec<TokenKind>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    eog: HashSet<u32>,
    /// A hash over everything that determines ids, for cache-file compatibility checks.
    fingerprint: u64,
}

impl Tokenizer {
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        Self::from_gguf_cached(g, None)
    }

    /// Like `from_gguf`, keeping what is slow to derive from the vocabulary (a
    /// SentencePiece vocabulary's ranked merges) in `cache_dir` for the next start.
    pub fn from_gguf_cached(g: &Gguf, cache_dir: Option<&std::path::Path>) -> Result<Self> {
        let model = g.str("tokenizer.ggml.model")?;
        let texts: Vec<String> = g.str_array("tokenizer.ggml.tokens")?.into_iter().map(str::to_owned).collect();
        let mut kinds: Vec<TokenKind> = match g.i32_array("tokenizer.ggml.token_type") {
            Ok(v) if v.len() == texts.len() => v.into_iter().map(TokenKind::from_gguf).collect(),
            _ => vec![TokenKind::Normal; texts.len()],
        };
        let harmony_end = harmony_overrides(&texts, &mut kinds);
        // llama.cpp's defaults: SentencePiece adds BOS; a gpt2 vocabulary's pre-tokenizer
        // says (Llama 3 and Tekken do), and ChatGLM's has no BOS at all.
        let (inner, pieces, default_add_bos, no_bos) = match model {
            "gpt2" => {
                let (inner, pieces, pre) = gpt2::build(g, &texts, &kinds)?;
                (inner, pieces, pre.add_bos, pre.no_bos)
            }
            "llama" => {
                let (inner, pieces) = spm::build(g, &texts, &kinds, cache_dir)?;
                (inner, pieces, true, false)
            }
            other => {
                return Err(Error::Tokenizer(format!(
                    "unsupported tokenizer model {other:?} (supported: gpt2, llama)"
                )));
            }
        };
        let mut inner = inner;
        let rstrip = rstrip_rule(g);
        add_special_tokens(&mut inner, &texts, &kinds, rstrip)?;

        let n = texts.len() as u32;
        let id = |key: &str| g.opt_u32(key).filter(|&i| i < n);
        let bos = id("tokenizer.ggml.bos_token_id").filter(|_| !no_bos);
        let eos = id("tokenizer.ggml.eos_token_id");
        let add_bos = g.opt_bool("tokenizer.ggml.add_bos_token").unwrap_or(default_add_bos) && bos.is_some();
        let mut eog: HashSet<u32> =
            [eos, id("tokenizer.ggml.eot_token_id"), id("tokenizer.ggml.eom_token_id")].into_iter().flatten().collect();
        for (i, t) in texts.iter().enumerate() {
            if kinds[i] == TokenKind::Control && EOG_TEXTS.contains(&t.as_str()) {
                eog.insert(i as u32);
            }
        }
        if let Some(end) = harmony_end {
            eog.remove(&end);
        }
        let fingerprint = fingerprint(model, &texts, &kinds, g);
        Ok(Self { inner, unparsed: OnceLock::new(), pieces, texts, kinds, bos, eos, add_bos, eog, fingerprint })
    }

    /// Token ids for `text`, exactly as llama.cpp's `llama_tokenize(add_special,
    /// parse_special=true)`: special-token texts in `text` become their tokens, and with
    /// `add_special` the BOS token is prepended when the model asks for it (even if the
    /// text already spells one: chat rendering strips a template's own BOS instead).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        self.encode_with(&self.inner, text, add_special)
    }

    /// Like `encode`, but control-token texts in `text` stay text (llama.cpp's
    /// `parse_special=false`, as its tokenizer tests run); user-defined tokens are still
    /// matched, as llama.cpp does.
    pub fn encode_unparsed(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let tok = self.unparsed.get_or_init(|| {
            let mut t = self.inner.clone();
            t.set_encode_special_tokens(true);
            t
        });
        self.encode_with(tok, text, add_special)
    }

    fn encode_with(&self, tok: &tokenizers::Tokenizer, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = tok.encode_fast(text, false).map_err(|e| Error::Tokenizer(e.to_string()))?;
        let ids = enc.get_ids();
        let mut out = Vec::with_capacity(ids.len() + 1);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        out.extend_from_slice(ids);
        Ok(out)
    }

    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The bytes token `id` renders as in generated text (empty for control tokens).
    pub fn piece(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map_or(&[], Vec::as_slice)
    }

    /// The vocabulary text of a token (for special tokens, e.g. `<|im_end|>`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    /// The id of the token whose vocabulary text is `text`, if there is one.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.texts.iter().position(|t| t == text).map(|i| i as u32)
    }

    pub fn kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    /// Decoded text of `ids`, invalid UTF-8 replaced.
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids.iter().flat_map(|&i| self.piece(i).iter().copied()).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    pub fn eog_tokens(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.eog.iter().copied().collect();
        v.sort_unstable();
        v
    }

    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }
}

/// gpt-oss's harmony tokens as llama.cpp loads them (`llama_vocab::impl::load`): the
/// message-structure tokens `<|channel|>`, `<|message|>`, `<|start|>` and `<|constrain|>`
/// become user-defined in any vocabulary, so generated text shows them and they are matched
/// in text even when special tokens are not parsed; and where `<|return|>`, `<|call|>` and
/// `<|end|>` all end generation, `<|end|>` does not (it ends one message of several) and is
/// user-defined too. Returns that `<|end|>`'s id, to keep it out of the end-of-generation set.
fn harmony_overrides(texts: &[String], kinds: &mut [TokenKind]) -> Option<u32> {
    let find = |t: &str| texts.iter().position(|x| x == t);
    for t in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(i) = find(t) {
            kinds[i] = TokenKind::UserDefined;
        }
    }
    let control = |i: Option<usize>| i.filter(|&i| kinds[i] == TokenKind::Control);
    let (ret, call, end) = (control(find("<|return|>")), control(find("<|call|>")), control(find("<|end|>")));
    let end = ret.and(call).and(end)?;
    kinds[end] = TokenKind::UserDefined;
    Some(end as u32)
}

/// Which special tokens swallow the whitespace after them. llama.cpp sets this by model
/// name, not from the file: for Phi-3 every partitioned token does, except `<unk>`, `<s>`
/// and `<|endoftext|>`.
fn rstrip_rule(g: &Gguf) -> impl Fn(&str) -> bool + use<> {
    let name = g.opt_str("general.name").unwrap_or("").to_lowercase();
    let phi3 = name.contains("phi-3") || name.contains("phi3");
    move |text: &str| phi3 && !matches!(text, "<unk>" | "<s>" | "<|endoftext|>")
}

/// Control, unknown and user-defined tokens are matched in the raw text before the
/// model's own segmentation, like llama.cpp's special-token partition; control and
/// unknown ones only when special tokens are parsed (they are `special` here).
fn add_special_tokens(
    tok: &mut tokenizers::Tokenizer,
    texts: &[String],
    kinds: &[TokenKind],
    rstrip: impl Fn(&str) -> bool,
) -> Result<()> {
    let mut special = Vec::new();
    let mut user = Vec::new();
    for (t, k) in texts.iter().zip(kinds) {
        if t.is_empty() {
            continue;
        }
        let added = |special: bool| AddedToken::from(t.clone(), special).normalized(false).rstrip(rstrip(t));
        match k {
            TokenKind::Control | TokenKind::Unknown => special.push(added(true)),
            TokenKind::UserDefined => user.push(added(false)),
            _ => {}
        }
    }
    tok.add_special_tokens(special).map_err(|e| Error::Tokenizer(e.to_string()))?;
    tok.add_tokens(user).map_err(|e| Error::Tokenizer(e.to_string()))?;
    Ok(())
}

fn fingerprint(model: &str, texts: &[String], kinds: &[TokenKind], g: &Gguf) -> u64 {
    use std::hash::{Hash, Hasher};
    // FNV-1a via a fixed-key hasher, so the value is stable across runs and builds.
    struct Fnv(u64);
    impl Hasher for Fnv {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            for b in bytes {
                self.0 ^= *b as u64;
                self.0 = self.0.wrapping_mul(0x100_0000_01b3);
            }
        }
    }
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    model.hash(&mut h);
    g.opt_str("tokenizer.ggml.pre").hash(&mut h);
    for (t, k) in texts.iter().zip(kinds) {
        t.hash(&mut h);
        (*k as u8).hash(&mut h);
    }
    if let Ok(merges) = g.str_array("tokenizer.ggml.merges") {
        merges.hash(&mut h);
    }
    if let Ok(scores) = g.f32_array("tokenizer.ggml.scores") {
        for s in scores {
            s.to_bits().hash(&mut h);
        }
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_kinds_follow_llama_cpp_numbering() {
        assert_eq!(TokenKind::from_gguf(1), TokenKind::Normal);
        assert_eq!(TokenKind::from_gguf(3), TokenKind::Control);
        assert_eq!(TokenKind::from_gguf(4), TokenKind::UserDefined);
        assert_eq!(TokenKind::from_gguf(6), TokenKind::Byte);
        assert_eq!(TokenKind::from_gguf(99), TokenKind::Normal);
    }
}
