//! Reasoning controls with a chat template that reads `enable_thinking`
//! (`fixtures/thinking-chatml.jinja`, given with `--chat-template`): the precedence
//! table, one test per row — explicit `chat_template_kwargs.enable_thinking` >
//! the request's effort > `--thinking` > the template's default — and the reasoning
//! split out of the answer on all three APIs.

use crate::common::gateway::Gateway;
use crate::common::{SMOLLM, model_path};
use serde_json::{Value, json};

const OPEN: &str = "<|im_start|>assistant\n<think>\n";
const CLOSED: &str = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
const NONE: &str = "<|im_start|>assistant\n";

fn gateway(thinking: Option<&str>) -> Gateway {
    let template = format!("{}/tests/fixtures/thinking-chatml.jinja", env!("CARGO_MANIFEST_DIR"));
    let model = format!("smol={}", model_path(SMOLLM).display());
    let mut args = vec!["--model", &model, "--chat-template", &template, "--threads", "1"];
    if let Some(t) = thinking {
        args.extend(["--thinking", t]);
    }
    Gateway::start(&args)
}

/// The prompt a chat request renders to.
fn prompt(gw: &Gateway, extra: Value) -> String {
    let mut body = json!({"model": "smol", "messages": [{"role": "user", "content": "What is 2+2?"}]});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    let r = gw.post("/apply-template", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["prompt"].as_str().unwrap().to_owned()
}

fn ends(prompt: &str, tail: &str) {
    assert!(prompt.ends_with(tail), "expected the prompt to end with {tail:?}: {prompt:?}");
    if tail == NONE {
        assert!(!prompt.contains("<think>"), "{prompt:?}");
    }
}

#[test]
fn row1_explicit_template_kwarg_beats_effort_and_the_server_flag() {
    let gw = gateway(Some("true"));
    ends(&prompt(&gw, json!({"chat_template_kwargs": {"enable_thinking": false}, "reasoning_effort": "high"})), CLOSED);
    ends(&prompt(&gw, json!({"chat_template_kwargs": {"enable_thinking": true}, "reasoning_effort": "none"})), OPEN);
}

#[test]
fn row2_effort_none_beats_the_server_flag() {
    ends(&prompt(&gateway(Some("true")), json!({"reasoning_effort": "none"})), CLOSED);
}

#[test]
fn row3_any_other_effort_turns_thinking_on_over_the_server_flag() {
    let gw = gateway(Some("false"));
    for effort in ["minimal", "low", "medium", "high"] {
        ends(&prompt(&gw, json!({"reasoning_effort": effort})), OPEN);
    }
}

#[test]
fn row4_the_server_flag_applies_when_the_request_says_nothing() {
    ends(&prompt(&gateway(Some("false")), json!({})), CLOSED);
    ends(&prompt(&gateway(Some("true")), json!({})), OPEN);
}

#[test]
fn row5_otherwise_the_template_decides() {
    ends(&prompt(&gateway(None), json!({})), NONE);
}

#[test]
fn reasoning_is_split_out_on_every_api() {
    let gw = gateway(None);
    let q = "What is 2+2?";
    // Thinking on: the template opens <think>, so what the model writes first is reasoning.
    let chat = gw
        .post(
            "/v1/chat/completions",
            &json!({"model": "smol", "messages": [{"role": "user", "content": q}],
        "reasoning_effort": "high", "max_tokens": 30, "temperature": 0}),
        )
        .json();
    let m = &chat["choices"][0]["message"];
    let thought = m["reasoning_content"].as_str().unwrap_or_else(|| panic!("no reasoning_content: {chat}")).to_owned();
    assert!(!thought.trim().is_empty() && !thought.contains("<think>") && !thought.contains("</think>"), "{chat}");

    let msg = gw.post(
        "/v1/messages",
        &json!({"model": "smol", "max_tokens": 30, "temperature": 0,
        "thinking": {"type": "enabled", "budget_tokens": 1024}, "messages": [{"role": "user", "content": q}]}),
    );
    assert!(
        msg.header("warning").is_some_and(|w| w.contains("thinking budget not enforced")),
        "budget_tokens is not silently ignored"
    );
    let msg = msg.json();
    assert_eq!(msg["content"][0]["type"], "thinking", "{msg}");
    assert_eq!(msg["content"][0]["thinking"].as_str(), Some(thought.as_str()), "same model, same prompt, same thought");

    let resp = gw
        .post(
            "/v1/responses",
            &json!({"model": "smol", "input": q, "reasoning": {"effort": "low"},
        "max_output_tokens": 30, "temperature": 0}),
        )
        .json();
    let item = &resp["output"][0];
    assert_eq!(item["type"], "reasoning", "{resp}");
    assert_eq!(item["content"][0]["text"].as_str(), Some(thought.as_str()));
    assert!(resp["usage"]["output_tokens_details"]["reasoning_tokens"].as_u64().unwrap() > 0, "{resp}");

    // Thinking off: no reasoning, only the answer.
    let off = gw
        .post(
            "/v1/messages",
            &json!({"model": "smol", "max_tokens": 30, "temperature": 0,
        "thinking": {"type": "disabled"}, "messages": [{"role": "user", "content": q}]}),
        )
        .json();
    assert!(off["content"].as_array().unwrap().iter().all(|b| b["type"] == "text"), "{off}");
}
