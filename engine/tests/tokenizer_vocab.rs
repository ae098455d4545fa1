//! Our tokenizer against llama.cpp's own tokenizer test data: the vocab-only GGUFs of
//! llama.cpp's `models/ggml-vocab-<name>.gguf` with their `.inp` (input strings) and
//! `.out` (llama.cpp's ids, one line per input), as `tests/test-tokenizer-0.cpp` reads
//! and runs them: `add_special=false`, `parse_special=false`.
//!
//! The files come from `scripts/models/vocab` (into $CORRAL_VOCAB_DIR, else
//! ~/.cache/corral/vocab). Without them each test prints "skipped: run
//! scripts/models/vocab" and passes, unless CORRAL_REQUIRE_VOCAB=1 (CI sets it).
//!
//! gpt-oss's vocabulary (o200k_harmony, `gpt-4o` pre-tokenizer) has no llama.cpp test file:
//! `scripts/models/vocab-o200k` builds it into the same dir from OpenAI's o200k_base ranks
//! (npm `js-tiktoken`) and `scripts/models/oracle/o200k` captured llama.cpp's ids for 60
//! strings, with and without special-token parsing, into
//! `fixtures/tokenize-o200k-harmony.json` (`o200k_harmony` below).
//!
//! llama.cpp's test data not covered, deliberately:
//! - `bert-bge` (WordPiece, `bert`) and `nomic-bert-moe` (Unigram, `t5`): embedding-model
//!   vocabulary types we do not load.
//! - `gemma-4` (`gemma4`: BPE on raw UTF-8 with `▁` for spaces): a vocabulary type we do
//!   not load yet.
//! - `aquila`, `baichuan`, `gpt-neox`: llama.cpp ships no `.inp`/`.out` for them.
//! - `deepseek-llm`: its pre-tokenizer is not supported yet (onig refuses llama.cpp's
//!   letter-range regex: "empty range in char class").

use std::path::{Path, PathBuf};

use corral_engine::gguf::Gguf;
use corral_engine::tokenizer::Tokenizer;

const SEPARATOR: &str = "\n__ggml_vocab_test__\n";

fn vocab_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os("CORRAL_VOCAB_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/corral/vocab"),
    };
    if dir.join("ggml-vocab-llama-bpe.gguf").is_file() {
        return Some(dir);
    }
    let required = std::env::var("CORRAL_REQUIRE_VOCAB").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "{} has no llama.cpp vocab files (CORRAL_REQUIRE_VOCAB=1): run scripts/models/vocab",
        dir.display()
    );
    eprintln!("skipped: run scripts/models/vocab");
    None
}

