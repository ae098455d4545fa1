//! The families of issue 33 (Llama 3.x, qwen2, qwen3, qwen3moe, mistral3, phi3), gpt-oss
//! (issue 34) and the Qwen3.5 hybrids (qwen35, qwen35moe: issue 36) against llama.cpp, on
//! the noise models `scripts/models/make-gguf` writes (tiny shapes, the families' real
//! vocabularies): corral's CPU greedy tokens with the default batch-invariant numerics
//! must equal llama.cpp's serial path (`llama-server -ub 1`, fixtures from
//! `scripts/models/oracle/serial`), and a batched
//! greedy decode must equal them too.
//! (Decoded on llama.cpp's tokens: where all agree, that is the free-running decode.)
//!
//! The GGUFs are generated, not committed: `<preset>-<type>.gguf` in
//! `$CORRAL_GENERATED_DIR` (default `<models dir>/generated`), written by
//! `scripts/models/make-gguf DIR/<preset>-<type>.gguf --preset <preset> --type <type>`.
//! A missing file skips the test (it prints `skipped:`) unless
//! `CORRAL_REQUIRE_GENERATED=1`, as CI sets.

mod common;

use std::path::PathBuf;

use common::*;
use corral_engine::gguf::Gguf;
use corral_engine::model::{Logits, Model, Row};
use sha2::{Digest, Sha256};

struct Case {
    name: String,
    prompt: Vec<u32>,
    tokens: Vec<u32>,
    margins: Vec<f64>,
}

fn generated_dir() -> PathBuf {
    match std::env::var_os("CORRAL_GENERATED_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => models_dir().join("generated"),
    }
}

/// The types make-gguf has llama.cpp's llama-quantize make from its f16 file.
const QUANTIZED: [&str; 9] = ["q4_k_m", "q5_k_m", "q3_k_m", "q2_k", "q5_1", "iq4_nl", "iq4_xs", "bf16", "q4_k_xl"];

/// The model, or `None` (after saying so) when it has not been generated.
fn load(preset: &str, kind: &str) -> Option<Model> {
    let path = generated_dir().join(format!("{preset}-{kind}.gguf"));
    if !path.is_file() {
        let fix = format!("scripts/models/make-gguf {} --preset {preset} --type {kind}", path.display());
        if std::env::var("CORRAL_REQUIRE_GENERATED").as_deref() == Ok("1") {
            panic!("{} is missing: run {fix}", path.display());
        }
        eprintln!("skipped: {} is missing (run {fix})", path.display());
        return None;
    }
    let gguf = Gguf::open(&path).unwrap();
    // llama-quantize's choices rest on float arithmetic, so another build of it (another
    // compiler, optimization level or ISA) may write other bytes than the fixture's file.
    if QUANTIZED.contains(&kind) {
        let want = fixture(&format!("serial-{preset}-{kind}.json"))["sha256"].as_str().unwrap().to_owned();
        let got: String = Sha256::digest(gguf.bytes()).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            got,
            want,
            "{}: not the file llama.cpp's fixture was made from (another llama-quantize build?)",
            path.display()
        );
    }
    let model = Model::load(&gguf).unwrap();
    // The oracle's context (`-c 4096`): phi3's LongRoPE factors depend on it.
    model.set_context(4096);
    Some(model)
}

fn cases(preset: &str, kind: &str) -> Vec<Case> {
    let f = fixture(&format!("serial-{preset}-{kind}.json"));
    f["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().unwrap().to_owned(),
            prompt: ids(&c["prompt_ids"]),
            tokens: ids(&c["tokens"]),
            margins: c["margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap_or(f64::INFINITY)).collect(),
        })
        .collect()
}

