// How a chat message looks: the person's text as text, the model's answer as safe
// markdown (markdown.js), with its reasoning, tool calls, a JSON answer pretty-printed,
// the numbers of the answer, and what went wrong in words a person can act on.

import { h } from './dom.js';
import { rate } from './format.js';
import { renderMarkdown } from './markdown.js';

/** An error as a sentence: what happened to this model, and what happens next. */
export function explain(err, model) {
  const code = err.code || '';
  const msg = err.message || '';
  switch (code) {
    case 'engine_unavailable':
    case 'stream_cut':
      return `The ${model} engine stopped while answering (${code}). It restarts on your next message.`;
    case 'engine_start_failed':
      return `The ${model} engine failed to start: ${msg}`;
    case 'engine_crash_loop':
      return `The ${model} engine keeps crashing and is paused for a minute: ${msg}`;
    case 'engine_config':
      return `${model} cannot be served: ${msg}`;
    case 'engine_timeout':
      return `The ${model} engine did not answer in time (${msg}). It is restarted on your next message.`;
    case 'engine_draining':
      return `The ${model} engine is stopping; send again in a moment.`;
    case 'overloaded':
    case 'queue_full':
      return `corral is busy (${code}); send again in a moment.`;
    case 'model_not_found':
      return `The server does not have ${model}: ${msg}`;
    case 'unreachable':
      return `${msg}. Is corral still running?`;
    case 'shutting_down':
      return 'corral is shutting down.';
    default:
      return msg ? `${msg}${code ? ` (${code})` : ''}` : `The request failed (${code || 'error'}).`;
  }
}

/** The answer parsed as JSON when it is a JSON object or list (structured output). */
function asJson(text) {
  const t = (text || '').trim();
  if (!/^[[{]/.test(t)) return null;
  try {
    return JSON.parse(t);
  } catch {
    return null;
  }
}

function prettyArgs(args) {
  try {
    return JSON.stringify(JSON.parse(args), null, 2);
  } catch {
    return args;
  }
}

function statsLine(m) {
  const s = m.stats;
  if (!s) return null;
  const parts = [];
  parts.push(`${s.completion} tokens`);
  if (s.tok_s !== null) parts.push(`${rate(s.tok_s)} tok/s`);
  if (s.prompt !== null) parts.push(`prompt ${s.prompt}${s.cached !== null ? ` (${s.cached} cached)` : ''}`);
  if (s.ttft_s !== null) parts.push(`first token ${s.ttft_s.toFixed(2)} s`);
  if (m.finish) parts.push(m.finish === 'length' ? 'stopped at max tokens' : m.finish);
  return h('div.stats', { title: 'completion tokens · decode rate · prompt tokens (reused from the prompt cache) · time to first token · finish' }, parts.join(' · '));
}

/** Fill `li` (an element of the message list) for message `m`. */
export function renderMessage(li, m) {
  li.className = `msg ${m.role}${m.pending ? ' pending' : ''}`;
  const head = h('div.who', {}, m.role === 'user' ? 'You' : m.model || 'assistant');
  const parts = [head];
  if (m.role === 'user') {
    parts.push(h('div.body.plain', {}, m.content));
  } else {
    if (m.reasoning) {
      parts.push(h('details.reasoning', {}, h('summary', {}, 'Reasoning'), h('div.plain', {}, m.reasoning)));
    }
    const json = m.pending ? null : asJson(m.content);
    if (json !== null) {
      parts.push(h('div.body.json', {}, h('div.label', {}, 'JSON'), h('pre', {}, h('code', {}, JSON.stringify(json, null, 2)))));
    } else if (m.content) {
      const body = h('div.body.md');
      body.innerHTML = renderMarkdown(m.content); // escaped first: see markdown.js
      parts.push(body);
    }
    for (const c of m.tool_calls || []) {
      parts.push(
        h(
          'div.tool-call',
          {},
          h('div.label', {}, 'Tool call ', h('code', {}, c.function?.name || '?'), c.id ? h('span.muted', {}, ` ${c.id}`) : null),
          h('pre', {}, h('code', {}, prettyArgs(c.function?.arguments || ''))),
        ),
      );
    }
    if (m.pending && !m.content && !m.reasoning && !m.tool_calls) {
      parts.push(h('div.waiting.pulse', {}, m.waitingText || 'Waiting for the model…'));
    }
    if (m.stopped) parts.push(h('div.note', {}, 'Stopped.'));
    if (m.interrupted) parts.push(h('div.note', {}, 'Interrupted: the page was left while this answer was arriving.'));
    if (m.warning) parts.push(h('div.note', {}, `Server warning: ${m.warning}`));
    if (m.error) parts.push(h('div.error', { role: 'alert' }, m.error));
    parts.push(statsLine(m));
  }
  li.replaceChildren(...parts.filter(Boolean));
}
