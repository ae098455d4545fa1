"""Capture llama.cpp (llama-cpp-python, CPU) reference outputs for corral's parity tests.

For each model this writes engine/tests/fixtures/oracle-<model>.json with:
  tokenize: [{text, ids}]    llama_tokenize(add_special=True, parse_special=True), as
                             llama.cpp's server tokenizes a prompt
  chat:     [{messages, rendered, ids}]  the chat template rendered the way llama.cpp's
                             Python server renders it (jinja2, trim/lstrip blocks) or, for a
                             model without a template, llama.cpp's built-in one
  greedy:   [{name, prompt_ids, tokens, margins, serial_tokens, serial_margins}]
                             64 greedy (argmax) tokens after the prompt; margins = top1 -
                             top2 logit at each step (small margins are where float noise
                             may legitimately flip the argmax). `tokens` evaluates the prompt
                             in one batch (llama.cpp's batched kernels); `serial_tokens`
                             feeds it one token at a time, so every row takes llama.cpp's
                             one-row (vec-dot) arithmetic: corral's default, batch-invariant
                             numerics reproduce that path.
"""
import argparse
import ctypes
import json
import platform
from pathlib import Path

import jinja2
import jinja2.sandbox
import llama_cpp
import numpy as np

N_GREEDY = 64

TOKENIZE_STRINGS = [
    # ASCII prose and punctuation
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "hello",
    " hello",
    "  hello",
    "Hello World HELLO world",
    "It's a dog's life; we'll see, they'd say, you're right, I've been, I'm here.",
    "What?! No... really??? Yes!!!",
    "a-b_c.d,e;f:g",
    "(parentheses) [brackets] {braces} <angles>",
    "email@example.com https://example.org/path?q=1&r=2#frag",
    "CamelCaseIdentifier snake_case_identifier SCREAMING_CASE",
    "",
    " ",
    # whitespace runs
    "a  b   c    d",
    "\n",
    "\n\n",
    "line one\nline two\n\nline four",
    "\ttab\tseparated\tvalues",
    "trailing spaces   ",
    "   leading spaces",
    "mixed \t \n whitespace\r\n windows",
    "                                        forty spaces",
    "\n\n\n\n\n\n\n\n",
    # code
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}",
    "#include <stdio.h>\nint main(void) { return 0; }",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "const x = (a, b) => a ?? b; // nullish",
    "{\"key\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\"}}",
    "<div class=\"box\"><p>Hi</p></div>",
    "    indented\n        twice",
    # numbers
    "0",
    "42",
    "1234567890",
    "3.14159265358979",
    "-17 +23 1e10 6.02e23",
    "2024-12-02 13:45:00",
    "1,000,000 and 1.000.000",
    "0x1F 0b1010 0o777",
    "phone: +1 (555) 123-4567",
    # accented Latin and other Latin-script languages
    "café naïve résumé coöperate",
    "Ça va? Où est la gare? Très bien.",
    "Müller straße Größe über",
    "Él está aquí; ¿qué pasa? ¡Olé!",
    "São Paulo, Ångström, Øresund, Łódź",
    # CJK and other scripts
    "你好，世界！",
    "日本語のテキストです。",
    "한국어 문장입니다.",
    "中文和English混合text",
    "Привет, мир!",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "Γειά σου Κόσμε",
    # emoji and symbols
    "😀",
    "I ❤️ Rust 🦀🚀",
    "👨‍👩‍👧‍👦 family",
    "🇫🇷🇯🇵 flags",
    "∑∫∂√∞ ≠ ≤ ≥ → ←",
    "©®™ §¶ •…",
    "\u00a0non-breaking\u00a0space",
    "zero\u200bwidth\u200bspace",
    # text that spells special tokens
    "<|im_start|>user\nHi<|im_end|>",
    "<|endoftext|>",
    "<start_of_turn>user\nHi<end_of_turn>\n",
    "<bos>hello<eos>",
    "<s>text</s>",
    "<unk> <pad> <mask>",
    "<0x41>",
    "<|im_start|><|im_start|>",
    "prefix<end_of_turn>suffix",
]

SMOL_CHATS = [
    ("capital", [{"role": "user", "content": "What is the capital of France?"}]),
    ("colors", [{"role": "system", "content": "You are a concise assistant."},
                {"role": "user", "content": "List three primary colors."}]),
    ("haiku", [{"role": "user", "content": "Write a haiku about the sea."}]),
    ("hashmap", [{"role": "user", "content": "Explain what a hash map is in one paragraph."}]),
    ("multiturn", [{"role": "user", "content": "Hi!"},
                   {"role": "assistant", "content": "Hello! How can I help you today?"},
                   {"role": "user", "content": "Tell me a fun fact about octopuses."}]),
    ("python", [{"role": "user", "content": "Write a Python function that reverses a string."}]),
    ("translate", [{"role": "user", "content": "Translate 'good morning' to Spanish and French."}]),
]

GEMMA_RAW = [
    ("capital", "The capital of France is"),
    ("fib", "def fibonacci(n):\n"),
    ("story", "Once upon a time, in a small village,"),
    ("colors", "The three primary colors are"),
    ("recipe", "To bake a simple loaf of bread, you will need"),
]

GEMMA_CHATS = [
    ("chat_capital", [{"role": "user", "content": "What is the capital of France?"}]),
    ("chat_system", [{"role": "system", "content": "Answer briefly."},
                     {"role": "user", "content": "Name a fruit that is yellow."}]),
]


