"""The official `anthropic` Python SDK against a running `corral serve`:
messages.create, messages.stream (the SDK's own event accumulator), a tool-use round
trip, and count_tokens. Exits non-zero on failure.

The gateway's API key, when it has one, comes from $CORRAL_API_KEY (the SDK sends it as
`x-api-key`); then a client with another key must get AuthenticationError.

Usage: anthropic_sdk.py BASE_URL MODEL [MODEL ...]
"""
import os
import sys

import anthropic

WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}},
        "required": ["city"],
        "additionalProperties": False,
    },
}

# This SDK version has no `temperature` argument (the hosted API dropped sampling
# parameters); corral still takes it, so it goes in the body as extra fields.
GREEDY = {"temperature": 0}


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def run(client: anthropic.Anthropic, model: str):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    m = client.messages.create(model=model, max_tokens=30, extra_body=GREEDY, system="Answer briefly.", messages=msgs)
    check(m.type == "message" and m.content and m.content[0].type == "text", f"{model}: messages.create gives text")
    check(m.stop_reason in ("end_turn", "max_tokens"), f"{model}: stop_reason {m.stop_reason}")
    check(m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 0, f"{model}: usage")

    with client.messages.stream(model=model, max_tokens=30, extra_body=GREEDY, system="Answer briefly.", messages=msgs) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    check(text == m.content[0].text == final.content[0].text, f"{model}: messages.stream gives the same text")

    n = client.messages.count_tokens(model=model, system="Answer briefly.", messages=msgs)
    check(n.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0), f"{model}: count_tokens")

    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.messages.create(
        model=model, max_tokens=60, extra_body=GREEDY, messages=ask, tools=[WEATHER], tool_choice={"type": "any"}
    )
    uses = [b for b in r.content if b.type == "tool_use"]
    check(r.stop_reason == "tool_use" and len(uses) == 1, f"{model}: a tool_use block")
    use = uses[0]
    check(use.name == "get_weather" and isinstance(use.input.get("city"), str), f"{model}: input {use.input}")
    with client.messages.stream(
        model=model, max_tokens=60, extra_body=GREEDY, messages=ask, tools=[WEATHER], tool_choice={"type": "any"}
    ) as s:
        streamed = [b for b in s.get_final_message().content if b.type == "tool_use"]
    check(len(streamed) == 1 and streamed[0].input == use.input, f"{model}: streamed tool_use input matches")

    follow = ask + [
        {"role": "assistant", "content": r.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18C and sunny"}]},
    ]
    a = client.messages.create(
        model=model, max_tokens=40, extra_body=GREEDY, messages=follow, tools=[WEATHER], tool_choice={"type": "none"}
    )
    check(a.stop_reason != "tool_use" and a.content and a.content[0].type == "text", f"{model}: answers after the result")

    try:
        client.messages.create(model=model, max_tokens=5, messages=[{"role": "system", "content": "x"}])
        check(False, f"{model}: a bad role is refused")
    except anthropic.BadRequestError as e:
        check(e.body["error"]["type"] == "invalid_request_error", f"{model}: BadRequestError in Anthropic's shape")


def main():
    base, models = sys.argv[1], sys.argv[2:]
    key = os.environ.get("CORRAL_API_KEY")
    client = anthropic.Anthropic(base_url=base, api_key=key or "unused", max_retries=0, timeout=300)
    print(f"anthropic {anthropic.__version__}")
    for m in models:
        run(client, m)
    if key:
        wrong = anthropic.Anthropic(base_url=base, api_key=key + "x", max_retries=0, timeout=30)
        try:
            wrong.messages.create(model=models[0], max_tokens=5, messages=[{"role": "user", "content": "hi"}])
            check(False, "another key is refused")
        except anthropic.AuthenticationError as e:
            check(e.body["error"]["type"] == "authentication_error", "another key: AuthenticationError in Anthropic's shape")
    print("anthropic SDK: all checks passed")


if __name__ == "__main__":
    main()
