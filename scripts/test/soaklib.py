"""The soak's client and its verdicts (scripts/test/soak).

`exchange` is a small raw HTTP/1.1 client: it reports exactly what came back (refused,
closed before a head, a status with a whole or cut body, the SSE events it saw, a read
that outlived its deadline) so that nothing a gateway does is smoothed over by a
library. `classify` turns one such record into an outcome with a reason, by the rules
written down in docs/reliability.md ("Soak"); it does no I/O, so it is checked on its own
(`python3 scripts/test/soaklib.py` runs its self-test).
"""
import json
import socket
import time
from dataclasses import dataclass, field

# Error codes our API documents for a request that failed on the engine's or the
# gateway's side (docs/gateway.md, "Crashes", "Proxy rules", "Shutdown"), by status.
DOCUMENTED = {
    429: {"queue_full"},
    502: {"engine_unavailable"},
    503: {"shutting_down", "engine_draining", "overloaded", "engine_start_failed", "engine_crash_loop"},
    504: {"engine_timeout"},
}
DOCUMENTED_CODES = set().union(*DOCUMENTED.values())
# Anthropic's shape carries a type, not our code.
ANTHROPIC_TYPES = {429: {"rate_limit_error"}, 502: {"api_error"}, 503: {"overloaded_error"}, 504: {"api_error"}}
ANTHROPIC_EVENT_TYPES = {"rate_limit_error", "api_error", "overloaded_error"}

# What a whole successful answer is on each route, and the event that ends a good stream.
WHOLE_MARK = {
    "/v1/chat/completions": ("object", "chat.completion"),
    "/v1/completions": ("object", "text_completion"),
    "/v1/messages": ("type", "message"),
    "/v1/responses": ("object", "response"),
}


def shape(route):
    return {"/v1/messages": "anthropic", "/v1/responses": "responses"}.get(route, "openai")


@dataclass
class Record:
    """What one request saw."""
    route: str
    stream: bool
    started: float = 0.0
    ended: float = 0.0
    refused: bool = False
    # Connection closed or reset before a whole response head.
    no_head: bool = False
    status: int = 0
    body: bytes = b""
    # The body ended as HTTP says it should (last chunk, or Content-Length reached).
    complete: bool = False
    # A read waited past the deadline.
    hung: bool = False
    # We hung up on purpose after `disconnect_after` events.
    disconnected: bool = False
    events: list = field(default_factory=list)  # (event name or None, data)


def _read_some(sock, buf, deadline):
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    sock.settimeout(left)
    data = sock.recv(65536)
    if not data:
        raise EOFError
    buf.extend(data)


def _take_line(sock, buf, deadline):
    while b"\r\n" not in buf:
        _read_some(sock, buf, deadline)
    i = buf.index(b"\r\n")
    line = bytes(buf[:i])
    del buf[:i + 2]
    return line


def _take(sock, buf, n, deadline):
    while len(buf) < n:
        _read_some(sock, buf, deadline)
    out = bytes(buf[:n])
    del buf[:n]
    return out


def parse_events(text):
    """Complete SSE events in `text` and the unparsed rest: [(event, data)], rest."""
    out = []
    while "\n\n" in text:
        raw, text = text.split("\n\n", 1)
        name, data = None, []
        for line in raw.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        if data:
            out.append((name, "\n".join(data)))
    return out, text


