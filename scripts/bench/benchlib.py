"""Shared helpers for scripts/bench/*: HTTP over TCP or a unix socket, a streaming
client, starting corral and llama.cpp's llama-server, medians."""
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS_DIR = Path(os.environ.get("CORRAL_MODELS_DIR") or Path.home() / ".cache/corral/models")
SMOL, GEMMA = "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"
PROMPT = ("The history of the river valley is long. " * 30).strip()


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=600):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def connect(target):
    kind, where = target
    if kind == "unix":
        return UnixConnection(where)
    host, port = where
    return http.client.HTTPConnection(host, port, timeout=600)


def get_json(target, path):
    c = connect(target)
    c.request("GET", path)
    r = c.getresponse()
    body = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"GET {path}: {r.status} {body[:200]!r}")
    return json.loads(body)


def post_json(target, path, body):
    c = connect(target)
    c.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"{path}: {r.status} {data[:300]!r}")
    return json.loads(data)


def stream_once(target, model, gen, prompt=PROMPT, nonce=True):
    """One streamed completion: (ttft_s, decode_tok_s, tokens, final) where `final` holds
    the server's `usage` and (llama-server) `timings`. A random nonce in front of the
    prompt defeats prompt caches unless `nonce` is false."""
    nonce = f"[{random.getrandbits(48):012x}] " if nonce else ""
    body = {"model": model, "prompt": nonce + prompt, "max_tokens": gen, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    c = connect(target)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"stream: {r.status} {r.read()[:300]!r}")
    first = last = None
    chunks = 0
    usage = timings = None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            break
        ev = json.loads(data)
        if "error" in ev:
            raise RuntimeError(f"stream error: {ev}")
        if ev.get("usage"):
            usage = ev["usage"]
        if ev.get("timings"):
            timings = ev["timings"]
        if any(ch.get("text") for ch in ev.get("choices", [])):
            now = time.perf_counter()
            first = first or now
            last = now
            chunks += 1
    c.close()
    tokens = (usage or {}).get("completion_tokens") or chunks
    if first is None:
        raise RuntimeError("no tokens streamed")
    decode = (tokens - 1) / (last - first) if last > first else float("nan")
    return first - t0, decode, tokens, {"usage": usage, "timings": timings}


def cpu_s(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rejected_ms(target):
    body = json.dumps({"model": "smol", "prompt": "x", "max_tokens": -1})
    c = connect(target)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"content-type": "application/json"})
    r = c.getresponse()
    r.read()
    c.close()
    assert r.status == 400, r.status
    return (time.perf_counter() - t0) * 1000


def rss_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def corral_binary():
    if os.environ.get("CORRAL_BIN"):
        return os.environ["CORRAL_BIN"]
    subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "corral"], cwd=ROOT, check=True)
    return str(ROOT / "target/release/corral")


def start_gateway(binary, threads, run_dir, extra=()):
    """`corral serve` over SmolLM2 (`smol`) and Gemma 3 (`gemma`) with a pool of one."""
    port = free_port()
    args = [binary, "serve", "--port", str(port), "--runtime-dir", str(run_dir), "--model-pool", "1",
            "--threads", str(threads), "--model", f"smol={MODELS_DIR / SMOL}", "--model", f"gemma={MODELS_DIR / GEMMA}",
            *extra]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={**os.environ, "RUST_LOG": "warn"}, text=True)
    line = p.stdout.readline()
    ev = json.loads(line)
    assert ev["event"] == "listening", line
    threading.Thread(target=p.stdout.read, daemon=True).start()
    return p, ("tcp", ("127.0.0.1", port))


def peer_dir():
    """Where scripts/peer/build put llama-server and llama-bench (built on first use)."""
    out = subprocess.run([str(ROOT / "scripts/peer/build")], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def start_peer(model, threads, ctx=4096, extra=()):
    """llama.cpp's llama-server on `model` ($LLAMA_SERVER, else scripts/peer/build's):
    (pid, target)."""
    port = free_port()
    binary = os.environ.get("LLAMA_SERVER") or str(peer_dir() / "llama-server")
    p = subprocess.Popen([binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
                          "-tb", str(threads), "-c", str(ctx), *extra],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            get_json(("tcp", ("127.0.0.1", port)), "/health")
            break
        except Exception:
            if p.poll() is not None:
                sys.exit(f"llama-server exited with {p.returncode}")
            time.sleep(0.2)
    return p.pid, ("tcp", ("127.0.0.1", port))


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


