"""What the scripts share to drive a live server: HTTP to a TCP port or a unix socket,
the one SSE client, and the one launcher. Standard library only (it runs on GPU machines
where nothing is installed); no script keeps a copy of either.

- `stream` sends one streamed /v1/completions or /v1/chat/completions and notes when each
  event and each piece of text arrived, the text, and the usage (and llama-server's
  `timings`); TTFT and decode tok/s are read off the result, the same way for every
  bench.
- `Server` starts `corral serve`, `corral engine` or llama.cpp's `llama-server`, waits
  until it is ready (corral serve's listening event, a /health that answers, or an engine
  socket), and stops it: SIGTERM, a bounded wait, then SIGKILL to its process group.
- `python3 scripts/lib/harness.py listening OUT PID [ERR]`: the same wait for a
  `corral serve` a shell script started with stdout in OUT; prints its address.

A target is ("tcp", (host, port)) or ("unix", path).
"""
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS_DIR = Path(os.environ.get("CORRAL_MODELS_DIR") or Path.home() / ".cache/corral/models")
SMOL, GEMMA = "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"
# The two test models (scripts/models/fetch) by the ids the scripts serve them under.
TEST_MODELS = {"smol": SMOL, "gemma": GEMMA}


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=600):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def connect(target, timeout=600):
    kind, where = target
    if kind == "unix":
        return UnixConnection(where, timeout)
    host, port = where
    return http.client.HTTPConnection(host, port, timeout=timeout)


def request_json(target, method, path, body=None, timeout=600):
    c = connect(target, timeout)
    if body is None:
        c.request(method, path)
    else:
        c.request(method, path, json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"{method} {path}: {r.status} {data[:300]!r}")
    return json.loads(data)


def get_json(target, path, timeout=600):
    return request_json(target, "GET", path, timeout=timeout)


def post_json(target, path, body, timeout=600):
    return request_json(target, "POST", path, body, timeout)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tcp_target(addr):
    host, _, port = addr.rpartition(":")
    return "tcp", (host.strip("[]"), int(port))


