//! The pool's promise with the real models: `serve --model-pool 1` with the SSD tier, a
//! ~1,000-token conversation with model A, one request to B (A is drained, demoted and
//! stopped), then A again — the switch-back reuses the whole conversation from disk and
//! answers token for token what a gateway without any cache answers. The same again
//! after the whole gateway is restarted on the same cache directory.

use crate::common::gateway::*;
use crate::common::*;
use serde_json::{Value, json};

fn model_arg(id: &str, file: &str) -> String {
    format!("{id}={}", model_path(file).display())
}

/// Enough varied prose to make the first user turn about 900 tokens.
fn document() -> String {
    let sentences = [
        "The harbour town sits where the river meets a shallow, sheltered bay.",
        "Fishing boats leave before dawn and come back with mackerel, crab and, in winter, herring.",
        "A lighthouse of grey granite stands on the northern headland, lit by oil until 1936.",
        "The market square holds a covered hall where nets were once mended and sold.",
        "Every August the town hosts a regatta, with rowing races across the bay and back.",
        "The school has ninety pupils, most of whom walk along the sea wall to reach it.",
        "A narrow-gauge railway once carried slate from the quarries in the hills to the quay.",
        "Today the old engine shed is a museum with two restored locomotives and a signal box.",
        "Storms in the spring of 1953 breached the sea wall and flooded the lower streets.",
        "The wall was rebuilt higher, with a walkway on top that is now popular with visitors.",
        "Seals rest on the sandbanks at low tide, and terns nest on the island in the bay.",
        "The parish church has a tower with eight bells, rung every Sunday and on feast days.",
    ];
    let mut out = String::new();
    for round in 0..5 {
        out.push_str(&format!("Part {}. ", round + 1));
        for (i, s) in sentences.iter().enumerate() {
            if (i + round) % 5 != 0 {
                out.push_str(s);
                out.push(' ');
            }
        }
        out.push('\n');
    }
    out
}

struct Turn {
    text: String,
    prompt_tokens: u64,
    cached_tokens: u64,
    completion_tokens: u64,
}

