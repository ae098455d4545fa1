//! The pre-tokenizers of `gpt2` (byte-level BPE) vocabularies, by `tokenizer.ggml.pre`,
//! exactly as llama.cpp's `llm_tokenizer_bpe` splits text before merging
//! (`src/llama-vocab.cpp` and `src/unicode.cpp` of llama.cpp as vendored by
//! llama-cpp-python 0.3.36). It owns the name → regex-list table and nothing else.
//!
//! llama.cpp applies a list of regexes in turn; each one splits every piece so far into
//! its matches and the text between them, both kept. `tokenizers`' `Split` with
//! `Isolated` behaviour does the same, so each regex becomes one `Split` (onig regex on
//! the real text), followed by the GPT-2 byte-to-unicode mapping. The regexes are
//! llama.cpp's own strings, taken verbatim, because what llama.cpp runs is not always what
//! the model's tokenizer.json says:
//! - llama.cpp runs four patterns (GPT-2, Llama 3, Qwen2, Qwen3.5) with hand-written
//!   matchers. The GPT-2 one also matches a trailing `\s+` that its regex string lacks
//!   (as GPT-2's own regex does), so `|\s+` is appended here.
//! - The others go through `std::regex` on a "collapsed" text where every non-ASCII
//!   character stands for its category, so `\p{Lu}`, `\p{Ll}`, ... all mean `\p{L}`
//!   there (the case-split patterns of GPT-4o and Tekken therefore treat every non-ASCII
//!   letter as both cases); `\p{Lx}` is rewritten to `\p{L}` to match.
//! - `$` is end of input in `std::regex` (per piece); onig's `$` is end of line, so it
//!   would become `\z` (no supported pattern has one today).

use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::tokenizer::SplitDelimiterBehavior;

use crate::error::{Error, Result};

/// What a pre-tokenizer name means to llama.cpp, beyond the regexes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Pre {
    pub regexes: &'static [&'static str],
    /// A pre-token that is itself a vocabulary entry is that token, unmerged.
    pub ignore_merges: bool,
    /// The BOS default when the file has no `tokenizer.ggml.add_bos_token`.
    pub add_bos: bool,
    /// The vocabulary has no BOS token at all (ChatGLM).
    pub no_bos: bool,
}

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const JAIS2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}";
const DEEPSEEK_V3: &[&str] = &[
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];
const SPARK2_5: &[&str] = &[
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+"##,
    r"\p{N}",
];
const YOUTU: &[&str] = &[
    r"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];
const DEEPSEEK_CODER: &[&str] = &[r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"];
const FALCON: &[&str] = &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"];
const STARCODER: &[&str] = &[r"\p{N}", GPT2];
const DEFAULT: &[&str] = &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"];
const BLOOM: &[&str] = &[r" ?[^(\s|.,!?…。，、।۔،)]+"];
const VIKING: &[&str] = &[r" ?[^(\s|.,!?…。，、।۔،)]+", r"\p{N}"];
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const CHAMELEON: &[&str] = &[
    r"<sentinel:[0-9]+>",
    r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    r"([\t\n]|    |  )",
    r"\p{N}",
    r"[\p{P}!-/:-@\[-`{-~]",
    GPT2,
];
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const BAILINGMOE: &str = r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
const SEED_CODER: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
const UFAKZEKA: &str = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LAGUNA: &[&str] = &[r"[^\n]+|[\n]+", QWEN2];
const EXAONE_MOE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+";
const MINICPM5: &[&str] = &[
    r"\p{N}{1,3}",
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

const fn pre(regexes: &'static [&'static str]) -> Pre {
    Pre { regexes, ignore_merges: false, add_bos: false, no_bos: false }
}

/// Every name accepted, with what llama.cpp makes of it, in llama.cpp's order. Names
/// llama.cpp knows but that are left out: embedding-model ones that add a SEP token
/// (`jina-v1-en`, `jina-v2-code`, `roberta-bpe`, `granite-embed-multi-97m`), and those
/// with custom matchers of their own (`kimi-k2`, `afmoe`, `tiny_aya`, `cohere2moe`,
/// `superbpe`) or raw-UTF-8 BPE (`gemma4`, `sarvam-moe`, `whitespace`). Not yet:
/// `deepseek-llm`, whose letter-range regex onig refuses ("empty range in char class").
const TABLE: &[(&[&str], Pre)] = &[
    (&["default"], pre(DEFAULT)),
    (&["minicpm5"], Pre { ignore_merges: true, ..pre(MINICPM5) }),
    (
        &["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"],
        Pre { ignore_merges: true, add_bos: true, ..pre(&[LLAMA3]) },
    ),
    (&["deepseek-coder"], pre(DEEPSEEK_CODER)),
    (&["deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"], pre(DEEPSEEK_V3)),
    (&["spark2_5"], pre(SPARK2_5)),
    (&["youtu"], Pre { ignore_merges: true, ..pre(YOUTU) }),
    (&["falcon"], pre(FALCON)),
    (&["starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"], pre(STARCODER)),
    (
        &[
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "exaone4",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
        ],
        pre(&[GPT2]),
    ),
    (&["jais-2"], pre(&[JAIS2])),
    (&["dbrx", "smaug-bpe"], pre(&[LLAMA3])),
    (&["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"], pre(&[QWEN2])),
    (&["qwen35"], pre(&[QWEN35])),
    (&["poro-chat", "bloom", "gpt3-finnish"], pre(BLOOM)),
    (&["chatglm-bpe"], Pre { no_bos: true, ..pre(&[LLAMA3]) }),
    (&["glm4", "glm5"], Pre { no_bos: true, ignore_merges: true, ..pre(&[LLAMA3]) }),
    (&["viking"], pre(VIKING)),
    (&["tekken"], Pre { ignore_merges: true, add_bos: true, ..pre(&[TEKKEN]) }),
    (&["chameleon"], Pre { add_bos: true, ..pre(CHAMELEON) }),
    (&["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], pre(&[GPT4O])),
    (&["bailingmoe", "bailingmoe2", "llada-moe"], pre(&[BAILINGMOE])),
    (&["seed-coder"], pre(&[SEED_CODER])),
    (&["ufakzeka"], pre(&[UFAKZEKA])),
    (&["grok-2"], pre(&[QWEN2])),
    (&["laguna"], pre(LAGUNA)),
    (&["exaone-moe"], pre(&[EXAONE_MOE])),
];

/// llama.cpp's reading of `tokenizer.ggml.pre` (absent: `default`, as llama.cpp does
/// with a warning); an unknown name is an error naming it.
pub(super) fn lookup(name: Option<&str>) -> Result<Pre> {
    let name = name.filter(|n| !n.is_empty()).unwrap_or("default");
    TABLE.iter().find(|(names, _)| names.contains(&name)).map(|(_, p)| *p).ok_or_else(|| {
        Error::Tokenizer(format!(
            "unsupported pre-tokenizer {name:?} (tokenizer.ggml.pre) for a gpt2 vocabulary; supported: {}",
            names().join(", ")
        ))
    })
}

/// Every accepted name, in table order.
pub fn names() -> Vec<&'static str> {
    TABLE.iter().flat_map(|(names, _)| names.iter().copied()).collect()
}

/// The `tokenizers` pre-tokenizer: one isolating split per regex, then GPT-2's byte map.
pub(super) fn build(p: &Pre) -> Result<PreTokenizerWrapper> {
    let mut steps = Vec::with_capacity(p.regexes.len() + 1);
    for re in p.regexes {
        let re = translate(re);
        let split = Split::new(SplitPattern::Regex(re.clone()), SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| Error::Tokenizer(format!("pre-tokenizer regex {re:?}: {e}")))?;
        steps.push(PreTokenizerWrapper::Split(split));
    }
    steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)));
    Ok(PreTokenizerWrapper::Sequence(Sequence::new(steps)))
}

