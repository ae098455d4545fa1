//! Speculative decoding stands on one property: a row of several tokens (`[last token,
//! draft…]`, every position's logits) gives at each position exactly the logits that
//! one-token decode steps give there — and again when it shares its pass with other
//! rows. Then verifying a draft and keeping its agreeing prefix is decode, bit for bit.
//! On top of that, a sequence with `speculate: ngram` must give the same tokens as
//! `generate` without, greedy and seeded-sampled, on edit-style and free prompts, alone
//! and eight sequences batched, and an edit must accept drafts.

mod common;

use common::*;
use corral_engine::gguf::Gguf;
use corral_engine::kv::SeqCache;
use corral_engine::model::{Logits, Model, Row};

fn load(file: &str) -> Model {
    Model::load(&Gguf::open(&model_path(file)).unwrap()).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Decode `n` greedy tokens one step at a time from `prompt`; returns the tokens and
/// each step's logits (the first from the prompt's last position).
fn decode_steps(model: &Model, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut c = model.new_cache();
    let mut logits = model.forward(prompt, &mut c, Logits::Last).unwrap();
    let (mut toks, mut all) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let id = argmax(&logits);
        all.push(logits);
        toks.push(id);
        logits = model.forward(&[id], &mut c, Logits::Last).unwrap();
    }
    all.push(logits);
    (toks, all)
}

fn verify_rows_equal_decode_steps(file: &str, fixture_name: &str) {
    let model = load(file);
    let f = fixture(fixture_name);
    let prompts: Vec<Vec<u32>> =
        f["greedy"].as_array().unwrap().iter().take(3).map(|g| ids(&g["prompt_ids"])).collect();
    let n = 9;
    let steps: Vec<_> = prompts.iter().map(|p| decode_steps(&model, p, n)).collect();
    // Alone: prompt minus its last token cached, then [last prompt token, t1..t8] as one row.
    for (p, (toks, want)) in prompts.iter().zip(&steps) {
        let mut c = model.new_cache();
        model.forward(&p[..p.len() - 1], &mut c, Logits::None).unwrap();
        let mut row = vec![p[p.len() - 1]];
        row.extend_from_slice(&toks[..n - 1]);
        let got = model.forward(&row, &mut c, Logits::All).unwrap();
        let vocab = got.len() / row.len();
        for (i, w) in want.iter().take(n).enumerate() {
            assert!(bits(&got[i * vocab..(i + 1) * vocab]) == bits(w), "{file}: position {i} differs from decode");
        }
        // Rolled back to the first two positions, then decoded on: the same as never drafting.
        c.truncate(p.len() + 1);
        let next = model.forward(&[toks[1]], &mut c, Logits::Last).unwrap();
        assert!(bits(&next) == bits(&want[2]), "{file}: after a rollback the next step differs");
    }
    // Batched: the verify rows of three sequences at different lengths beside a decode row.
    let mut caches: Vec<SeqCache> = Vec::new();
    let mut feeds: Vec<Vec<u32>> = Vec::new();
    for (i, (p, (toks, _))) in prompts.iter().zip(&steps).enumerate() {
        let mut c = model.new_cache();
        let start = i + 1;
        let mut hist = p.clone();
        hist.extend_from_slice(&toks[..start - 1]);
        model.forward(&hist, &mut c, Logits::None).unwrap();
        caches.push(c);
        feeds.push(toks[start - 1..start + 2 + i].to_vec());
    }
    let got = {
        let mut rows: Vec<Row<'_>> = caches
            .iter_mut()
            .zip(&feeds)
            .enumerate()
            .map(|(i, (cache, t))| Row { tokens: t, cache, logits: if i == 0 { Logits::Last } else { Logits::All } })
            .collect();
        // Row 0 as a plain decode step: one token.
        rows[0].tokens = &feeds[0][..1];
        model.forward_batch(&mut rows).unwrap()
    };
    for (i, (g, (_, want))) in got.iter().zip(&steps).enumerate() {
        let start = i + 1;
        let vocab = want[0].len();
        for (j, w) in want[start..start + g.len() / vocab].iter().enumerate() {
            assert!(bits(&g[j * vocab..(j + 1) * vocab]) == bits(w), "{file}: batched row {i} position {j}");
        }
    }
}

#[test]
fn smollm2_verify_rows_equal_decode_steps() {
    verify_rows_equal_decode_steps(SMOLLM, "oracle-smollm2.json");
}

#[test]
fn gemma3_verify_rows_equal_decode_steps() {
    verify_rows_equal_decode_steps(GEMMA, "oracle-gemma3.json");
}