def exchange(addr, route, body, stream, deadline_s, disconnect_after=None):
    """POST `body` (a dict) to `route` at `addr` (host, port); never raises."""
    rec = Record(route=route, stream=stream, started=time.monotonic())
    deadline = rec.started + deadline_s
    payload = json.dumps(body).encode()
    head = (f"POST {route} HTTP/1.1\r\nHost: 127.0.0.1:{addr[1]}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n").encode()
    try:
        sock = socket.create_connection(addr, timeout=10)
    except ConnectionRefusedError:
        rec.refused = True
        rec.ended = time.monotonic()
        return rec
    except OSError:
        rec.no_head = True
        rec.ended = time.monotonic()
        return rec
    buf = bytearray()
    try:
        sock.sendall(head + payload)
        status_line = _take_line(sock, buf, deadline)
        rec.status = int(status_line.split()[1])
        headers = {}
        while True:
            line = _take_line(sock, buf, deadline)
            if not line:
                break
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
    except TimeoutError:
        rec.hung = True
        sock.close()
        rec.ended = time.monotonic()
        return rec
    except (EOFError, OSError, ValueError, IndexError):
        rec.no_head = True
        sock.close()
        rec.ended = time.monotonic()
        return rec
    text, body_bytes = "", bytearray()
    try:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int(_take_line(sock, buf, deadline).split(b";")[0], 16)
                if size == 0:
                    _take_line(sock, buf, deadline)
                    rec.complete = True
                    break
                piece = _take(sock, buf, size + 2, deadline)[:size]
                body_bytes.extend(piece)
                if disconnect_after is not None and rec.stream and rec.status == 200:
                    evs, text = parse_events(text + piece.decode("utf-8", "replace"))
                    rec.events.extend(evs)
                    if disconnect_after is not None and len(rec.events) >= disconnect_after:
                        rec.disconnected = True
                        break
        elif "content-length" in headers:
            body_bytes.extend(_take(sock, buf, int(headers["content-length"]), deadline))
            rec.complete = True
        else:
            while True:
                try:
                    _read_some(sock, buf, deadline)
                except EOFError:
                    break
            body_bytes.extend(buf)
            rec.complete = True
    except TimeoutError:
        rec.hung = True
    except (EOFError, OSError, ValueError):
        pass  # a cut body: `complete` stays false
    finally:
        sock.close()
    rec.body = bytes(body_bytes)
    if rec.stream and rec.status == 200 and not rec.disconnected:
        evs, _ = parse_events(rec.body.decode("utf-8", "replace"))
        rec.events = evs
    rec.ended = time.monotonic()
    return rec


def _json(data):
    try:
        return json.loads(data)
    except (ValueError, TypeError):
        return None


def error_event(route, name, data):
    """The documented code (or Anthropic type) of an error event, '' for another
    error event, None when the event is not an error."""
    v = _json(data)
    if shape(route) == "openai":
        if isinstance(v, dict) and isinstance(v.get("error"), dict):
            return v["error"].get("code") or ""
        return None
    if shape(route) == "anthropic":
        if name == "error" or (isinstance(v, dict) and v.get("type") == "error"):
            return ((v or {}).get("error") or {}).get("type") or ""
        return None
    if name == "error" or (isinstance(v, dict) and v.get("type") == "error"):
        return (v or {}).get("code") or ""
    if isinstance(v, dict) and v.get("type") == "response.failed":
        return (((v.get("response") or {}).get("error")) or {}).get("code") or ""
    return None


def good_end(route, name, data):
    """Whether this event is the one a successful stream ends with."""
    if shape(route) == "openai":
        return data.strip() == "[DONE]"
    v = _json(data) or {}
    if shape(route) == "anthropic":
        return name == "message_stop" or v.get("type") == "message_stop"
    return v.get("type") in ("response.completed", "response.incomplete")


def documented_error(route, status, body):
    """Whether a non-200 answer is one of our documented failures, and its code."""
    v = _json(body)
    if not isinstance(v, dict) or not isinstance(v.get("error"), dict):
        return False, f"{status} without an error body"
    if shape(route) == "anthropic":
        t = v["error"].get("type", "")
        return t in ANTHROPIC_TYPES.get(status, set()), f"{status} {t}"
    code = v["error"].get("code", "")
    return code in DOCUMENTED.get(status, set()), f"{status} {code}"


