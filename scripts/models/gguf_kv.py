"""GGUF metadata for make-gguf: reading a llama.cpp vocab-only file's `tokenizer.*`
entries (the real vocabularies), and encoding version-3 key/value entries. Standard
library and numpy only.
"""
import os
import struct

import numpy as np


# ---- reading a GGUF's metadata (the vocabulary files) ----

_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _skip_value(b, at, t):
    if t in _SCALAR:
        return at + _SCALAR[t]
    if t == 8:
        (n,) = struct.unpack_from("<Q", b, at)
        return at + 8 + n
    if t == 9:
        et, n = struct.unpack_from("<IQ", b, at)
        at += 12
        if et in _SCALAR:
            return at + n * _SCALAR[et]
        for _ in range(n):
            at = _skip_value(b, at, et)
        return at
    raise ValueError(f"GGUF value type {t}")


def gguf_metadata(path):
    """{key: (type, raw bytes of the whole entry)} of a GGUF file's metadata."""
    with open(path, "rb") as f:
        b = f.read()
    if b[:4] != b"GGUF":
        raise SystemExit(f"{path} is not a GGUF file")
    _, _, n_kv = struct.unpack_from("<IQQ", b, 4)
    at, out = 24, {}
    for _ in range(n_kv):
        start = at
        (n,) = struct.unpack_from("<Q", b, at)
        key = b[at + 8:at + 8 + n].decode()
        (t,) = struct.unpack_from("<I", b, at + 8 + n)
        at = _skip_value(b, at + 12 + n, t)
        out[key] = (t, b[start:at], b[start + 12 + n:at])
    return out


def vocab_dir():
    d = os.environ.get("CORRAL_VOCAB_DIR")
    return d if d else os.path.join(os.path.expanduser("~"), ".cache", "corral", "vocab")


def real_vocabulary(name):
    """(number of tokens, encoded tokenizer.* entries) of llama.cpp's vocab file `name`."""
    path = os.path.join(vocab_dir(), f"ggml-vocab-{name}.gguf")
    if not os.path.exists(path):
        maker = "scripts/models/vocab-o200k" if name == "o200k-harmony" else "scripts/models/vocab"
        raise SystemExit(f"{path} is missing: run {maker} (or set CORRAL_VOCAB_DIR)")
    meta = gguf_metadata(path)
    _, _, tokens = meta["tokenizer.ggml.tokens"]
    (n,) = struct.unpack_from("<Q", tokens, 4)
    return n, [raw for k, (_, raw, _) in meta.items() if k.startswith("tokenizer.")]


# ---- GGUF (version 3) encoding ----

def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, value, kind):
    scalar = {"u32": (4, "<I"), "i32": (5, "<i"), "f32": (6, "<f"), "bool": (7, "<?")}
    if kind in scalar:
        t, fmt = scalar[kind]
        return gstr(key) + struct.pack("<I", t) + struct.pack(fmt, value)
    if kind == "str":
        return gstr(key) + struct.pack("<I", 8) + gstr(value)
    if kind == "strs":
        return gstr(key) + struct.pack("<IIQ", 9, 8, len(value)) + b"".join(gstr(s) for s in value)
    if kind in ("f32s", "i32s", "bools"):
        t, dt = {"f32s": (6, "<f4"), "i32s": (5, "<i4"), "bools": (7, "u1")}[kind]
        return gstr(key) + struct.pack("<IIQ", 9, t, len(value)) + np.asarray(value, dtype=dt).tobytes()
    raise ValueError(kind)
