//! Our tokenizer against llama.cpp's ids (fixtures from scripts/models/oracle/run), both models.

mod common;

use common::*;
use corral_engine::gguf::Gguf;
use corral_engine::tokenizer::Tokenizer;

fn check(model: &str, fixture_name: &str) {
    let g = Gguf::open(&model_path(model)).expect("model opens");
    let tok = Tokenizer::from_gguf(&g).expect("tokenizer builds");
    let fx = fixture(fixture_name);
    let mut failures = Vec::new();
    let cases = fx["tokenize"].as_array().unwrap().iter().chain(fx["chat"].as_array().unwrap());
    let mut n = 0;
    for case in cases {
        let text = case.get("text").or(case.get("rendered")).unwrap().as_str().unwrap();
        let want = ids(&case["ids"]);
        let got = tok.encode(text, true).unwrap();
        n += 1;
        if got != want {
            failures.push(format!("{text:?}\n   llama.cpp {want:?}\n   corral    {got:?}"));
        }
    }
    assert!(n >= 60, "fixture has only {n} strings");
    assert!(failures.is_empty(), "{model}: {} of {n} strings differ:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn smollm2_ids_match_llama_cpp() {
    check(SMOLLM, "oracle-smollm2.json");
}

#[test]
fn gemma3_ids_match_llama_cpp() {
    check(GEMMA, "oracle-gemma3.json");
}

#[test]
fn pieces_round_trip_plain_text() {
    for model in [SMOLLM, GEMMA] {
        let g = Gguf::open(&model_path(model)).unwrap();
        let tok = Tokenizer::from_gguf(&g).unwrap();
        for text in ["Hello, world!", "café 你好 😀\n\n  x", "def f(x):\n    return x"] {
            let ids = tok.encode(text, false).unwrap();
            assert_eq!(tok.decode(&ids), text, "{model}");
        }
    }
}