def long_text() -> str:
    """~700 tokens of varied prose: long enough to cross a 512-token prefill chunk and
    Gemma's 512-token sliding window."""
    facts = [
        "Water boils at one hundred degrees Celsius at sea level.",
        "The Moon orbits the Earth roughly once every twenty-seven days.",
        "Honey never spoils if it is kept sealed and dry.",
        "Octopuses have three hearts and blue blood.",
        "The Great Wall of China is thousands of kilometres long.",
        "Bananas are botanically berries, while strawberries are not.",
        "Lightning is hotter than the surface of the Sun.",
        "A group of crows is called a murder.",
        "The Eiffel Tower grows slightly taller in summer heat.",
        "Sharks existed before trees appeared on land.",
        "Venus spins in the opposite direction to most planets.",
        "The human brain uses about a fifth of the body's energy.",
    ]
    lines = [f"Fact {i + 1}: {facts[i % len(facts)]}" for i in range(48)]
    return "Here is a numbered list of facts.\n" + "\n".join(lines) + "\nFact 49:"


class Oracle:
    def __init__(self, path: Path):
        self.llm = llama_cpp.Llama(
            model_path=str(path), n_ctx=4096, n_batch=512, n_threads=2, n_threads_batch=2,
            seed=0, logits_all=False, verbose=False,
        )
        self.model = self.llm.model

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)

    def meta(self, key: str):
        return self.llm.metadata.get(key)

    def render_jinja(self, messages) -> str:
        tmpl = self.meta("tokenizer.chat_template")
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(msg):
            raise jinja2.exceptions.TemplateError(msg)

        env.globals["raise_exception"] = raise_exception
        bos = self.llm.detokenize([self.llm.token_bos()], special=True).decode()
        eos = self.llm.detokenize([self.llm.token_eos()], special=True).decode()
        return env.from_string(tmpl).render(
            messages=messages, add_generation_prompt=True, bos_token=bos, eos_token=eos)

    def render_builtin(self, name: str, messages) -> str:
        arr = (llama_cpp.llama_chat_message * len(messages))()
        keep = []
        for i, m in enumerate(messages):
            role, content = m["role"].encode(), m["content"].encode()
            keep += [role, content]
            arr[i].role = ctypes.c_char_p(role)
            arr[i].content = ctypes.c_char_p(content)
        buf = ctypes.create_string_buffer(65536)
        n = llama_cpp.llama_chat_apply_template(name.encode(), arr, len(messages), True, buf, len(buf))
        assert 0 < n < len(buf), n
        return buf.raw[:n].decode("utf-8")

    def greedy(self, prompt_ids: list[int], serial: bool = False) -> tuple[list[int], list[float]]:
        self.llm.reset()
        if serial:
            for t in prompt_ids:
                self.llm.eval([t])
        else:
            self.llm.eval(prompt_ids)
        tokens, margins = [], []
        for _ in range(N_GREEDY):
            ptr = llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1)
            logits = np.ctypeslib.as_array(ptr, shape=(self.llm.n_vocab(),)).astype(np.float32)
            top2 = np.argpartition(-logits, 2)[:2]
            top2 = top2[np.argsort(-logits[top2])]
            tok = int(top2[0])
            tokens.append(tok)
            margins.append(round(float(logits[top2[0]] - logits[top2[1]]), 4))
            self.llm.eval([tok])
        return tokens, margins


def capture(path: Path, kind: str) -> dict:
    o = Oracle(path)
    out = {
        "model_file": path.name,
        "made_by": "scripts/models/oracle/run (scripts/models/oracle/capture.py)",
        "llama_cpp_python": llama_cpp.__version__,
        "machine": platform.machine(),
        "settings": "n_ctx=4096 n_batch=512 n_threads=2, default KV type (f16), greedy = argmax of logits",
        "tokenize": [{"text": s, "ids": o.tokenize(s)} for s in TOKENIZE_STRINGS],
        "chat": [],
        "greedy": [],
    }
    if kind == "smollm":
        for name, msgs in SMOL_CHATS:
            rendered = o.render_jinja(msgs)
            ids = o.tokenize(rendered)
            out["chat"].append({"name": name, "messages": msgs, "template": "gguf", "rendered": rendered, "ids": ids})
            out["greedy"].append({"name": name, "prompt_ids": ids})
        long_ids = o.tokenize(long_text())
        out["greedy"].append({"name": "long_raw", "prompt_ids": long_ids})
    else:
        for name, text in GEMMA_RAW:
            out["greedy"].append({"name": name, "prompt_ids": o.tokenize(text)})
        out["greedy"].append({"name": "long_raw", "prompt_ids": o.tokenize(long_text())})
        for name, msgs in GEMMA_CHATS:
            rendered = o.render_builtin("gemma", msgs)
            ids = o.tokenize(rendered)
            out["chat"].append({"name": name, "messages": msgs, "template": "builtin:gemma", "rendered": rendered, "ids": ids})
            out["greedy"].append({"name": name, "prompt_ids": ids})
    for g in out["greedy"]:
        g["tokens"], g["margins"] = o.greedy(g["prompt_ids"])
        g["serial_tokens"], g["serial_margins"] = o.greedy(g["prompt_ids"], serial=True)
        print(f"  {kind} {g['name']}: {len(g['prompt_ids'])} prompt tokens -> "
              f"{o.llm.detokenize(g['tokens']).decode('utf-8', 'replace')[:60]!r}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models-dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for fname, kind, out in [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm", "oracle-smollm2.json"),
        ("gemma-3-270m-q4_k_m.gguf", "gemma", "oracle-gemma3.json"),
    ]:
        data = capture(args.models_dir / fname, kind)
        (args.out / out).write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n")
        print(f"wrote {args.out / out}")


if __name__ == "__main__":
    main()