def wait_for(what, ready, deadline_s, interval=0.1, alive=None):
    """Poll `ready()` until it returns a true value, which is returned; an exception counts
    as not yet. Raises RuntimeError past the deadline, or at once when `alive()` is false."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            got = ready()
            if got:
                return got
        except Exception:  # noqa: BLE001 - not ready yet, whatever it says
            pass
        if alive is not None and not alive():
            raise RuntimeError(f"{what}: the process exited")
        if time.monotonic() >= end:
            raise RuntimeError(f"{what}: not ready in {deadline_s:.0f} s")
        time.sleep(interval)


# ---- the SSE client ----

def completion(model, prompt, gen, nonce=True):
    """A greedy /v1/completions body of exactly `gen` tokens (`ignore_eos`). A random nonce
    in front of the prompt defeats prompt caches unless `nonce` is false; `model` None
    leaves the field out (an engine's own socket serves one model)."""
    body = {"prompt": (f"[{random.getrandbits(48):012x}] " if nonce else "") + prompt, "max_tokens": gen,
            "temperature": 0, "ignore_eos": True}
    if model is not None:
        body["model"] = model
    return body


@dataclass
class Streamed:
    """What one streamed answer brought, times on the clock `stream` was given."""
    sent: float
    events: list = field(default_factory=list)    # arrival of each event that carried choices
    arrivals: list = field(default_factory=list)  # arrival of each event that carried text
    pieces: list = field(default_factory=list)    # that text
    usage: dict = None
    timings: dict = None                          # llama-server's own figures

    @property
    def tokens(self):
        return (self.usage or {}).get("completion_tokens") or len(self.arrivals)

    @property
    def text(self):
        return "".join(self.pieces)

    @property
    def ttft(self):
        """Seconds from the send to the first text."""
        if not self.arrivals:
            raise RuntimeError("no tokens streamed")
        return self.arrivals[0] - self.sent

    @property
    def decode_tok_s(self):
        """Tokens after the first over the time from the first text to the last."""
        if not self.arrivals:
            raise RuntimeError("no tokens streamed")
        span = self.arrivals[-1] - self.arrivals[0]
        return (self.tokens - 1) / span if span > 0 else float("nan")


def stream(target, body, route="/v1/completions", timeout=600, conn=None, clock=time.perf_counter):
    """POST `body` to `route` streamed (usage in the last chunk) and read every event to the
    end of the body. `conn` reuses a kept-alive connection (left open). Raises on a status
    other than 200, an error event, or a stream without choices."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    c = conn or connect(target, timeout)
    out = Streamed(sent=clock())
    c.request("POST", route, json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{route}: HTTP {r.status}: {r.read()[:300]!r}")
    while raw := r.readline():
        now = clock()
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if "error" in ev:
            raise RuntimeError(f"stream error: {ev}")
        out.usage = ev.get("usage") or out.usage
        out.timings = ev.get("timings") or out.timings
        choices = ev.get("choices") or []
        if not choices:
            continue
        out.events.append(now)
        piece = "".join(ch.get("text") or (ch.get("delta") or {}).get("content") or "" for ch in choices)
        if piece:
            out.arrivals.append(now)
            out.pieces.append(piece)
    if conn is None:
        c.close()
    if not out.events:
        raise RuntimeError(f"{route}: no choices streamed")
    return out


# ---- the launcher ----

def listening(out_path):
    """The address in the listening event `corral serve` writes first on stdout, once that
    line is whole (None before)."""
    try:
        text = Path(out_path).read_text()
    except FileNotFoundError:
        return None
    if "\n" not in text:
        return None
    ev = json.loads(text.split("\n", 1)[0])
    if ev.get("event") != "listening":
        raise RuntimeError(f"expected the listening event first, got {ev}")
    return ev["addr"]


def require_test_models(who):
    """Exit with a message naming scripts/models/fetch when a test model is missing."""
    for f in TEST_MODELS.values():
        if not (MODELS_DIR / f).is_file():
            sys.exit(f"{who}: {MODELS_DIR / f} missing; run scripts/models/fetch")


def corral_binary(*also):
    """$CORRAL_BIN, else a release build of `corral` (and of the other packages' binaries
    named, e.g. corral-fake-engine, which land beside it), made or brought up to date here."""
    if os.environ.get("CORRAL_BIN"):
        return os.environ["CORRAL_BIN"]
    cmd = ["cargo", "build", "--release", "--quiet", "-p", "corral"]
    for b in also:
        cmd += ["-p", b]
    subprocess.run(cmd, cwd=ROOT, check=True)
    return str(ROOT / "target/release/corral")


class Server:
    """One server process, in a process group of its own, started and waited for.

    `ready` says how to know it serves:
      "listening"       corral serve: the listening event it writes first on stdout;
      ("health", port)  GET /health on 127.0.0.1:port answers 200 (llama-server);
      ("socket", path)  the unix socket exists (corral engine).
    stderr goes to `log` (a temporary file when None); stdout too, except corral serve's,
    which goes beside it with the suffix .out. `target` and `addr` say where it listens.
    """

    def __init__(self, cmd, ready, *, env=None, log=None, deadline_s=60, stdin=None, what=None):
        self.what = what or Path(str(cmd[0])).name
        self._tmp = None if log else tempfile.mkdtemp(prefix="corral-server-")
        self.log_path = Path(log) if log else Path(self._tmp) / "server.log"
        self.out_path = self.log_path.with_suffix(".out") if ready == "listening" else self.log_path
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as err:
            out = open(self.out_path, "w") if self.out_path != self.log_path else err
            try:
                self.p = subprocess.Popen([str(c) for c in cmd], stdin=subprocess.DEVNULL if stdin is None else stdin,
                                          stdout=out, stderr=err, env=env, start_new_session=True)
            finally:
                if out is not err:
                    out.close()
        alive = lambda: self.p.poll() is None  # noqa: E731
        try:
            if ready == "listening":
                self.addr = wait_for(self.what, lambda: listening(self.out_path), deadline_s, alive=alive)
                self.target = tcp_target(self.addr)
            elif ready[0] == "health":
                self.addr = f"127.0.0.1:{ready[1]}"
                self.target = tcp_target(self.addr)
                wait_for(self.what, lambda: get_json(self.target, "/health", timeout=10) is not None, deadline_s,
                         alive=alive)
            elif ready[0] == "socket":
                self.addr, self.target = ready[1], ("unix", ready[1])
                wait_for(self.what, lambda: os.path.exists(ready[1]), deadline_s, interval=0.05, alive=alive)
            else:
                raise ValueError(f"unknown readiness {ready!r}")
        except BaseException as e:
            tail = self.tail()
            self.stop(5)
            if isinstance(e, RuntimeError):
                raise RuntimeError(f"{e} (exit {self.p.returncode}): {tail}") from None
            raise

    @property
    def pid(self):
        return self.p.pid

    def tail(self, lines=8):
        try:
            return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, deadline_s=30):
        """SIGTERM to the server alone (a gateway stops its own engines), a bounded wait,
        then SIGKILL to its process group: (exit code, seconds), the code None when it
        had to be killed."""
        t0 = time.monotonic()
        if self.p.stdin:
            self.p.stdin.close()  # an engine's lifeline
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            code = self.p.wait(deadline_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.p.wait()
            code = None
        if self._tmp:
            for f in (self.log_path, self.out_path):
                f.unlink(missing_ok=True)
            os.rmdir(self._tmp)
            self._tmp = None
        return code, time.monotonic() - t0


def _main(argv):
    if len(argv) not in (3, 4) or argv[0] != "listening":
        sys.exit("usage: harness.py listening OUT_FILE PID [ERR_FILE]")
    out, pid = argv[1], int(argv[2])

    def alive():
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False

    try:
        print(wait_for("corral serve", lambda: listening(out), 60, alive=alive))
    except RuntimeError as e:
        if len(argv) == 4 and os.path.exists(argv[3]):
            sys.stderr.write(Path(argv[3]).read_text(errors="replace")[-4000:])
        sys.exit(str(e))


if __name__ == "__main__":
    _main(sys.argv[1:])
