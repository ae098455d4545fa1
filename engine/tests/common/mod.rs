//! Shared helpers for the engine's integration tests: where the real models and the
//! oracle fixtures live. A missing model is a test failure with the fix in the message.

#![allow(dead_code)]

use std::path::PathBuf;

pub const SMOLLM: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const GEMMA: &str = "gemma-3-270m-q4_k_m.gguf";

pub fn models_dir() -> PathBuf {
    match std::env::var_os("CORRAL_MODELS_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/corral/models"),
    }
}

pub fn model_path(file: &str) -> PathBuf {
    let p = models_dir().join(file);
    assert!(p.is_file(), "{} is missing: run scripts/models/fetch first", p.display());
    p
}

pub fn fixture(name: &str) -> serde_json::Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).expect("fixture is JSON")
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("id array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

/// The first index of the largest logit (the greedy token).
pub fn argmax(row: &[f32]) -> u32 {
    (0..row.len()).fold(0, |best, i| if row[i] > row[best] { i } else { best }) as u32
}

/// The top logit minus the runner-up.
pub fn margin(row: &[f32]) -> f64 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in row {
        if v > a {
            (a, b) = (v, a);
        } else if v > b {
            b = v;
        }
    }
    f64::from(a - b)
}