/// How far a top-2 margin may be from llama.cpp's. Its log-probabilities pass through an
/// f32 softmax and log, so equal logits give margins equal to about 1e-6 (Q8_0). Q4_0 and
/// F16 matmuls run on candle's kernels, not llama.cpp's arithmetic (llama.cpp rounds the
/// activations to f16 for an F16 weight), and drift up to ~0.01 and ~1e-3. The models
/// llama-quantize makes agree to ~1e-6 on most prompts but drift on some, from one decode
/// step on, by up to 7e-3 (BF16 1.5e-3) with every token equal: every type does, and so
/// does a file of Q8_0 alone made by llama-quantize from the same f16 weights (make-gguf's
/// own Q8_0 files do not), so the cause is not in the kernels; it is not found yet
/// (docs/engine.md, "Models"). The qwen3moe fixtures come from an AVX2-only host, whose
/// llama.cpp sums some lanes in other orders than the AVX-512 build corral reproduces:
/// there the dense qwen3 Q8_0 file's margins move by up to 4.4e-3 on two prompts ("story",
/// "long") against its AVX-512 fixture, and qwen3moe's Q8_0 ones by 3.7e-3 on the same two
/// (both ~1e-6 on the others), so qwen3moe's Q8_0 is held to the quantized types' 0.01
/// until its fixtures are captured on an AVX-512 host.
fn margin_noise(preset: &str, kind: &str) -> f64 {
    match kind {
        "q8_0" if avx2_fixture(preset) => 0.01,
        "q4_0" => 0.05,
        "f16" | "bf16" => 5e-3,
        k if QUANTIZED.contains(&k) => 0.01,
        _ => 1e-4,
    }
}

/// The fixtures captured on an AVX2-only host (see `margin_noise`), whose lane orders move
/// llama.cpp's margins by up to a few 1e-3 from the AVX-512 arithmetic corral reproduces.
fn avx2_fixture(preset: &str) -> bool {
    matches!(preset, "qwen3moe" | "gpt-oss" | "qwen35" | "qwen35moe")
}

/// Our argmax and top-2 logit margin at each of llama.cpp's steps after `prompt`, one
/// sequence alone, fed llama.cpp's own tokens (where every token agrees, exactly the
/// greedy decode; where one does not, the steps after it still compare like with like).
fn forced(model: &Model, prompt: &[u32], tokens: &[u32]) -> (Vec<u32>, Vec<f64>) {
    let mut cache = model.new_cache();
    let mut logits = model.forward(prompt, &mut cache, Logits::Last).unwrap();
    let (mut out, mut margins) = (Vec::with_capacity(tokens.len()), Vec::with_capacity(tokens.len()));
    for (i, &t) in tokens.iter().enumerate() {
        out.push(argmax(&logits));
        margins.push(margin(&logits));
        if i + 1 < tokens.len() {
            logits = model.forward(&[t], &mut cache, Logits::Last).unwrap();
        }
    }
    (out, margins)
}

