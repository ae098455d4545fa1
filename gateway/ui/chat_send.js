// One streamed chat answer: the request (history, system prompt, only the settings the
// person set, usage asked for), the stream folded into an answer as it arrives, and the
// numbers shown under it. Stopping aborts the fetch; the gateway drops the engine
// connection and the engine stops generating within a step.

import { ApiError, apiFetch, errorOf, sseEvents, unreachable } from './api.js';
import { requestFields, systemMessage } from './settings.js';

/** The messages sent for a conversation: its turns, without failed or empty answers. */
export function historyOf(messages) {
  const out = [];
  for (const m of messages) {
    if (m.role === 'user') out.push({ role: 'user', content: m.content });
    else if (m.role === 'assistant' && !m.error && (m.content || m.tool_calls?.length)) {
      const turn = { role: 'assistant', content: m.content || null };
      if (m.tool_calls?.length) turn.tool_calls = m.tool_calls;
      out.push(turn);
    }
  }
  return out;
}

/** The request body, or throws an ApiError naming a setting that cannot be sent. */
export function buildRequest(model, messages, settings) {
  const fields = requestFields(settings);
  if (fields.error) throw new ApiError(400, 'invalid_setting', fields.error);
  const system = systemMessage(settings);
  return {
    model,
    messages: system ? [system, ...historyOf(messages)] : historyOf(messages),
    stream: true,
    stream_options: { include_usage: true },
    ...fields,
  };
}

/** Fold one tool-call delta into the list (OpenAI streams them in pieces by index). */
function mergeToolCalls(calls, deltas) {
  for (const d of deltas) {
    const i = d.index ?? calls.length;
    const c = (calls[i] ||= { id: '', type: 'function', function: { name: '', arguments: '' } });
    if (d.id) c.id = d.id;
    if (d.type) c.type = d.type;
    if (d.function?.name) c.function.name += d.function.name;
    if (d.function?.arguments) c.function.arguments += d.function.arguments;
  }
}

/**
 * Stream an answer into `answer` (an assistant message object), calling `onUpdate()`
 * after each change. Resolves when the stream ends; throws ApiError (HTTP error, error
 * event, cut stream) or AbortError (stopped).
 */
export async function streamAnswer({ body, answer, signal, onUpdate, onHead }) {
  // Kept on the answer so a stopped or failed answer still gets its numbers.
  const tm = (answer.timing ||= { t0: performance.now(), first: null, last: null, pieces: 0 });
  let resp;
  try {
    resp = await apiFetch('/v1/chat/completions', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
      signal,
    });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw unreachable(e);
  }
  onHead?.();
  if (!resp.ok) throw await errorOf(resp);
  const warning = resp.headers.get('warning');
  if (warning) answer.warning = warning;
  answer.content = answer.content || '';
  for await (const ev of sseEvents(resp)) {
    if (ev.error) {
      const e = ev.error;
      throw new ApiError(e.code === 'engine_timeout' ? 504 : 502, e.code || e.type, e.message);
    }
    if (ev.usage) answer.usage = ev.usage;
    const choice = ev.choices?.[0];
    if (!choice) continue;
    const d = choice.delta || {};
    let grew = false;
    if (d.content) {
      answer.content += d.content;
      grew = true;
    }
    if (d.reasoning_content) {
      answer.reasoning = (answer.reasoning || '') + d.reasoning_content;
      grew = true;
    }
    if (d.tool_calls) {
      answer.tool_calls ||= [];
      mergeToolCalls(answer.tool_calls, d.tool_calls);
      grew = true;
    }
    if (grew) {
      const now = performance.now();
      tm.first ??= now;
      tm.last = now;
      tm.pieces += 1;
    }
    if (choice.finish_reason) answer.finish = choice.finish_reason;
    onUpdate();
  }
  answer.stats = statsOf(answer.usage, tm);
  onUpdate();
}

/**
 * The numbers under an answer: tokens (prompt, cached, completion), time to the first
 * token and the decode rate between the first and the last token.
 */
export function statsOf(usage, { t0, first, last, pieces }) {
  const completion = usage?.completion_tokens ?? pieces;
  const decodeS = first !== null && last !== null ? (last - first) / 1000 : 0;
  return {
    prompt: usage?.prompt_tokens ?? null,
    cached: usage?.prompt_tokens_details?.cached_tokens ?? null,
    completion,
    ttft_s: first !== null ? (first - t0) / 1000 : null,
    tok_s: decodeS > 0 && completion > 1 ? (completion - 1) / decodeS : null,
  };
}
