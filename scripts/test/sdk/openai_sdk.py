"""The official `openai` Python SDK against a running `corral serve`: structured output
with a Pydantic model (`chat.completions.parse`), a tool round trip (call -> tool
result -> answer), the SDK's own streaming helper reassembling a tool call, and a
constraint that cannot be enforced (its Warning header); then the Responses API:
`responses.create`, streamed responses, function calling, `previous_response_id`.
Exits non-zero on failure.

The gateway's API key, when it has one, comes from $CORRAL_API_KEY (the SDK sends it as
`Authorization: Bearer`); then a client with another key must get AuthenticationError.

Usage: openai_sdk.py BASE_URL MODEL [MODEL ...]
"""
import json
import os
import sys
from typing import List

import openai
from openai import OpenAI
from pydantic import BaseModel, Field


class Person(BaseModel):
    name: str = Field(max_length=40)
    age: int = Field(ge=0, le=120)
    hobbies: List[str] = Field(max_length=3)


class GetWeather(BaseModel):
    """Current weather for a city."""

    city: str = Field(max_length=30)


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def run(client: OpenAI, model: str):
    # Structured output: the SDK sends a strict json_schema and parses into Person.
    c = client.chat.completions.parse(
        model=model,
        messages=[
            {"role": "system", "content": "Reply with a short JSON value."},
            {"role": "user", "content": "Describe a person with a name, an age and hobbies."},
        ],
        response_format=Person,
        temperature=0,
        max_tokens=120,
    )
    msg = c.choices[0].message
    check(isinstance(msg.parsed, Person), f"{model}: parse() gives a Person: {msg.parsed!r}")
    check(c.choices[0].finish_reason == "stop", f"{model}: finish_reason stop")

    # Tool round trip with a strict function tool built by the SDK.
    tools = [openai.pydantic_function_tool(GetWeather)]
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.parse(
        model=model, messages=messages, tools=tools, tool_choice="required", temperature=0, max_tokens=60
    )
    choice = r.choices[0]
    check(choice.finish_reason == "tool_calls", f"{model}: finish_reason tool_calls")
    call = choice.message.tool_calls[0]
    check(call.function.name == "GetWeather", f"{model}: calls GetWeather")
    check(isinstance(call.function.parsed_arguments, GetWeather), f"{model}: arguments parse: {call.function.arguments}")
    messages.append(choice.message)
    messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 18})})
    final = client.chat.completions.create(
        model=model, messages=messages, tools=tools, tool_choice="none", temperature=0, max_tokens=40
    )
    answer = final.choices[0].message
    check(not answer.tool_calls and isinstance(answer.content, str) and answer.content, f"{model}: answers after the result")

    # Streaming: the SDK's helper reassembles delta.tool_calls into the same call.
    with client.chat.completions.stream(
        model=model, messages=messages[:1], tools=tools, tool_choice="required", temperature=0, max_tokens=60
    ) as s:
        done = s.get_final_completion()
    scall = done.choices[0].message.tool_calls[0]
    check(
        (scall.function.name, scall.function.arguments) == (call.function.name, call.function.arguments),
        f"{model}: streamed call equals the non-stream call",
    )

    # A schema feature the grammar engine cannot compile: 200, visibly not enforced.
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": "Name a pet."}],
        max_tokens=10,
        response_format={
            "type": "json_schema",
            "json_schema": {
                "name": "pet",
                "schema": {
                    "oneOf": [
                        {"type": "object", "properties": {"cat": {"type": "string"}}, "required": ["cat"]},
                        {"type": "object", "properties": {"dog": {"type": "string"}}, "required": ["dog"]},
                    ]
                },
            },
        },
    )
    check(raw.headers.get("warning", "").startswith('299 - "grammar not enforced'), f"{model}: Warning header")


def run_responses(client: OpenAI, model: str):
    r = client.responses.create(
        model=model, input="What is the capital of France?", instructions="Answer briefly.", max_output_tokens=30, temperature=0
    )
    check(r.object == "response" and r.output_text, f"{model}: responses.create: {r.output_text!r}")

    with client.responses.stream(
        model=model, input="What is the capital of France?", instructions="Answer briefly.", max_output_tokens=30, temperature=0
    ) as s:
        # A stream cut by max_output_tokens ends with `response.incomplete` (as OpenAI's
        # does), which the SDK's get_final_response() does not accept: take the final
        # event's response either way.
        deltas, final = "", None
        for e in s:
            if e.type == "response.output_text.delta":
                deltas += e.delta
            elif e.type in ("response.completed", "response.incomplete"):
                final = e.response
    check(final is not None, f"{model}: the stream ends with its response")
    check(deltas == final.output_text == r.output_text, f"{model}: streamed response has the same text")

    tools = [{"type": "function", "name": "get_weather", "description": "Current weather for a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                             "required": ["city"], "additionalProperties": False}, "strict": True}]
    c = client.responses.create(model=model, input="What is the weather in Paris?", tools=tools, tool_choice="required",
                                temperature=0, max_output_tokens=60)
    calls = [i for i in c.output if i.type == "function_call"]
    check(len(calls) == 1 and calls[0].name == "get_weather", f"{model}: a function_call item")
    args = json.loads(calls[0].arguments)
    check(isinstance(args.get("city"), str), f"{model}: arguments {args}")
    a = client.responses.create(model=model, tools=tools, tool_choice="none", temperature=0, max_output_tokens=40,
                                input=[{"role": "user", "content": "What is the weather in Paris?"}, calls[0],
                                       {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18C"}])
    check(a.output_text and not [i for i in a.output if i.type == "function_call"], f"{model}: answers after the output")

    first = client.responses.create(model=model, input="My name is Ada.", max_output_tokens=20, temperature=0)
    second = client.responses.create(model=model, input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=20, temperature=0)
    check(second.previous_response_id == first.id, f"{model}: previous_response_id echoed")
    check(second.usage.input_tokens > first.usage.input_tokens, f"{model}: the stored conversation is in the prompt")
    got = client.responses.retrieve(second.id)
    check(got.id == second.id and got.output_text == second.output_text, f"{model}: responses.retrieve")


def main():
    base, models = sys.argv[1], sys.argv[2:]
    key = os.environ.get("CORRAL_API_KEY")
    client = OpenAI(base_url=base, api_key=key or "unused", max_retries=0, timeout=300)
    print(f"openai {openai.__version__}")
    for m in models:
        run(client, m)
        run_responses(client, m)
    if key:
        wrong = OpenAI(base_url=base, api_key=key + "x", max_retries=0, timeout=30)
        try:
            wrong.models.list()
            check(False, "another key is refused")
        except openai.AuthenticationError as e:
            check(e.status_code == 401 and e.code == "invalid_api_key", "another key: AuthenticationError invalid_api_key")
    print("openai SDK: all checks passed")


if __name__ == "__main__":
    main()