/// Every case's greedy tokens equal llama.cpp's serial run, and decoding all the cases
/// in one batch gives each case's tokens alone again. Against an AVX2 fixture a token
/// llama.cpp itself picked by a top-2 margin within the type's drift (`margin_noise`) is
/// a near-tie that drift may flip: it may differ (and is reported), the run going on with
/// llama.cpp's token.
fn serial_and_batched_equal_llama_cpp(preset: &str, kind: &str) {
    let Some(model) = load(preset, kind) else { return };
    let all = cases(preset, kind);
    assert!(all.len() >= 4 && all.iter().all(|c| !c.tokens.is_empty()));
    let noise = margin_noise(preset, kind);
    let tie = if avx2_fixture(preset) { noise } else { 0.0 };
    let mut failures = Vec::new();
    let mut alone = Vec::with_capacity(all.len());
    for c in &all {
        let (ours, margins) = forced(&model, &c.prompt, &c.tokens);
        // Equal tokens could hide a difference too small to flip an argmax (a factor
        // not applied, say): the margins, llama.cpp's from its log-probabilities, agree
        // to float noise as well (where llama-server gave one: null, read as infinite,
        // for a token that ends inside a UTF-8 character).
        let (at, drift) = margins
            .iter()
            .zip(&c.margins)
            .map(|(a, b)| if b.is_finite() { (a - b).abs() } else { 0.0 })
            .enumerate()
            .fold((0, 0.0), |best, (i, d)| if d > best.1 { (i, d) } else { best });
        let differ: Vec<usize> = (0..ours.len()).filter(|&i| ours[i] != c.tokens[i]).collect();
        let ties: Vec<String> =
            differ.iter().map(|&i| format!("token {i}, llama.cpp's margin {:.1e}", c.margins[i])).collect();
        match differ.iter().find(|&&i| c.margins[i] > tie) {
            None if drift > noise => failures.push(format!(
                "{preset}-{kind} {}: the tokens match but the top-2 margin at token {at} is {} where llama.cpp's is {}",
                c.name, margins[at], c.margins[at]
            )),
            None => eprintln!(
                "{preset}-{kind} {}: {} greedy tokens match llama.cpp's serial run (margins within {drift:.1e}){}",
                c.name,
                ours.len() - differ.len(),
                if ties.is_empty() { String::new() } else { format!("; near-ties flipped: {}", ties.join("; ")) }
            ),
            Some(&i) => failures.push(format!(
                "{preset}-{kind} {}: token {i} is {} where llama.cpp's serial run has {} (its top-2 margin there {})",
                c.name, ours[i], c.tokens[i], c.margins[i]
            )),
        }
        alone.push(ours);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Batched: every case prefilled and decoded together, one pass per step, on the same
    // tokens as alone: each row's argmaxes are its own alone.
    let mut caches: Vec<_> = all.iter().map(|_| model.new_cache()).collect();
    let mut rows: Vec<Row<'_>> = all
        .iter()
        .zip(caches.iter_mut())
        .map(|(c, cache)| Row { tokens: &c.prompt, cache, logits: Logits::Last })
        .collect();
    let mut logits = model.forward_batch(&mut rows).unwrap();
    drop(rows);
    let steps = all.iter().map(|c| c.tokens.len()).max().unwrap_or(0);
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); all.len()];
    for step in 0..steps {
        for ((g, l), c) in got.iter_mut().zip(&logits).zip(&all) {
            if g.len() < c.tokens.len() {
                g.push(argmax(l));
            }
        }
        let next: Vec<[u32; 1]> = all.iter().map(|c| [c.tokens[step.min(c.tokens.len() - 1)]]).collect();
        let mut rows: Vec<Row<'_>> = next
            .iter()
            .zip(caches.iter_mut())
            .map(|(t, cache)| Row { tokens: t, cache, logits: Logits::Last })
            .collect();
        logits = model.forward_batch(&mut rows).unwrap();
    }
    for ((g, a), c) in got.iter().zip(&alone).zip(&all) {
        assert_eq!(g, a, "{preset}-{kind} {}: batched greedy differs from the same case alone", c.name);
    }
}

#[test]
fn llama3_q4_0_equals_llama_cpp_serial() {
    serial_and_batched_equal_llama_cpp("llama3", "q4_0");
}

#[test]
fn llama3_q8_0_equals_llama_cpp_serial() {
    serial_and_batched_equal_llama_cpp("llama3", "q8_0");
}

// qwen2-q4_0 is not held to exactness yet: Q4_0 matmuls run on candle's kernel, not a
// llama.cpp-faithful one, and one prompt ("code") parts from llama.cpp's serial run at
// token 8, where llama.cpp's top-2 margin is 0.0024 (the Q8_0 file, same graph with biases
// and YaRN, matches on every prompt). docs/engine.md, "Models".

#[test]
fn qwen2_q8_0_equals_llama_cpp_serial() {
    serial_and_batched_equal_llama_cpp("qwen2", "q8_0");
}

#[test]
fn qwen3_q4_0_equals_llama_cpp_serial() {
    serial_and_batched_equal_llama_cpp("qwen3", "q4_0");
}

#[test]
fn qwen3_q8_0_equals_llama_cpp_serial() {
    serial_and_batched_equal_llama_cpp("qwen3", "q8_0");
}

// qwen3moe: qwen3's attention with a mixture of experts in every layer (16 experts, 4 used
// per token: an f32 router, softmax, top-k in ggml's order, renormalized weights).

