// The UI's keyed fetch in Node, no browser: against a gateway started with --api-key,
// the page asks for the key once on a 401, keeps it, and sends it as a bearer token.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { apiFetch } from '../../gateway/ui/api.js';

const KEY = 'sk-ui-test';

/** A stand-in gateway that wants `KEY`, recording each request's authorization. */
function gateway() {
  const seen = [];
  globalThis.fetch = async (path, init) => {
    const auth = init.headers?.authorization || null;
    seen.push({ path, auth, type: init.headers?.['content-type'] || null });
    return { status: auth === `Bearer ${KEY}` ? 200 : 401 };
  };
  return seen;
}

function storage() {
  const m = new Map();
  globalThis.localStorage = { getItem: (k) => m.get(k) ?? null, setItem: (k, v) => m.set(k, String(v)) };
  return m;
}

test('a 401 asks for the key once, keeps it, and every later call sends it', async () => {
  const kept = storage();
  const seen = gateway();
  let asked = 0;
  globalThis.prompt = () => {
    asked += 1;
    return ` ${KEY} `;
  };
  const init = { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' };
  const r = await apiFetch('/v1/chat/completions', init);
  assert.equal(r.status, 200);
  assert.equal(asked, 1);
  assert.deepEqual(seen, [
    { path: '/v1/chat/completions', auth: null, type: 'application/json' },
    { path: '/v1/chat/completions', auth: `Bearer ${KEY}`, type: 'application/json' },
  ]);
  assert.equal(kept.get('corral.apiKey'), KEY);
  assert.equal((await apiFetch('/engine')).status, 200);
  assert.equal(asked, 1, 'not asked again');
  assert.equal(seen.at(-1).auth, `Bearer ${KEY}`);
});

test('a declined prompt leaves the 401 for the page to show, and is not repeated', async () => {
  storage();
  gateway();
  let asked = 0;
  globalThis.prompt = () => {
    asked += 1;
    return null;
  };
  assert.equal((await apiFetch('/engine')).status, 401);
  assert.equal((await apiFetch('/stats')).status, 401);
  assert.equal(asked, 1, 'the engines page polls: one prompt, not one per poll');
});
