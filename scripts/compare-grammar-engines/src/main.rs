//! llguidance vs outlines-core on corral's two test models: which of the test schemas
//! each compiles, how long compiling takes, and the per-step cost of a mask, for the
//! same per-token byte strings. Prints a Markdown table.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use corral_engine::gguf::Gguf;
use corral_engine::grammar::{Constraint, Grammars, TopLevelGrammar};
use corral_engine::tokenizer::{TokenKind, Tokenizer};
use outlines_core::prelude::{Index, Vocabulary};
use serde_json::Value;

const MODELS: [&str; 2] = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"];

/// A JSON instance of the step-cost schema, written the way both engines allow it.
const INSTANCE: &str = r#"[{"name": "Alice", "age": 31}, {"name": "Bob", "age": 42}, {"name": "Carol", "age": 27}, {"name": "Dave", "age": 55}]"#;

fn step_schema() -> Value {
    serde_json::json!({"type": "array", "minItems": 4, "maxItems": 4, "items": {"type": "object",
        "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["name", "age"], "additionalProperties": false}})
}

fn outlines_vocab(tok: &Tokenizer) -> Vocabulary {
    let eos = tok.eos().unwrap_or(0);
    let mut v = Vocabulary::new(eos);
    for id in 0..tok.vocab_size() as u32 {
        let special = matches!(tok.kind(id), Some(TokenKind::Control | TokenKind::Unused | TokenKind::Unknown));
        if !special && id != eos && !tok.piece(id).is_empty() {
            let _ = v.try_insert(tok.piece(id).to_vec(), id);
        }
    }
    v
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let dir = std::env::args().nth(1).map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache/corral/models")
    });
    let schemas: Vec<Value> =
        serde_json::from_str(include_str!("../../../tests/fixtures/schemas.json")).expect("schemas.json");
    println!("| model (vocab) | engine | schemas compiled | compile ms (median; max) | one-time setup ms | per-step mask µs |");
    println!("|---|---|---:|---:|---:|---:|");
    for file in MODELS {
        let g = Gguf::open(&dir.join(file)).expect("run scripts/fetch-models first");
        let tok = Tokenizer::from_gguf(&g).expect("tokenizer");
        let label = format!("{} ({})", file.split('-').next().unwrap_or(file), tok.vocab_size());
        let ids = tok.encode(INSTANCE, false).expect("encode");

        // llguidance, through corral's own wrapper.
        let t = Instant::now();
        let grammars = Grammars::new(&tok);
        let warm = grammars.compile(TopLevelGrammar::from_grammar(Constraint::JsonObject.grammar("w")), true);
        assert!(warm.is_ok());
        let setup = t.elapsed();
        let (mut ok, mut times) = (0, Vec::new());
        for s in &schemas {
            let t = Instant::now();
            let c = Constraint::JsonSchema(s["schema"].clone());
            if grammars.compile(TopLevelGrammar::from_grammar(c.grammar("answer")), true).is_ok() {
                ok += 1;
                times.push(t.elapsed());
            }
        }
        let mut g = grammars
            .compile(TopLevelGrammar::from_grammar(Constraint::JsonSchema(step_schema()).grammar("a")), true)
            .expect("step schema");
        let mut logits = vec![0.0f32; tok.vocab_size()];
        let t = Instant::now();
        for &id in &ids {
            g.mask(&mut logits).expect("mask");
            assert!(logits[id as usize].is_finite(), "llguidance refuses token {id}");
            logits.fill(0.0);
            g.accept(id).expect("accept");
        }
        let step = t.elapsed() / ids.len() as u32;
        row(&label, "llguidance", ok, schemas.len(), &mut times, setup, step);

        // outlines-core: schema -> regex -> index over the vocabulary.
        let t = Instant::now();
        let vocab = outlines_vocab(&tok);
        let setup = t.elapsed();
        let (mut ok, mut times) = (0, Vec::new());
        for s in &schemas {
            let t = Instant::now();
            let Ok(rx) = outlines_core::json_schema::regex_from_value(&s["schema"], Some(" ?"), Some(4)) else { continue };
            if Index::new(&rx, &vocab).is_ok() {
                ok += 1;
                times.push(t.elapsed());
            }
        }
        let rx = outlines_core::json_schema::regex_from_value(&step_schema(), Some(" ?"), None).expect("regex");
        let index = Index::new(&rx, &vocab).expect("index");
        let mut state = index.initial_state();
        let t = Instant::now();
        for &id in &ids {
            let allowed = index.allowed_tokens(&state).expect("allowed");
            logits.fill(f32::NEG_INFINITY);
            for a in allowed {
                logits[a as usize] = 0.0;
            }
            assert!(logits[id as usize].is_finite(), "outlines refuses token {id}");
            state = index.next_state(&state, &id).expect("next");
        }
        let step = t.elapsed() / ids.len() as u32;
        row(&label, "outlines-core", ok, schemas.len(), &mut times, setup, step);
    }
}

fn row(label: &str, engine: &str, ok: usize, n: usize, times: &mut [Duration], setup: Duration, step: Duration) {
    times.sort();
    let median = times.get(times.len() / 2).map_or(f64::NAN, |d| ms(*d));
    let max = times.last().map_or(f64::NAN, |d| ms(*d));
    println!(
        "| {label} | {engine} | {ok}/{n} | {median:.1}; {max:.0} | {:.0} | {:.0} |",
        ms(setup),
        step.as_secs_f64() * 1e6
    );
}