#[test]
fn qwen3moe_q4_0_equals_llama_cpp_serial() {
    serial_and_batched_equal_llama_cpp("qwen3moe", "q4_0");
}

#[test]
fn qwen3moe_q8_0_equals_llama_cpp_serial() {
    serial_and_batched_equal_llama_cpp("qwen3moe", "q8_0");
}

// gpt-oss: Q/K/V and output biases, a sink logit per head, a sliding window of 16 on even
// layers (every prompt but "hello" crosses it), YaRN 32, and 8 MXFP4 experts with biases of
// which 4 are used (top-k logits, then their softmax; SwiGLU-OAI). Its fixture comes from
// an AVX2-only host, as qwen3moe's: held to the same 0.01. No F16 case: with gpt-oss's
// 201,088-token output matrix, candle's F16 matmul (f32 activations where llama.cpp rounds
// them to f16) moves one "code" margin by 0.016, past F16's 5e-3 bound.

#[test]
fn gpt_oss_q8_0_equals_llama_cpp_serial() {
    serial_and_batched_equal_llama_cpp("gpt-oss", "q8_0");
}

#[test]
fn gpt_oss_q4_0_equals_llama_cpp_serial() {
    serial_and_batched_equal_llama_cpp("gpt-oss", "q4_0");
}

// mistral3: YaRN with the file's β values and log multiplier, and the attention
// temperature, which the preset's 16-token original context turns on within the prompts.

// qwen35: the hybrid of Gated DeltaNet layers (a convolution and a delta-rule state per
// sequence) and gated full attention (every 4th layer), 4 layers; fixtures from an
// AVX2-only host, held as qwen3moe's and gpt-oss's. The batched decode checks that each
// row's recurrent state is its own.
#[test]
fn qwen35_q8_0_equals_llama_cpp_serial() {
    serial_and_batched_equal_llama_cpp("qwen35", "q8_0");
}

#[test]
fn qwen35_q4_0_equals_llama_cpp_serial() {
    serial_and_batched_equal_llama_cpp("qwen35", "q4_0");
}

// qwen35moe: qwen35's hybrid layers with a mixture of experts in place of every MLP (16
// experts, 4 used: qwen3moe's routing) plus a shared expert scaled by its own sigmoid gate,
// and a multi-token-prediction block after the layers that both engines leave unread;
// fixtures from an AVX2-only host, held as qwen35's.
#[test]
fn qwen35moe_q8_0_equals_llama_cpp_serial() {
    serial_and_batched_equal_llama_cpp("qwen35moe", "q8_0");
}

#[test]
fn qwen35moe_q4_0_equals_llama_cpp_serial() {
    serial_and_batched_equal_llama_cpp("qwen35moe", "q4_0");
}

#[test]
fn mistral3_q4_0_equals_llama_cpp_serial() {
    serial_and_batched_equal_llama_cpp("mistral3", "q4_0");
}

#[test]
fn mistral3_q8_0_equals_llama_cpp_serial() {
    serial_and_batched_equal_llama_cpp("mistral3", "q8_0");
}

// phi3: fused Q|K|V and gate|up split by rows, LongRoPE's long factors (the preset's
// original context is 2,048, the oracle's 4,096) with the file's attention factor, and the
// queries scaled before attention.

#[test]
fn phi3_q4_0_equals_llama_cpp_serial() {
    serial_and_batched_equal_llama_cpp("phi3", "q4_0");
}

#[test]
fn phi3_q8_0_equals_llama_cpp_serial() {
    serial_and_batched_equal_llama_cpp("phi3", "q8_0");
}

// F16 weights (make-gguf `--type f16`): candle's F16 matmul, not llama.cpp's arithmetic
// yet, so held to llama.cpp's tokens and to its margins within 5e-3 (measured: 6e-4).

#[test]
fn llama3_f16_equals_llama_cpp_serial() {
    serial_and_batched_equal_llama_cpp("llama3", "f16");
}

#[test]
fn qwen3_f16_equals_llama_cpp_serial() {
    serial_and_batched_equal_llama_cpp("qwen3", "f16");
}