fn ask(gw: &Gateway, model: &str, messages: &[Value]) -> Turn {
    let r = gw.post(
        "/v1/chat/completions",
        &json!({"model": model, "messages": messages, "max_tokens": 24, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    Turn {
        text: v["choices"][0]["message"]["content"].as_str().unwrap().to_owned(),
        prompt_tokens: v["usage"]["prompt_tokens"].as_u64().unwrap(),
        cached_tokens: v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(),
        completion_tokens: v["usage"]["completion_tokens"].as_u64().unwrap(),
    }
}

fn push_turn(messages: &mut Vec<Value>, reply: &str, next: &str) {
    messages.push(json!({"role": "assistant", "content": reply}));
    messages.push(json!({"role": "user", "content": next}));
}

/// Asserts the switch-back (or post-restart) turn reused at least 99% of what it shares
/// with the previous turn — the whole previous prompt — and says what it measured.
fn assert_reused(what: &str, turn: &Turn, shared: u64) {
    assert!(
        turn.cached_tokens * 100 >= shared * 99,
        "{what}: cached_tokens {} of a shared prefix of {shared} tokens (prompt {})",
        turn.cached_tokens,
        turn.prompt_tokens
    );
    assert!(turn.cached_tokens < turn.prompt_tokens, "{what}: at least one prompt token is computed");
    eprintln!("{what}: reused {} of {} prompt tokens (shared prefix {shared})", turn.cached_tokens, turn.prompt_tokens);
}

fn assert_same(what: &str, got: &Turn, want: &Turn) {
    assert_eq!(got.text, want.text, "{what}: output with the cache differs from output without it");
    assert_eq!(got.completion_tokens, want.completion_tokens, "{what}");
    assert_eq!(want.cached_tokens, 0, "the reference gateway has no cache");
}

fn switch_back_reuses_the_conversation(a: (&str, &str), b: (&str, &str)) {
    let kv = TempDir::new("kv");
    let kv_dir = kv.path().join("kv");
    let (arg_a, arg_b) = (model_arg(a.0, a.1), model_arg(b.0, b.1));
    let args = [
        "--model",
        &arg_a,
        "--model",
        &arg_b,
        "--model-pool",
        "1",
        "--threads",
        "1",
        "--ssd-cache",
        kv_dir.to_str().unwrap(),
    ];
    let gw = Gateway::start(&args);
    let reference = Gateway::start(&["--model", &arg_a, "--threads", "1", "--prompt-cache", "0", "--no-ssd-cache"]);

    // Turn 1: a cold prompt of about a thousand tokens.
    let mut messages = vec![
        json!({"role": "system", "content": "You are a careful assistant. Answer briefly."}),
        json!({"role": "user", "content": format!("{}\nWhat is the lighthouse made of?", document())}),
    ];
    let t1 = ask(&gw, a.0, &messages);
    assert_eq!(t1.cached_tokens, 0);
    assert!(t1.prompt_tokens >= 800, "the conversation is ~1,000 tokens, got {}", t1.prompt_tokens);

    // B evicts A: A is drained (its cache demoted to disk) and stopped.
    let other = ask(&gw, b.0, &[json!({"role": "user", "content": "Hello."})]);
    assert!(other.completion_tokens > 0);
    assert!(
        wait_until(std::time::Duration::from_secs(20), || gw.engine_of(a.0)["state"] == "stopped"),
        "{}",
        gw.engine()
    );

    // Turn 2 on a fresh A engine: the conversation so far comes back from the SSD tier.
    push_turn(&mut messages, &t1.text, "And when was it built?");
    let t2 = ask(&gw, a.0, &messages);
    assert_reused(&format!("{}: switch-back", a.0), &t2, t1.prompt_tokens);
    assert_same("switch-back", &t2, &ask(&reference, a.0, &messages));
    let ssd = &gw.stats()["engines"][a.0]["ssd_cache"];
    assert!(ssd["restores"].as_u64().unwrap() >= 1, "{ssd}");
    assert_eq!(ssd["rejected_files"], 0, "{ssd}");

    // A full restart of the gateway on the same cache directory.
    let mut gw = gw;
    gw.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(gw.wait_exit(std::time::Duration::from_secs(30)).is_some_and(|s| s.success()), "{}", gw.log());
    drop(gw);
    let gw = Gateway::start(&args);
    push_turn(&mut messages, &t2.text, "Thank you. Who rings the bells?");
    let t3 = ask(&gw, a.0, &messages);
    assert_reused(&format!("{}: after restart", a.0), &t3, t2.prompt_tokens);
    assert_same("after restart", &t3, &ask(&reference, a.0, &messages));
}

#[test]
fn smollm2_switch_back_and_restart_restore_the_conversation() {
    switch_back_reuses_the_conversation(("smol", SMOLLM), ("gemma", GEMMA));
}

#[test]
fn gemma_switch_back_and_restart_restore_the_conversation() {
    switch_back_reuses_the_conversation(("gemma", GEMMA), ("smol", SMOLLM));
}

/// Shutdown keeps the promise for every resident engine, not just the first: with two
/// engines each holding a ~1,000-token conversation, write-behind and idle demotion off
/// (so only the shutdown's drains can write the caches), a SIGTERM to the gateway saves
/// both, and after a restart both conversations continue from disk.
#[test]
fn sigterm_with_two_resident_engines_saves_both_caches_for_the_restart() {
    let kv = TempDir::new("kv2");
    let kv_dir = kv.path().join("kv");
    let (arg_a, arg_b) = (model_arg("smol", SMOLLM), model_arg("gemma", GEMMA));
    let args = [
        "--model",
        &arg_a,
        "--model",
        &arg_b,
        "--model-pool",
        "2",
        "--threads",
        "1",
        "--ssd-cache",
        kv_dir.to_str().unwrap(),
        "--ssd-write-behind",
        "0",
        "--ssd-demote-idle",
        "0",
    ];
    let gw = Gateway::start(&args);
    let mut convs = Vec::new();
    for model in ["smol", "gemma"] {
        let messages = vec![
            json!({"role": "system", "content": "You are a careful assistant. Answer briefly."}),
            json!({"role": "user", "content": format!("{}\nWhat is the lighthouse made of?", document())}),
        ];
        let t1 = ask(&gw, model, &messages);
        assert!(t1.prompt_tokens >= 800, "{model}: {}", t1.prompt_tokens);
        convs.push((model, messages, t1));
    }
    let e = gw.engine();
    assert_eq!(e["pool"]["resident"], json!(["gemma", "smol"]), "{e}");
    for model in ["smol", "gemma"] {
        let ssd = &gw.stats()["engines"][model]["ssd_cache"];
        assert_eq!(ssd["spills"], 0, "{model}: nothing may reach the disk before the shutdown: {ssd}");
    }
    let mut gw = gw;
    gw.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(gw.wait_exit(std::time::Duration::from_secs(60)).is_some_and(|s| s.success()), "{}", gw.log());
    drop(gw);

    let gw = Gateway::start(&args);
    for (model, mut messages, t1) in convs {
        push_turn(&mut messages, &t1.text, "And when was it built?");
        let t2 = ask(&gw, model, &messages);
        assert_reused(&format!("{model}: after a two-engine shutdown"), &t2, t1.prompt_tokens);
    }
}
