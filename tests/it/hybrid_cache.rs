//! The prompt cache with a hybrid model (make-gguf's tiny `qwen35`: Gated DeltaNet layers
//! whose recurrent state cannot be cut back, and full attention). A prompt that shares a
//! prefix with a cached one restores the newest state checkpoint within it — from RAM,
//! and from the SSD tier after a restart — reports that position as `cached_tokens`, and
//! answers token for token what an engine without a cache answers. A multi-turn
//! conversation of ~8k tokens reuses nearly all of each previous turn, also after the
//! pool evicted the engine for another model and after a gateway restart.

use std::path::PathBuf;

use crate::common::engine::EngineProc;
use crate::common::gateway::*;
use crate::common::generated::generated_model;
use crate::common::*;
use serde_json::{Value, json};

fn qwen35() -> Option<PathBuf> {
    generated_model("qwen35", "q8_0")
}

/// `n` token ids of ordinary text pieces (no special tokens), the same for the same `seed`.
fn ids(seed: u64, n: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            1000 + ((x >> 33) % 100_000) as u32
        })
        .collect()
}

/// A raw completion of token ids: (its tokens with their log probabilities, as JSON;
/// cached_tokens). Equal log probabilities mean an equal state, not only equal text.
fn complete(e: &EngineProc, prompt: &[u32]) -> (String, u64) {
    let body = json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 1});
    let r = e.post("/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached_tokens");
    (v["choices"][0]["logprobs"].to_string(), cached)
}

fn with_tail(prefix: &[u32], seed: u64, n: usize) -> Vec<u32> {
    let mut p = prefix.to_vec();
    p.extend(ids(seed, n));
    p
}