#[test]
fn phi3_f16_equals_llama_cpp_serial() {
    serial_and_batched_equal_llama_cpp("phi3", "f16");
}

// The types of the files people download, made by llama.cpp's llama-quantize from
// make-gguf's f16 file (k-quant mixes as llama-quantize picks them for these shapes, and
// `q4_k_xl`, an Unsloth-style mix), every family at every type. In a module of their own:
// CI makes these models once its quick llama.cpp build is done and runs them last
// (`quantized::`; q4_k_m in every family, the other types in llama3 and qwen3). Not held to llama.cpp's tokens yet: phi3 at q3_k_m (token 17 of
// "story", where llama.cpp's top-2 margin is 5.5e-4) and at q5_1 (token 13 of "story",
// margin 2.6e-3; token 9 of "long", margin 6.0e-4): near-ties that `margin_noise`'s
// drift flips.
mod quantized {
    macro_rules! equal_llama_cpp {
        ($($name:ident: $preset:literal $kind:literal;)*) => {$(
            #[test]
            fn $name() {
                super::serial_and_batched_equal_llama_cpp($preset, $kind);
            }
        )*};
    }

    equal_llama_cpp! {
        llama3_q4_k_m: "llama3" "q4_k_m";
        qwen2_q4_k_m: "qwen2" "q4_k_m";
        qwen3_q4_k_m: "qwen3" "q4_k_m";
        mistral3_q4_k_m: "mistral3" "q4_k_m";
        phi3_q4_k_m: "phi3" "q4_k_m";
        qwen3moe_q4_k_m: "qwen3moe" "q4_k_m";
        llama3_q5_k_m: "llama3" "q5_k_m";
        qwen2_q5_k_m: "qwen2" "q5_k_m";
        qwen3_q5_k_m: "qwen3" "q5_k_m";
        mistral3_q5_k_m: "mistral3" "q5_k_m";
        phi3_q5_k_m: "phi3" "q5_k_m";
        llama3_q3_k_m: "llama3" "q3_k_m";
        qwen2_q3_k_m: "qwen2" "q3_k_m";
        qwen3_q3_k_m: "qwen3" "q3_k_m";
        mistral3_q3_k_m: "mistral3" "q3_k_m";
        llama3_q2_k: "llama3" "q2_k";
        qwen2_q2_k: "qwen2" "q2_k";
        qwen3_q2_k: "qwen3" "q2_k";
        mistral3_q2_k: "mistral3" "q2_k";
        phi3_q2_k: "phi3" "q2_k";
        llama3_q5_1: "llama3" "q5_1";
        qwen2_q5_1: "qwen2" "q5_1";
        qwen3_q5_1: "qwen3" "q5_1";
        mistral3_q5_1: "mistral3" "q5_1";
        llama3_q4_k_xl: "llama3" "q4_k_xl";
        qwen2_q4_k_xl: "qwen2" "q4_k_xl";
        qwen3_q4_k_xl: "qwen3" "q4_k_xl";
        mistral3_q4_k_xl: "mistral3" "q4_k_xl";
        phi3_q4_k_xl: "phi3" "q4_k_xl";
        llama3_iq4_nl: "llama3" "iq4_nl";
        qwen2_iq4_nl: "qwen2" "iq4_nl";
        qwen3_iq4_nl: "qwen3" "iq4_nl";
        mistral3_iq4_nl: "mistral3" "iq4_nl";
        phi3_iq4_nl: "phi3" "iq4_nl";
        llama3_iq4_xs: "llama3" "iq4_xs";
        qwen2_iq4_xs: "qwen2" "iq4_xs";
        qwen3_iq4_xs: "qwen3" "iq4_xs";
        mistral3_iq4_xs: "mistral3" "iq4_xs";
        phi3_iq4_xs: "phi3" "iq4_xs";
        llama3_bf16: "llama3" "bf16";
        qwen2_bf16: "qwen2" "bf16";
        qwen3_bf16: "qwen3" "bf16";
        mistral3_bf16: "mistral3" "bf16";
        phi3_bf16: "phi3" "bf16";
    }
}
