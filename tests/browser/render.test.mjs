// The UI's pure parts in Node, no browser: the markdown renderer never lets markup
// through, and a chat request carries only what the person set.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { renderMarkdown, escapeHtml } from '../../gateway/ui/markdown.js';
import { requestFields } from '../../gateway/ui/settings.js';
import { buildRequest, historyOf, statsOf } from '../../gateway/ui/chat_send.js';

/** Every tag name in the output. */
function tags(html) {
  return [...html.matchAll(/<\/?([a-zA-Z0-9]+)/g)].map((m) => m[1].toLowerCase());
}

const ALLOWED = new Set(['p', 'br', 'h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'strong', 'em', 'del', 'code', 'pre', 'div', 'span', 'button', 'ul', 'ol', 'li', 'blockquote', 'hr', 'a', 'table', 'thead', 'tbody', 'tr', 'th', 'td']);

const HOSTILE = [
  '<script>alert(1)</script>',
  '<img src=x onerror=alert(1)>',
  '[x](javascript:alert(1))',
  '[x](https://a.example/"onmouseover="alert(1))',
  'https://a.example/"><script>alert(1)</script>',
  '```\n</code></pre><script>alert(1)</script>\n```',
  '```"><img src=x onerror=alert(1)>\ncode\n```',
  '> <iframe src=//evil>\n> **b**',
  '| a | <b onclick=x>b</b> |\n|---|---|\n| <svg onload=alert(1)> | 2 |',
  '`<style>` **<u>x</u>** _<i>y</i>_ ~~<s>z</s>~~',
  '- <a href="javascript:x">l</a>\n1. <form action=//evil>',
  '\u00000\u0000 text \u00001\u0000',
];

test('model output never becomes markup: only the renderer’s own tags, no handlers, no other schemes', () => {
  for (const src of HOSTILE) {
    const html = renderMarkdown(src);
    for (const t of tags(html)) assert.ok(ALLOWED.has(t), `<${t}> from ${JSON.stringify(src)}: ${html}`);
    assert.doesNotMatch(html, /<[^>]*\son\w+\s*=/i, `a handler attribute: ${html}`);
    assert.doesNotMatch(html, /javascript:[^<]*"/i, html);
    for (const [, href] of html.matchAll(/href="([^"]*)"/g)) assert.match(href, /^https?:\/\/[^"<>]*$/, html);
  }
});

test('markdown renders: headings, emphasis, lists, code blocks, links, tables, quotes', () => {
  const html = renderMarkdown('# T\n\nSome **b** and *i* and `c`.\n\n- a\n- b\n\n```rust\nfn main() {}\n```\n\n[site](https://example.com) | x\n\n> q');
  assert.match(html, /<h1>T<\/h1>/);
  assert.match(html, /<strong>b<\/strong> and <em>i<\/em> and <code>c<\/code>/);
  assert.match(html, /<ul><li>a<\/li><li>b<\/li><\/ul>/);
  assert.match(html, /<code class="lang-rust">fn main\(\) \{\}<\/code>/);
  assert.match(html, /<a href="https:\/\/example.com" target="_blank" rel="noopener noreferrer">site<\/a>/);
  assert.match(html, /<blockquote><p>q<\/p><\/blockquote>/);
  assert.match(renderMarkdown('| a | b |\n|---|---|\n| 1 | 2 |'), /<th>a<\/th><th>b<\/th>.*<td>1<\/td><td>2<\/td>/);
  assert.match(renderMarkdown('```py\nstill streaming'), /<code class="lang-py">still streaming<\/code>/);
  assert.equal(escapeHtml(`<&>"'`), '&lt;&amp;&gt;&quot;&#39;');
});

test('a chat request sends no sampling field unless the person set it', () => {
  const body = buildRequest('m', [{ role: 'user', content: 'hi' }], {});
  assert.deepEqual(body, { model: 'm', messages: [{ role: 'user', content: 'hi' }], stream: true, stream_options: { include_usage: true } });
  const set = buildRequest('m', [{ role: 'user', content: 'hi' }], { system: ' be brief ', temperature: '0', max_tokens: '64', top_p: '' });
  assert.deepEqual(set.messages[0], { role: 'system', content: 'be brief' });
  assert.equal(set.temperature, 0);
  assert.equal(set.max_tokens, 64);
  assert.ok(!('top_p' in set));
  assert.deepEqual(requestFields({ format: 'json_object' }), { response_format: { type: 'json_object' } });
  assert.match(requestFields({ top_k: '1.5' }).error, /top_k/);
  assert.match(requestFields({ format: 'json_schema', schema: '{' }).error, /schema/);
  assert.throws(() => buildRequest('m', [], { tools: '{}' }), /tools must be a JSON list/);
});

test('the history leaves out failed and empty answers and keeps tool calls', () => {
  const calls = [{ id: 'call_1', type: 'function', function: { name: 'f', arguments: '{}' } }];
  const h = historyOf([
    { role: 'user', content: 'a' },
    { role: 'assistant', content: 'partial', error: 'engine died' },
    { role: 'user', content: 'b' },
    { role: 'assistant', content: '', tool_calls: calls },
    { role: 'assistant', content: '' },
  ]);
  assert.deepEqual(h, [
    { role: 'user', content: 'a' },
    { role: 'user', content: 'b' },
    { role: 'assistant', content: null, tool_calls: calls },
  ]);
});

test('an answer’s numbers come from usage and the token times', () => {
  const s = statsOf(
    { prompt_tokens: 30, completion_tokens: 11, prompt_tokens_details: { cached_tokens: 20 } },
    { t0: 0, first: 500, last: 1500, pieces: 11 },
  );
  assert.deepEqual(s, { prompt: 30, cached: 20, completion: 11, ttft_s: 0.5, tok_s: 10 });
  assert.equal(statsOf(null, { t0: 0, first: null, last: null, pieces: 0 }).tok_s, null);
});
