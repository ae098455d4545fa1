// Talking to the gateway: JSON calls, its error shape, and the event stream of a
// streaming answer. Same origin only (the page's CSP allows nothing else). A gateway
// started with --api-key answers 401 without it: the page then asks for the key once,
// keeps it in this browser (localStorage) and sends it as a bearer token.

const KEY = 'corral.apiKey';
/** Set when the person declined to give a key: asked again only after a reload. */
let declined = false;

function keptKey() {
  try {
    return globalThis.localStorage?.getItem(KEY) || '';
  } catch {
    return '';
  }
}

/** Ask for the key (one prompt at a time: prompt blocks); '' when declined. */
function askKey() {
  if (declined) return '';
  const k = (globalThis.prompt?.('This corral needs its API key (the one it was started with, --api-key).') || '').trim();
  if (!k) {
    declined = true;
    return '';
  }
  try {
    globalThis.localStorage?.setItem(KEY, k);
  } catch {
    // Not kept (storage off): it still serves this call.
  }
  return k;
}

/**
 * `fetch` of an API path with the kept key. A 401 with no newer key kept meanwhile
 * (another call may have asked already) asks for one and tries once more.
 */
export async function apiFetch(path, init = {}) {
  const send = (key) =>
    fetch(path, { ...init, headers: { ...init.headers, ...(key ? { authorization: `Bearer ${key}` } : {}) } });
  const used = keptKey();
  const resp = await send(used);
  if (resp.status !== 401) return resp;
  let key = keptKey();
  if (key === used) key = askKey();
  return key && key !== used ? send(key) : resp;
}

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
    resp = await apiFetch(path, {
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
