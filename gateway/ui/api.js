// Talking to the gateway: JSON calls, its error shape, and the event stream of a
// streaming answer. Same origin only (the page's CSP allows nothing else).

/** An error as the API returns it: `{"error":{"message","type","code"}}`. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message || code || `HTTP ${status}`);
    this.name = 'ApiError';
    this.status = status;
    this.code = code || '';
  }
}

/** The ApiError of a non-2xx response (whatever its body). */
export async function errorOf(resp) {
  let text = '';
  try {
    text = await resp.text();
    const e = JSON.parse(text).error || {};
    return new ApiError(resp.status, e.code || e.type, e.message);
  } catch {
    return new ApiError(resp.status, '', text.slice(0, 300) || resp.statusText);
  }
}

/** A network failure (the gateway is not reachable at all). */
export function unreachable(err) {
  return new ApiError(0, 'unreachable', `cannot reach corral (${err.message || err})`);
}

async function call(method, path, body, signal) {
  let resp;
  try {
    resp = await fetch(path, {
      method,
      signal,
      headers: body === undefined ? {} : { 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw unreachable(e);
  }
  if (!resp.ok) throw await errorOf(resp);
  return resp.json();
}

export const getJson = (path, signal) => call('GET', path, undefined, signal);
export const postJson = (path, body, signal) => call('POST', path, body, signal);

/**
 * The data events of an SSE response, parsed as JSON, until `[DONE]`.
 * A stream that ends without `[DONE]` was cut: the error event before the cut (the
 * gateway's `{"error":…}`) is yielded like any event and the caller decides.
 */
export async function* sseEvents(resp) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  let done = false;
  try {
    while (!done) {
      let chunk;
      try {
        chunk = await reader.read();
      } catch (e) {
        if (e.name === 'AbortError') throw e;
        // The connection broke mid-body (the gateway cuts a failed stream this way).
        throw new ApiError(502, 'stream_cut', 'the answer was cut off');
      }
      if (chunk.done) break;
      buf += decoder.decode(chunk.value, { stream: true });
      let end;
      while ((end = buf.search(/\r?\n\r?\n/)) >= 0) {
        const block = buf.slice(0, end);
        buf = buf.slice(end).replace(/^\r?\n\r?\n/, '');
        const data = block
          .split(/\r?\n/)
          .filter((l) => l.startsWith('data:'))
          .map((l) => l.slice(5).replace(/^ /, ''))
          .join('\n');
        if (!data) continue; // a comment (`: keep-alive`) or an event name alone
        if (data === '[DONE]') {
          done = true;
          break;
        }
        try {
          yield JSON.parse(data);
        } catch {
          throw new ApiError(502, 'bad_event', `unreadable event: ${data.slice(0, 120)}`);
        }
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
  if (!done) throw new ApiError(502, 'stream_cut', 'the answer was cut off before it finished');
}