use std::time::Instant;

use corral_engine::Engine;
use corral_engine::backend::DeviceChoice;
use corral_engine::chat::ChatMessage;
use corral_engine::generate::{FinishReason, GenerateParams, Observer, TokenOut, generate};
use corral_engine::sampler::SamplingParams;
use corral_engine::sequence::{Outcome, Sequence};
use corral_engine::speculate::Speculate;

/// A source file and an instruction to rewrite it with one change: most of the answer
/// is in the prompt.
const SOURCE: &str = r#"use std::collections::HashMap;

/// Counts words in a text, case-insensitively.
pub fn word_counts(text: &str) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for word in text.split_whitespace() {
        let word = word.trim_matches(|c: char| !c.is_alphanumeric()).to_lowercase();
        if word.is_empty() {
            continue;
        }
        *counts.entry(word).or_insert(0) += 1;
    }
    counts
}

/// The `n` most frequent words, most frequent first.
pub fn top_words(counts: &HashMap<String, usize>, n: usize) -> Vec<(String, usize)> {
    let mut all: Vec<(String, usize)> = counts.iter().map(|(w, c)| (w.clone(), *c)).collect();
    all.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    all.truncate(n);
    all
}
"#;

/// What one more token in a pass costs, as the runs with speculation plan their drafts
/// (`Sequence::input`). Fixed here: `generate` and the scheduler take it from the
/// pacer's timings, so under load (CI's builds beside the test) what was drafted, and
/// whether an edit accepted drafts at all, changed from run to run. At 0.05 a class is
/// drafted `j` deep while its acceptance rate `p` has `p^j > 0.05`: 4 deep from the
/// 3-token match's prior (0.5), deeper as an edit's drafts are accepted.
const DRAFT_COST: f64 = 0.05;

/// Edit-style prompts (the answer is mostly in the prompt) and free-form ones, each with
/// the tokens to generate: enough for an edit's first lines (copied from the prompt,
/// drafted and accepted) and for a free answer's guesses to be drafted and rejected.
/// Every token costs a decode step in the run without speculation, the bulk of the
/// test's time (96/64/32/24 tokens took 200-245 s of CPU a model, these 46-116 s on a
/// busy 2-core machine: docs/reliability.md, "CI time").
fn prompts(engine: &Engine) -> Vec<(Vec<u32>, usize, bool)> {
    let chat = |text: &str| engine.chat_prompt(&[ChatMessage::new("user", text)]).unwrap();
    vec![
        (
            chat(&format!(
                "Here is a Rust file:\n\n{SOURCE}\nRewrite it with one change: rename `top_words` to `most_frequent`. Output the whole file."
            )),
            32,
            true,
        ),
        (chat(&format!("{SOURCE}\nAdd a doc comment example to `word_counts` and repeat the whole file.")), 24, true),
        (chat("Write a short story about a lighthouse keeper who finds a message in a bottle."), 12, false),
        (chat("What are three benefits of regular exercise?"), 12, false),
    ]
}

#[derive(Default)]
struct Collect(Vec<(u32, String, Option<u32>)>);

impl Observer for Collect {
    fn on_token(&mut self, t: &TokenOut) -> bool {
        self.0.push((t.id, t.text.clone(), t.logprob.map(f32::to_bits)));
        true
    }
}

fn params(max_tokens: usize, seed: Option<u64>, speculate: Speculate) -> GenerateParams {
    let sampling = match seed {
        None => SamplingParams::greedy(),
        Some(s) => SamplingParams { temperature: 0.9, seed: Some(s), ..SamplingParams::default() },
    };
    GenerateParams {
        max_tokens,
        sampling,
        stop: vec!["\n\n\n".into()],
        ignore_eos: false,
        logprobs: Some(2),
        grammar: None,
        speculate,
    }
}

/// The prompt but its last token read once; every run starts from a fork of it (each
/// computes the last token itself, as after a prefix-cache hit).
fn prefilled(engine: &Engine, prompt: &[u32]) -> SeqCache {
    let mut cache = engine.model.new_cache();
    engine.model.forward(&prompt[..prompt.len() - 1], &mut cache, Logits::None).unwrap();
    cache
}

/// What a finished sequence's cache holds: the prompt and every token it emitted but a
/// last one whose KV was never computed — no position of a rejected draft.
fn check_cache(cache: &SeqCache, prompt: &[u32], o: &Outcome) {
    let uncomputed = usize::from(o.finish != FinishReason::Stop || o.stop.is_some());
    assert_eq!(cache.len(), prompt.len() + o.tokens.len() - uncomputed, "the cache holds what was computed");
}

