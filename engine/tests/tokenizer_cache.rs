//! The tokenizer built from the merges cache is the tokenizer built from scratch: with a
//! cache directory Gemma's tokenizer is built twice (the first build computes and stores
//! the ranked merges, the second reads them), and both give llama.cpp's ids on every
//! oracle string, as the uncached one does (`tokenizer_parity.rs`). A damaged cache file
//! is a miss, not a different tokenizer.

mod common;

use common::*;
use corral_engine::gguf::Gguf;
use corral_engine::tokenizer::Tokenizer;

fn oracle_mismatches(tok: &Tokenizer) -> usize {
    let fx = fixture("oracle-gemma3.json");
    let cases = fx["tokenize"].as_array().unwrap().iter().chain(fx["chat"].as_array().unwrap());
    cases
        .filter(|case| {
            let text = case.get("text").or(case.get("rendered")).unwrap().as_str().unwrap();
            tok.encode(text, true).unwrap() != ids(&case["ids"])
        })
        .count()
}

#[test]
fn gemma_tokenizer_from_the_merges_cache_matches_llama_cpp() {
    let dir = std::env::temp_dir().join(format!("corral-tokcache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let g = Gguf::open(&model_path(GEMMA)).unwrap();
    let first = Tokenizer::from_gguf_cached(&g, Some(&dir)).unwrap();
    let files: Vec<_> = std::fs::read_dir(dir.join("tokenizers")).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let second = Tokenizer::from_gguf_cached(&g, Some(&dir)).unwrap();
    assert_eq!(oracle_mismatches(&first), 0);
    assert_eq!(oracle_mismatches(&second), 0);
    assert_eq!(first.fingerprint(), second.fingerprint());
    // A damaged file: a miss, rebuilt and rewritten.
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&files[0], &bytes).unwrap();
    let third = Tokenizer::from_gguf_cached(&g, Some(&dir)).unwrap();
    assert_eq!(oracle_mismatches(&third), 0);
    assert_ne!(std::fs::read(&files[0]).unwrap(), bytes, "the bad file was replaced");
    std::fs::remove_dir_all(&dir).unwrap();
}