/// Prompts that share 3,000 and 4,990 tokens with a cached 5,000-token one restore the
/// grid checkpoint at 2,048 and the one 16 tokens before that prompt's end (not the shared
/// length), and answer as an uncached engine does; after a restart on the same SSD
/// directory, a prompt sharing 4,500 restores the checkpoint at 4,096 from the file.
#[test]
fn a_shared_prefix_restores_the_newest_checkpoint_and_answers_as_uncached() {
    let Some(model) = qwen35() else { return };
    let kv = TempDir::new("hybrid-kv");
    let kv_dir = kv.path().join("kv");
    let args = ["--threads", "1", "--ctx", "8192", "--ssd-cache", kv_dir.to_str().unwrap()];
    let reference = EngineProc::start(&model, &["--prompt-cache", "0", "--threads", "1", "--ctx", "8192"]);
    let e = EngineProc::start_fresh(&model, &args, |_| {});
    let base = ids(1, 5000);
    let (_, c1) = complete(&e, &base);
    assert_eq!(c1, 0);
    for (shared, want) in [(3000, 2048), (4990, 4984)] {
        let p = with_tail(&base[..shared], shared as u64, 400);
        let (text, cached) = complete(&e, &p);
        assert_eq!(cached, want, "sharing {shared} tokens");
        assert_eq!(text, complete(&reference, &p).0, "sharing {shared}: output from the checkpoint differs");
    }
    let r = e.post("/admin/cache/flush", &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    drop(e);

    let e = EngineProc::start_fresh(&model, &args, |_| {});
    let p = with_tail(&base[..4500], 7, 300);
    let (text, cached) = complete(&e, &p);
    assert_eq!(cached, 4096, "the grid checkpoint from the SSD tier");
    assert_eq!(text, complete(&reference, &p).0, "output from a restored checkpoint differs");
    let ssd = e.stats()["ssd_cache"].clone();
    assert_eq!((ssd["restores"].as_u64(), ssd["rejected_files"].as_u64()), (Some(1), Some(0)), "{ssd}");
}

/// qwen35moe (the experts and their shared expert between the same hybrid layers): two
/// requests that restore different checkpoints of one cached prompt (the grid one at
/// 2,048 and the tail at 2,984) run in the same forward passes, and each answers as an
/// engine without a cache answers it alone.
#[test]
fn rows_restored_from_different_checkpoints_batch_and_answer_as_uncached() {
    let Some(model) = generated_model("qwen35moe", "q8_0") else { return };
    let reference = EngineProc::start(&model, &["--prompt-cache", "0", "--threads", "1", "--ctx", "4096"]);
    let e = EngineProc::start(&model, &["--threads", "1", "--ctx", "4096", "--batch", "2"]);
    let base = ids(3, 3000);
    assert_eq!(complete(&e, &base).1, 0);
    let prompts = [with_tail(&base[..2990], 11, 200), with_tail(&base[..2500], 12, 200)];
    let body = |p: &Vec<u32>| json!({"prompt": p, "max_tokens": 8, "temperature": 0, "logprobs": 1});
    let start = std::sync::Barrier::new(prompts.len());
    let got: Vec<Value> = std::thread::scope(|s| {
        let rows: Vec<_> = prompts
            .iter()
            .map(|p| {
                let (e, start) = (&e, &start);
                s.spawn(move || {
                    start.wait();
                    let r = e.post("/v1/completions", &body(p));
                    assert_eq!(r.status, 200, "{}", r.text());
                    r.json()
                })
            })
            .collect();
        rows.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for ((v, p), want) in got.iter().zip(&prompts).zip([2984, 2048]) {
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], want, "{}", v["usage"]);
        assert_eq!(v["choices"][0]["logprobs"].to_string(), complete(&reference, p).0, "restored from {want}");
    }
    let lanes: Vec<&Value> = got.iter().map(|v| &v["usage"]["lane"]).collect();
    assert!(lanes.iter().any(|l| *l == "batch"), "the rows shared a pass: {lanes:?}");
}

/// Deterministic prose of about `words` words (several hundred distinct words, so the
/// tokenizer sees ordinary text).
fn prose(seed: u64, words: usize) -> String {
    const W: [&str; 48] = [
        "harbour",
        "river",
        "granite",
        "lighthouse",
        "market",
        "bells",
        "regatta",
        "quarry",
        "railway",
        "museum",
        "storm",
        "wall",
        "seals",
        "terns",
        "island",
        "church",
        "tower",
        "school",
        "pupils",
        "engine",
        "signal",
        "mackerel",
        "herring",
        "crab",
        "nets",
        "hall",
        "square",
        "north",
        "summer",
        "winter",
        "morning",
        "evening",
        "boats",
        "slate",
        "hills",
        "quay",
        "visitors",
        "walkway",
        "tide",
        "sandbanks",
        "flooded",
        "rebuilt",
        "restored",
        "narrow",
        "shallow",
        "sheltered",
        "grey",
        "eight",
    ];
    let mut x = seed;
    let mut out = String::new();
    for i in 0..words {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        out.push_str(W[(x >> 40) as usize % W.len()]);
        out.push_str(if i % 13 == 12 { ". " } else { " " });
    }
    out
}

struct Turn {
    text: String,
    /// The reply's tokens and log probabilities, as JSON.
    logprobs: String,
    prompt_tokens: u64,
    cached_tokens: u64,
}

fn ask(gw: &Gateway, model: &str, messages: &[Value]) -> Turn {
    let body = json!({"model": model, "messages": messages, "max_tokens": 12, "temperature": 0, "logprobs": true});
    let r = gw.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    Turn {
        text: v["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned(),
        logprobs: v["choices"][0]["logprobs"].to_string(),
        prompt_tokens: v["usage"]["prompt_tokens"].as_u64().unwrap(),
        cached_tokens: v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(),
    }
}

/// Each turn's prompt starts with the whole previous prompt (the chat template appends
/// the reply and the next message): at least 95% of it must come back.
fn assert_reused(what: &str, turn: &Turn, shared: u64) {
    eprintln!(
        "{what}: cached {} of {} prompt tokens (shared prefix ≥ {shared})",
        turn.cached_tokens, turn.prompt_tokens
    );
    assert!(
        turn.cached_tokens * 100 >= shared * 95,
        "{what}: cached {} of a {shared}-token prefix",
        turn.cached_tokens
    );
    assert!(turn.cached_tokens < turn.prompt_tokens, "{what}: at least one prompt token is computed");
}

/// An agent's conversation on the hybrid model, each turn appending ~500 tokens to a
/// ~6,000-token start (~8,000 by the last turn), through `serve --model-pool 1`: the
/// second turn hits RAM, the third comes after another model evicted the engine (its
/// cache demoted to the SSD tier with its state checkpoints), the fourth after a gateway
/// restart on the same directory, the fifth hits RAM again; the SSD turns answer as a
/// gateway without any cache does.
#[test]
fn an_agent_conversation_keeps_its_prefix_across_eviction_and_restart() {
    let (Some(hybrid), Some(other)) = (qwen35(), generated_model("qwen3", "q4_0")) else { return };
    let kv = TempDir::new("hybrid-agent");
    let kv_dir = kv.path().join("kv");
    let (arg_a, arg_b) = (format!("hy={}", hybrid.display()), format!("other={}", other.display()));
    let args = ["--model", &arg_a, "--model", &arg_b, "--model-pool", "1", "--threads", "1", "--ctx", "16384"];
    let args = [&args[..], &["--ssd-cache"]].concat();
    let args: Vec<&str> = args.into_iter().chain([kv_dir.to_str().unwrap()]).collect();
    let mut gw = Gateway::start(&args);
    let reference = Gateway::start(&[
        "--model",
        &arg_a,
        "--threads",
        "1",
        "--ctx",
        "16384",
        "--prompt-cache",
        "0",
        "--no-ssd-cache",
    ]);
    let mut messages = vec![
        json!({"role": "system", "content": "You are an agent. Read the notes and answer in one line."}),
        json!({"role": "user", "content": format!("{}\nWhat is on the headland?", prose(1, 4700))}),
    ];
    let mut prev = ask(&gw, "hy", &messages);
    assert_eq!(prev.cached_tokens, 0);
    assert!(prev.prompt_tokens >= 5000, "a ~6,000-token start, got {}", prev.prompt_tokens);
    for turn in 2..=5 {
        let next = format!("Tool output {turn}:\n{}\nWhat changed?", prose(turn, 420));
        messages.push(json!({"role": "assistant", "content": prev.text}));
        messages.push(json!({"role": "user", "content": next}));
        let what = match turn {
            3 => {
                ask(&gw, "other", &[json!({"role": "user", "content": "Hello."})]);
                let stopped =
                    wait_until(std::time::Duration::from_secs(30), || gw.engine_of("hy")["state"] == "stopped");
                assert!(stopped, "{}", gw.engine());
                "after eviction"
            }
            4 => {
                gw.signal(nix::sys::signal::Signal::SIGTERM);
                assert!(gw.wait_exit(std::time::Duration::from_secs(60)).is_some_and(|s| s.success()), "{}", gw.log());
                drop(gw);
                gw = Gateway::start(&args);
                "after a gateway restart"
            }
            _ => "in RAM",
        };
        let t = ask(&gw, "hy", &messages);
        assert_reused(&format!("turn {turn} {what}"), &t, prev.prompt_tokens);
        if turn == 3 || turn == 4 {
            assert_eq!(t.logprobs, ask(&reference, "hy", &messages).logprobs, "turn {turn}: differs from uncached");
            let ssd = &gw.stats()["engines"]["hy"]["ssd_cache"];
            assert!(ssd["restores"].as_u64().unwrap() >= 1, "turn {turn}: {ssd}");
            assert_eq!(ssd["rejected_files"], 0, "turn {turn}: {ssd}");
        }
        prev = t;
    }
    assert!(prev.prompt_tokens >= 7000, "the conversation reached ~8,000 tokens, got {}", prev.prompt_tokens);
}