/// The cases of one vocabulary, as test-tokenizer-0 reads them.
fn cases(gguf: &Path) -> Vec<(String, Vec<u32>)> {
    let read = |ext: &str| {
        let p = PathBuf::from(format!("{}.{ext}", gguf.display()));
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let inp = read("inp");
    let out = read("out");
    // test-tokenizer-0 splits at each separator; a trailing one ends the list.
    let mut inputs: Vec<&str> = inp.split(SEPARATOR).collect();
    if inputs.last() == Some(&"") {
        inputs.pop();
    }
    let outputs: Vec<&str> = out.lines().collect();
    assert_eq!(inputs.len(), outputs.len(), "{}: .inp and .out differ in case count", gguf.display());
    inputs
        .into_iter()
        .zip(outputs)
        .map(|(i, o)| {
            let ids = o.split_whitespace().map(|t| t.parse().expect("an id")).collect();
            (i.to_owned(), ids)
        })
        .collect()
}

fn check(name: &str) {
    let Some(dir) = vocab_dir() else { return };
    let path = dir.join(format!("ggml-vocab-{name}.gguf"));
    let g = Gguf::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let tok = Tokenizer::from_gguf(&g).unwrap_or_else(|e| panic!("{name}: {e}"));
    let cases = cases(&path);
    let mut failures = Vec::new();
    for (text, want) in &cases {
        let got = tok.encode_unparsed(text, false).expect("encodes");
        if &got != want {
            failures.push(format!("{text:?}\n   llama.cpp {want:?}\n   corral    {got:?}"));
        }
    }
    assert!(cases.len() >= 20, "{name}: only {} cases", cases.len());
    assert!(
        failures.is_empty(),
        "{name}: {} of {} strings differ (first shown):\n{}",
        failures.len(),
        cases.len(),
        failures.iter().take(5).cloned().collect::<Vec<_>>().join("\n")
    );
    // Byte-level BPE pieces are the input's bytes, so decoding gives the input back.
    if g.str("tokenizer.ggml.model").ok() == Some("gpt2") {
        for (text, want) in &cases {
            assert_eq!(&tok.decode(want), text, "{name}: llama.cpp's ids do not decode back");
        }
    }
}

macro_rules! vocab_tests {
    ($($test:ident => $name:literal,)*) => {
        $(#[test]
        fn $test() {
            check($name);
        })*
    };
}

vocab_tests! {
    llama_bpe => "llama-bpe",
    qwen2 => "qwen2",
    qwen35 => "qwen35",
    deepseek_coder => "deepseek-coder",
    command_r => "command-r",
    falcon => "falcon",
    gpt_2 => "gpt-2",
    mpt => "mpt",
    refact => "refact",
    starcoder => "starcoder",
    llama_spm => "llama-spm",
    phi_3 => "phi-3",
}

#[test]
fn an_unknown_pre_tokenizer_is_a_load_error_naming_it() {
    let Some(dir) = vocab_dir() else { return };
    // Llama 3's vocab with its `tokenizer.ggml.pre` value rewritten in place (same length).
    let mut bytes = std::fs::read(dir.join("ggml-vocab-llama-bpe.gguf")).expect("reads");
    let key = b"tokenizer.ggml.pre";
    let at = bytes.windows(key.len()).position(|w| w == key).expect("has the key") + key.len();
    let value = at + 4 + 8; // type (string), length
    assert_eq!(&bytes[value..value + 9], b"llama-bpe");
    bytes[value..value + 9].copy_from_slice(b"llama-zzz");
    let path = std::env::temp_dir().join(format!("corral-vocab-unknown-pre-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).expect("writes");
    let g = Gguf::open(&path).expect("opens");
    let err = Tokenizer::from_gguf(&g).err().expect("refused").to_string();
    let _ = std::fs::remove_file(&path);
    assert!(err.contains("\"llama-zzz\""), "{err}");
    for known in ["llama-bpe", "llama3", "llama-v3", "qwen2", "qwen35", "deepseek-v3", "tekken", "gpt-4o", "phi-2"] {
        assert!(err.contains(known), "{known} missing from the message: {err}");
    }
}

/// gpt-oss's vocabulary against llama.cpp's ids for it (module doc), both ways of reading
/// special tokens; llama.cpp's load-time changes to the harmony tokens included.
#[test]
fn o200k_harmony() {
    let Some(dir) = vocab_dir() else { return };
    let path = dir.join("ggml-vocab-o200k-harmony.gguf");
    if !path.is_file() {
        let required = std::env::var("CORRAL_REQUIRE_VOCAB").is_ok_and(|v| v == "1");
        assert!(!required, "{} is missing (CORRAL_REQUIRE_VOCAB=1): run scripts/models/vocab-o200k", path.display());
        eprintln!("skipped: run scripts/models/vocab-o200k");
        return;
    }
    let g = Gguf::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let tok = Tokenizer::from_gguf(&g).expect("loads");
    assert_eq!(tok.vocab_size(), 201_088);
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tokenize-o200k-harmony.json");
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture).expect("reads")).unwrap();
    let cases = doc["cases"].as_array().expect("cases");
    assert!(cases.len() >= 100, "only {} cases", cases.len());
    let mut failures = Vec::new();
    for c in cases {
        let text = c["text"].as_str().expect("text");
        let want: Vec<u32> = c["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let parse = c["parse_special"].as_bool().unwrap();
        let got = if parse { tok.encode(text, false) } else { tok.encode_unparsed(text, false) }.expect("encodes");
        if got != want {
            failures.push(format!("{text:?} (parse_special {parse})\n   llama.cpp {want:?}\n   corral    {got:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ (first shown):\n{}",
        failures.len(),
        cases.len(),
        failures.iter().take(5).cloned().collect::<Vec<_>>().join("\n")
    );
    // The message-structure tokens render as text; <|end|> no longer ends generation,
    // <|return|> and <|call|> do.
    let id = |t: &str| tok.token_id(t).unwrap_or_else(|| panic!("{t} in the vocabulary"));
    assert_eq!(tok.decode(&[id("<|channel|>"), id("<|end|>")]), "<|channel|><|end|>");
    assert!(tok.decode(&[id("<|return|>")]).is_empty());
    assert!(!tok.is_eog(id("<|end|>")) && tok.is_eog(id("<|return|>")) && tok.is_eog(id("<|call|>")));
}