def classify(rec, in_restart_window):
    """(outcome, reason): outcome is completed, failed, disconnected or lost."""
    if rec.refused:
        return ("failed", "refused during restart") if in_restart_window else ("lost", "connection refused")
    if rec.hung:
        return "lost", "no progress before the deadline"
    if rec.no_head:
        return ("failed", "closed before a head during restart") if in_restart_window else \
            ("lost", "closed before a response head")
    if rec.status != 200:
        ok, why = documented_error(rec.route, rec.status, rec.body)
        if not rec.complete:
            return "lost", f"{why}: body cut"
        return ("failed", why) if ok else ("lost", f"undocumented {why}")
    if rec.disconnected:
        return "disconnected", "client hung up mid-stream"
    if not rec.stream:
        v = _json(rec.body)
        key, want = WHOLE_MARK[rec.route]
        if rec.complete and isinstance(v, dict) and v.get(key) == want:
            return "completed", "ok"
        return "lost", "200 with a cut or unreadable body"
    errors = [(i, error_event(rec.route, n, d)) for i, (n, d) in enumerate(rec.events)]
    errors = [(i, c) for i, c in errors if c is not None]
    if errors:
        i, code = errors[0]
        if any(good_end(rec.route, n, d) for n, d in rec.events[i:]):
            return "lost", "a success marker after an error event"
        documented = code in DOCUMENTED_CODES or (shape(rec.route) == "anthropic" and code in ANTHROPIC_EVENT_TYPES)
        return ("failed", f"stream error {code}") if documented else ("lost", f"undocumented stream error {code!r}")
    if rec.events and good_end(rec.route, *rec.events[-1]) and rec.complete:
        return "completed", "ok"
    return "lost", "stream ended without its end marker or an error event"


def _self_test():
    def rec(**kw):
        r = Record(route=kw.pop("route", "/v1/chat/completions"), stream=kw.pop("stream", True))
        for k, v in kw.items():
            setattr(r, k, v)
        return r
    done = [(None, '{"choices":[]}'), (None, "[DONE]")]
    err = (None, json.dumps({"error": {"code": "engine_unavailable"}}))
    assert classify(rec(status=200, complete=True, events=done), False) == ("completed", "ok")
    assert classify(rec(status=200, complete=False, events=done[:1]), False)[0] == "lost"
    assert classify(rec(status=200, complete=False, events=done[:1] + [err]), False)[0] == "failed"
    assert classify(rec(status=200, complete=True, events=[err, done[1]]), False)[0] == "lost"
    assert classify(rec(refused=True), True)[0] == "failed"
    assert classify(rec(refused=True), False)[0] == "lost"
    assert classify(rec(hung=True), True)[0] == "lost"
    body = json.dumps({"error": {"code": "engine_unavailable"}}).encode()
    assert classify(rec(stream=False, status=502, complete=True, body=body), False)[0] == "failed"
    assert classify(rec(stream=False, status=500, complete=True, body=body), False)[0] == "lost"
    a = json.dumps({"type": "error", "error": {"type": "overloaded_error"}}).encode()
    assert classify(rec(route="/v1/messages", stream=False, status=503, complete=True, body=a), False)[0] == "failed"
    ev = [("message_start", "{}"), ("message_stop", '{"type":"message_stop"}')]
    assert classify(rec(route="/v1/messages", status=200, complete=True, events=ev), False)[0] == "completed"
    ev = [(None, json.dumps({"type": "response.created"})), ("error", json.dumps({"type": "error", "code": "engine_timeout"}))]
    assert classify(rec(route="/v1/responses", status=200, complete=False, events=ev), False)[0] == "failed"
    whole = json.dumps({"object": "text_completion"}).encode()
    assert classify(rec(route="/v1/completions", stream=False, status=200, complete=True, body=whole), False)[0] == "completed"
    assert parse_events("event: a\ndata: 1\n\ndata: 2\n\n: c\n\ndata: 3") == ([("a", "1"), (None, "2")], "data: 3")
    print("soaklib: self-test passed")


if __name__ == "__main__":
    _self_test()
