"""The official `openai` and `anthropic` Python SDKs against a running `corral serve` whose
model speaks gpt-oss's harmony format (a noise model with gpt-oss's vocabulary: see
scripts/test/sdks): tool calls parsed by the SDK (Pydantic), streamed and round-tripped
with their reasoning; reasoning returned as `reasoning_content`; `reasoning_effort`
levels accepted and the ones harmony cannot honour refused as BadRequestError naming the
field; the Responses API's `reasoning.effort` and function calls; Anthropic's tool use with
a thinking budget, and `thinking: disabled` refused. Exits non-zero on failure.

The model's weights are noise, so its choices are steered: the harmony grammar allows
`analysis`, `commentary` or `final` after `<|channel|>`, and a `logit_bias` on one of those
tokens (o200k ids below) picks it.

Usage: harmony_sdk.py BASE_URL MODEL   ($CORRAL_API_KEY as the other SDK scripts)
"""
import json
import os
import sys

import anthropic
import openai
from openai import OpenAI
from pydantic import BaseModel, Field

ANALYSIS, COMMENT = 35644, 12606  # o200k: "analysis", "comment" (+ "ary")


class GetWeather(BaseModel):
    """Current weather for a city."""

    city: str = Field(max_length=30)


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def refused(call, param, what):
    try:
        call()
    except (openai.BadRequestError, anthropic.BadRequestError) as e:
        check(e.status_code == 400 and param in str(e.body), f"{what}: 400 naming {param}")
        return
    check(False, f"{what}: refused")


def run_openai(client: OpenAI, model: str):
    tools = [openai.pydantic_function_tool(GetWeather)]
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    steer = {"temperature": 0, "max_tokens": 300, "logit_bias": {str(COMMENT): 100}}
    r = client.chat.completions.parse(model=model, messages=ask, tools=tools, tool_choice="required",
                                      reasoning_effort="high", **steer)
    choice = r.choices[0]
    check(choice.finish_reason == "tool_calls", f"{model}: harmony call, finish_reason tool_calls")
    call = choice.message.tool_calls[0]
    check(isinstance(call.function.parsed_arguments, GetWeather), f"{model}: arguments parse: {call.function.arguments}")
    with client.chat.completions.stream(model=model, messages=ask, tools=tools, tool_choice="required", **steer) as s:
        scall = s.get_final_completion().choices[0].message.tool_calls[0]
    check((scall.function.name, scall.function.arguments) == (call.function.name, call.function.arguments),
          f"{model}: streamed call equals the non-stream call")
    # The round trip: the call (with its reasoning, which gpt-oss's format keeps before a
    # call) and the result go back.
    turn = choice.message.model_dump(exclude_none=True, exclude={"parsed"})
    turn["reasoning_content"] = "The user wants the weather in Paris."
    follow = ask + [turn, {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 18})}]
    a = client.chat.completions.create(model=model, messages=follow, tools=tools, tool_choice="none",
                                       temperature=0, max_tokens=20)
    check(not a.choices[0].message.tool_calls, f"{model}: no call after the result with tool_choice none")

    t = client.chat.completions.create(model=model, messages=ask, reasoning_effort="low", temperature=0, max_tokens=24,
                                       tools=tools, logit_bias={str(ANALYSIS): 100})
    thought = getattr(t.choices[0].message, "reasoning_content", None)
    check(isinstance(thought, str) and thought and "<|" not in thought, f"{model}: analysis is reasoning_content")
    refused(lambda: client.chat.completions.create(model=model, messages=ask, reasoning_effort="minimal", max_tokens=5),
            "reasoning_effort", f"{model}: reasoning_effort minimal")

    fn = [{"type": "function", "name": "get_weather", "description": "Current weather for a city",
           "parameters": GetWeather.model_json_schema() | {"additionalProperties": False}, "strict": True}]
    c = client.responses.create(model=model, input="What is the weather in Paris?", tools=fn, tool_choice="required",
                                reasoning={"effort": "medium"}, temperature=0, max_output_tokens=300)
    calls = [i for i in c.output if i.type == "function_call"]
    check(len(calls) == 1 and calls[0].name == "get_weather", f"{model}: Responses function_call item")
    check(isinstance(json.loads(calls[0].arguments).get("city"), str), f"{model}: arguments {calls[0].arguments}")
    refused(lambda: client.responses.create(model=model, input="Hi", reasoning={"effort": "none"}, max_output_tokens=5),
            "reasoning.effort", f"{model}: Responses reasoning.effort none")


def run_anthropic(client: anthropic.Anthropic, model: str):
    weather = {"name": "get_weather", "description": "Current weather for a city",
               "input_schema": GetWeather.model_json_schema() | {"additionalProperties": False}}
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.messages.create(model=model, max_tokens=300, extra_body={"temperature": 0}, messages=ask,
                               tools=[weather], tool_choice={"type": "any"},
                               thinking={"type": "enabled", "budget_tokens": 2048})
    uses = [b for b in r.content if b.type == "tool_use"]
    thinking = [b for b in r.content if b.type == "thinking"]
    check(r.stop_reason in ("tool_use", "max_tokens"), f"{model}: stop_reason {r.stop_reason}")
    check(len(uses) == 1 or thinking, f"{model}: a tool_use block, or thinking cut short")
    for b in thinking:
        check("<|" not in b.thinking, f"{model}: thinking holds no harmony marker")
    for u in uses:
        check(u.name == "get_weather" and isinstance(u.input.get("city"), str), f"{model}: input {u.input}")
    refused(lambda: client.messages.create(model=model, max_tokens=5, messages=ask, thinking={"type": "disabled"}),
            "thinking.type", f"{model}: thinking disabled")


def main():
    base, model = sys.argv[1], sys.argv[2]
    key = os.environ.get("CORRAL_API_KEY") or "unused"
    run_openai(OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=300), model)
    run_anthropic(anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=300), model)
    print("harmony SDK checks: all passed")


if __name__ == "__main__":
    main()