/// A llama.cpp regex string as onig must read it to split the same way (module doc).
fn translate(re: &str) -> String {
    if re == GPT2 {
        return format!(r"{GPT2}|\s+");
    }
    let mut out = re.to_owned();
    for class in [r"\p{Lu}", r"\p{Ll}", r"\p{Lt}", r"\p{Lm}", r"\p{Lo}"] {
        out = out.replace(class, r"\p{L}");
    }
    if let Some(head) = out.strip_suffix('$') {
        out = format!(r"{head}\z");
    }
    out
}

#[cfg(test)]
mod tests {
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    use super::*;

    fn split(name: &str, text: &str) -> Vec<String> {
        let pre = build(&lookup(Some(name)).unwrap()).unwrap();
        let mut s = PreTokenizedString::from(text);
        pre.pre_tokenize(&mut s).unwrap();
        let unbyte = super::super::gpt2::unicode_to_byte();
        s.get_splits(OffsetReferential::Original, OffsetType::Char)
            .into_iter()
            .map(|(t, _, _)| {
                let bytes: Vec<u8> = t.chars().map(|c| unbyte[&c]).collect();
                String::from_utf8(bytes).unwrap()
            })
            .collect()
    }

    #[test]
    fn every_name_is_unique_and_every_regex_compiles() {
        let names = names();
        let unique: std::collections::HashSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len());
        for (_, p) in TABLE {
            build(p).unwrap();
        }
    }

    #[test]
    fn unknown_and_absent_names() {
        let err = lookup(Some("no-such-pre")).unwrap_err().to_string();
        assert!(err.contains("\"no-such-pre\""), "{err}");
        assert_eq!(lookup(None).unwrap(), lookup(Some("default")).unwrap());
        assert!(lookup(Some("gpt2")).is_err(), "llama.cpp knows gpt-2, not gpt2");
    }

    #[test]
    fn llama3_groups_digits_by_three_and_keeps_newlines_with_space() {
        assert_eq!(split("llama-bpe", "1234567"), ["123", "456", "7"]);
        assert_eq!(split("llama-bpe", "a  \n\n b"), ["a", "  \n\n", " b"]);
        assert_eq!(split("qwen2", "x123"), ["x", "1", "2", "3"]);
    }

    #[test]
    fn gpt2_pattern_keeps_trailing_whitespace() {
        assert_eq!(split("gpt-2", "a b  "), ["a", " b", "  "]);
        assert_eq!(split("gpt-2", "a \tb"), ["a", " ", "\t", "b"]);
    }

    #[test]
    fn case_split_patterns_treat_non_ascii_letters_as_both_cases() {
        // llama.cpp's collapsed text: É is a letter of no case, so "ÉcoleÉcole" stays whole.
        assert_eq!(split("tekken", "HelloWorld ÉcoleÉcole"), ["Hello", "World", " ÉcoleÉcole"]);
    }
}
