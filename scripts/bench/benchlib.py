"""What the benches share beyond scripts/lib/harness.py (the SSE client and the
launcher): the long prompt, one streamed completion's TTFT and decode rate, `corral serve`
over the two test models, llama.cpp's llama-server (built by scripts/peer/build), a
gateway's CPU time and RSS, medians and percentiles."""
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import GEMMA, MODELS_DIR, ROOT, SMOL, Server, completion, connect, free_port, stream  # noqa: E402

PROMPT = ("The history of the river valley is long. " * 30).strip()


def stream_once(target, model, gen, prompt=PROMPT, nonce=True):
    """One streamed completion: (ttft_s, decode_tok_s, tokens, final) where `final` holds
    the server's `usage` and (llama-server) `timings`. A random nonce in front of the
    prompt defeats prompt caches unless `nonce` is false."""
    s = stream(target, completion(model, prompt, gen, nonce))
    return s.ttft, s.decode_tok_s, s.tokens, {"usage": s.usage, "timings": s.timings}


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


def start_gateway(binary, threads, run_dir, extra=()):
    """`corral serve` over SmolLM2 (`smol`) and Gemma 3 (`gemma`) with a pool of one: a
    harness.Server (`.target`, `.pid`, `.stop()`)."""
    args = [binary, "serve", "--port", "0", "--runtime-dir", str(run_dir), "--model-pool", "1",
            "--threads", str(threads), "--model", f"smol={MODELS_DIR / SMOL}", "--model", f"gemma={MODELS_DIR / GEMMA}",
            *extra]
    return Server(args, "listening", env={**os.environ, "RUST_LOG": "warn"}, what="corral serve")


def peer_dir():
    """Where scripts/peer/build put llama-server and llama-bench (built on first use)."""
    out = subprocess.run([str(ROOT / "scripts/peer/build")], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def start_peer(model, threads, ctx=4096, extra=()):
    """llama.cpp's llama-server on `model` ($LLAMA_SERVER, else scripts/peer/build's): a
    harness.Server."""
    port = free_port()
    binary = os.environ.get("LLAMA_SERVER") or str(peer_dir() / "llama-server")
    return Server([binary, "-m", model, "--host", "127.0.0.1", "--port", port, "-t", threads, "-tb", threads, "-c", ctx,
                   *extra], ("health", port), deadline_s=120, what="llama-server")


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