/// The output without speculation: `generate`, the sequence alone.
fn reference(engine: &Engine, prompt: &[u32], base: &SeqCache, p: GenerateParams) -> Collect {
    let mut cache = base.fork(prompt.len() - 1);
    let mut c = Collect::default();
    let o = generate(&engine.model, &engine.tokenizer, &mut cache, prompt, p, 4096, &mut c).unwrap();
    check_cache(&cache, prompt, &o);
    c
}

/// Sequences run together as the scheduler runs them, drafts planned at `DRAFT_COST`:
/// one alone, or eight in one batch. In a batch every other one re-reads the last 100
/// tokens of its prompt (a shorter prompt, all of it) in 64-token chunks, so prefill
/// rows share passes with verify rows.
fn run(engine: &Engine, jobs: &[(&[u32], &SeqCache, GenerateParams)]) -> Vec<(Collect, Outcome)> {
    let reread = |i: usize| if jobs.len() > 1 { 100 * (i % 2) } else { 0 };
    let mut seqs: Vec<Sequence> = jobs
        .iter()
        .enumerate()
        .map(|(i, (p, base, g))| {
            Sequence::new(base.fork((p.len() - 1).saturating_sub(reread(i))), p, g.clone(), 4096).unwrap()
        })
        .collect();
    let mut obs: Vec<Collect> = jobs.iter().map(|_| Collect::default()).collect();
    while seqs.iter().any(|s| !s.is_done()) {
        let logits = {
            let mut rows: Vec<_> = seqs.iter_mut().filter(|s| !s.is_done()).map(|s| s.input(64, DRAFT_COST)).collect();
            engine.model.forward_batch(&mut rows).unwrap()
        };
        let live = seqs.iter_mut().zip(obs.iter_mut()).filter(|(s, _)| !s.is_done());
        for ((s, o), l) in live.zip(logits) {
            s.advance(l, &engine.tokenizer, o).unwrap();
        }
    }
    let done = seqs.into_iter().zip(obs).zip(jobs).map(|((s, c), (p, _, _))| {
        let (o, cache) = s.into_parts();
        check_cache(&cache, p, &o);
        (c, o)
    });
    done.collect()
}

fn same_tokens_with_speculation(file: &str) {
    let engine = Engine::load_with(&model_path(file), None, DeviceChoice::Cpu).unwrap();
    let ps = prompts(&engine);
    let bases: Vec<SeqCache> = ps.iter().map(|(p, ..)| prefilled(&engine, p)).collect();
    let mut jobs = Vec::new();
    for (i, ((prompt, n, edit), base)) in ps.iter().zip(&bases).enumerate() {
        for seed in [None, Some(11 + i as u64)] {
            let t = Instant::now();
            let want = reference(&engine, prompt, base, params(*n, seed, Speculate::Off));
            let spec = params(*n, seed, Speculate::Ngram);
            let (got, o) = run(&engine, &[(prompt, base, spec.clone())]).pop().unwrap();
            assert!(want.0 == got.0, "{file} prompt {i} seed {seed:?}: speculation changed the tokens");
            let s = o.speculation.expect("counted");
            assert!(s.accepted <= s.drafted);
            eprintln!(
                "{file} prompt {i} seed {seed:?}: {} tokens, drafted {} accepted {} ({:.1} s)",
                o.tokens.len(),
                s.drafted,
                s.accepted,
                t.elapsed().as_secs_f64()
            );
            if *edit && seed.is_none() {
                assert!(s.accepted > 0, "{file} prompt {i}: an edit accepts drafts");
            }
            jobs.push((prompt.as_slice(), base, spec, want));
        }
    }
    let t = Instant::now();
    let batch: Vec<_> = jobs.iter().map(|(p, b, g, _)| (*p, *b, g.clone())).collect();
    assert_eq!(batch.len(), 8);
    let mut accepted = 0;
    for (i, ((c, o), (.., want))) in run(&engine, &batch).iter().zip(&jobs).enumerate() {
        assert!(c.0 == want.0, "{file} batched job {i}: speculation changed the tokens");
        accepted += o.speculation.unwrap().accepted;
    }
    eprintln!("{file} batch of 8: accepted {accepted} ({:.1} s)", t.elapsed().as_secs_f64());
    assert!(accepted > 0, "{file}: the batch verified drafts");
}

#[test]
fn smollm2_speculation_keeps_every_token() {
    same_tokens_with_speculation(SMOLLM);
}

#[test]
fn gemma3_speculation_keeps_every_token() {
    same_tokens_with_speculation(GEMMA);
}
