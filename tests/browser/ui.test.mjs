// corral's web UI in a real browser (Debian's headless Chromium) against a real
// `corral serve` over the two test models (a pool of one): chat streaming, stopping an
// answer, switching models, structured output and tool calls, the engines page following
// a load and an unload, and an engine killed with SIGKILL mid-answer. Steps run in order
// on one page; screenshots and the server's log go to target/browser/.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { chromium } from 'playwright-core';
import { startServer, until, SMOL, GEMMA } from './server.mjs';

const SHOTS = resolve(new URL('.', import.meta.url).pathname, '../../target/browser');
const LONG = 'Write a very long story about a fox who travels around the world. Make it at least 2000 words.';
const MINUTE = 60_000;

let server;
let browser;
let page;
const pageErrors = [];

const last = '#messages > li.msg.assistant:last-child';

async function shot(name) {
  await page.screenshot({ path: join(SHOTS, `${name}.png`) });
}

async function send(text) {
  await page.fill('#prompt', text);
  await page.press('#prompt', 'Enter');
  await page.waitForSelector(`${last}.pending`, { timeout: 5000 }).catch(() => {});
}

/**
 * Set "Max tokens" in the settings panel (empty: not sent). The test models do not
 * always stop by themselves, and CI's two cores decode them at tens of tokens a second.
 */
async function setMaxTokens(n) {
  if (await page.isHidden('#settings')) await page.click('#settings-toggle');
  await page.fill('#set-max_tokens', n === null ? '' : String(n));
  await page.click('#settings-toggle');
  assert.ok(await page.isHidden('#settings'));
}

/** The last answer once it is finished (not pending), with its parts. */
async function finishedAnswer(timeout) {
  await page.waitForSelector(`${last}:not(.pending)`, { timeout });
  return page.$eval(last, (li) => ({
    who: li.querySelector('.who')?.textContent,
    text: li.querySelector('.body')?.textContent || '',
    stats: li.querySelector('.stats')?.textContent || '',
    error: li.querySelector('.error')?.textContent || '',
    note: li.querySelector('.note')?.textContent || '',
  }));
}

async function cardState(model) {
  return page.$eval(`article.engine[data-model="${model}"] .state`, (el) => el.textContent).catch(() => null);
}

async function waitCard(model, state, timeout = 30_000) {
  await until(async () => (await cardState(model)) === state, timeout, `${model} to show ${state} on the engines page`);
}

async function fact(model, key) {
  return page.$eval(`article.engine[data-model="${model}"] dd[data-key="${key}"]`, (el) => el.textContent);
}

before(async () => {
  mkdirSync(SHOTS, { recursive: true });
  server = await startServer();
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    // Chromium refuses its sandbox as root (CI runs as root).
    chromiumSandbox: process.getuid?.() !== 0,
    args: ['--disable-gpu', '--disable-dev-shm-usage'],
  });
  const context = await browser.newContext({ viewport: { width: 1280, height: 820 }, colorScheme: 'light' });
  page = await context.newPage();
  page.on('pageerror', (e) => pageErrors.push(String(e)));
  page.on('console', (m) => m.type() === 'error' && !/Failed to load resource/.test(m.text()) && pageErrors.push(m.text()));
});

after(async () => {
  await browser?.close();
  if (server) {
    writeFileSync(join(SHOTS, 'server.log'), server.log.join('\n'));
    await server.stop();
  }
});

test('the chat page loads from the binary with both models in the picker', async () => {
  const t = Date.now();
  await page.goto(server.url + '/');
  await page.waitForSelector(`#model option[value="${GEMMA}"]`, { state: 'attached' });
  console.log(`page ready in ${Date.now() - t} ms`);
  assert.match(page.url(), /#\/chat$/);
  const options = await page.$$eval('#model option', (os) => os.map((o) => o.value));
  assert.deepEqual(options.sort(), [SMOL, GEMMA].sort());
  assert.equal(await page.getAttribute('#nav-chat', 'aria-current'), 'page');
});

test('a message to SmolLM2 streams its answer in, with its numbers', async () => {
  await page.selectOption('#model', SMOL);
  await setMaxTokens(64);
  // Record every length the answer's text goes through.
  await page.evaluate(() => {
    window.lengths = [];
    new MutationObserver(() => {
      const body = document.querySelector('#messages > li.msg.assistant:last-child .body');
      if (body) window.lengths.push(body.textContent.length);
    }).observe(document.getElementById('messages'), { childList: true, subtree: true, characterData: true });
  });
  await send('Name three colors and say one thing about each.');
  const a = await finishedAnswer(MINUTE);
  assert.equal(a.error, '', a.error);
  assert.equal(a.who, SMOL);
  assert.ok(a.text.length > 10, a.text);
  const lengths = await page.evaluate(() => [...new Set(window.lengths)].filter((n) => n > 0));
  assert.ok(lengths.length >= 3, `the answer arrived in pieces: ${lengths}`);
  assert.match(a.stats, /^\d+ tokens · [\d.]+ tok\/s · prompt \d+ \(\d+ cached\) · first token [\d.]+ s/, a.stats);
  await shot('1-chat-smollm2');
});

test('Stop cuts a long answer and the engine cancels the generation', async () => {
  const cancelled = async () => (await server.json('/stats')).engines[SMOL]?.requests_cancelled ?? 0;
  const before = await cancelled();
  await setMaxTokens(1000);
  await send(LONG);
  await page.waitForFunction((sel) => (document.querySelector(`${sel} .body`)?.textContent.length || 0) > 40, last, { timeout: MINUTE });
  await page.click('#stop');
  const a = await finishedAnswer(10_000);
  assert.equal(a.note, 'Stopped.');
  assert.equal(a.error, '');
  assert.ok(await page.isVisible('#send'), 'Send is back');
  assert.ok(!(await page.isVisible('#stop')), 'Stop is gone');
  await until(async () => (await cancelled()) > before, 10_000, 'the engine to count the request cancelled');
  const length = a.text.length;
  await page.waitForTimeout(500);
  const after = await page.$eval(`${last} .body`, (el) => el.textContent.length);
  assert.equal(after, length, 'nothing arrives after Stop');
  await shot('2-chat-stopped');
});

test('switching to Gemma loads its engine and it answers', async () => {
  await setMaxTokens(48);
  const states = [];
  const watch = setInterval(async () => states.push(await page.textContent('#model-state').catch(() => '')), 150);
  let a;
  try {
    await page.selectOption('#model', GEMMA);
    await send('What is the capital of France?');
    a = await finishedAnswer(2 * MINUTE);
  } finally {
    clearInterval(watch);
  }
  console.log(`model state line during the switch: ${[...new Set(states)].join(' | ')}`);
  assert.equal(a.error, '', a.error);
  assert.equal(a.who, GEMMA);
  assert.ok(a.text.length > 0);
  assert.match(a.stats, /tokens/);
  await shot('3-chat-gemma');
});

test('conversations are kept in the browser across a reload', async () => {
  await page.reload();
  await page.waitForSelector(`${last} .stats`);
  const count = await page.$$eval('#messages > li.msg', (li) => li.length);
  assert.equal(count, 6, 'three questions and three answers');
  assert.equal(await page.$eval('#model', (s) => s.value), GEMMA, 'the conversation remembers its model');
});

test('structured output and tool calls are shown as such, in a new conversation', async () => {
  await page.click('#new-chat');
  assert.equal(await page.$$eval('#conv-list li', (li) => li.length), 2);
  await page.selectOption('#model', SMOL);
  await page.click('#settings-toggle');
  await page.fill('#set-max_tokens', '200');
  await page.selectOption('#set-format', 'json_schema');
  const schema = { type: 'object', properties: { color: { type: 'string', maxLength: 12 } }, required: ['color'], additionalProperties: false };
  await page.fill('#set-schema', JSON.stringify(schema));
  await page.click('#settings-toggle');
  await send('Name a color.');
  const a = await finishedAnswer(MINUTE);
  assert.equal(a.error, '', a.error);
  const json = await page.$eval(`${last} .json pre`, (el) => el.textContent);
  assert.equal(typeof JSON.parse(json).color, 'string', json);

  const tool = {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'The weather in a city',
      parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 20 } }, required: ['city'], additionalProperties: false },
    },
  };
  await page.click('#settings-toggle');
  await page.selectOption('#set-format', '');
  await page.fill('#set-tools', JSON.stringify([tool]));
  await page.selectOption('#set-tool-choice', 'required');
  await page.click('#settings-toggle');
  await send('What is the weather in Paris?');
  const b = await finishedAnswer(MINUTE);
  assert.equal(b.error, '', b.error);
  const call = await page.$eval(`${last} .tool-call`, (el) => ({ name: el.querySelector('.label code').textContent, args: el.querySelector('pre').textContent }));
  assert.equal(call.name, 'get_weather');
  assert.equal(typeof JSON.parse(call.args).city, 'string', call.args);
  assert.match(b.stats, /tool_calls$/, b.stats);
  await shot('4-chat-structured-and-tools');

  // Reset all: nothing but the model and the messages is sent again.
  await page.click('#settings-toggle');
  await page.click('#settings button.link');
  assert.equal(await page.inputValue('#set-tools'), '');
  await page.click('#settings-toggle');
  assert.equal(await page.textContent('#settings-toggle'), 'Settings');
});

test('the engines page shows both engines and follows them through a load', async () => {
  await page.click('#nav-engines');
  await page.waitForSelector('#engines:not([hidden]) article.engine');
  await waitCard(SMOL, 'ready');
  await waitCard(GEMMA, 'stopped'); // a pool of one: SmolLM2's return evicted Gemma
  const smol = await server.engineOf(SMOL);
  assert.equal(await fact(SMOL, 'pid'), String(smol.pid));
  await shot('5-engines-smollm2');
  await page.click(`article.engine[data-model="${GEMMA}"] button.load`);
  await waitCard(GEMMA, 'ready');
  await waitCard(SMOL, 'stopped');
  assert.equal(await fact(SMOL, 'pid'), '–');
  await shot('6-engines-gemma-loaded');
});

test('an engine killed mid-answer is reported, and the next message brings it back', async () => {
  await page.click('#nav-chat');
  await page.selectOption('#model', SMOL);
  await setMaxTokens(1000);
  await send(LONG);
  await page.waitForFunction((sel) => (document.querySelector(`${sel} .body`)?.textContent.length || 0) > 20, last, { timeout: MINUTE });
  const { pid } = await server.engineOf(SMOL);
  process.kill(pid, 'SIGKILL');
  const a = await finishedAnswer(15_000);
  assert.match(a.error, /engine stopped while answering .*restarts on your next message/, a.error);
  await shot('7-chat-engine-killed');

  await page.click('#nav-engines');
  await waitCard(SMOL, 'crashed', 15_000);
  const exit = await page.$eval(`article.engine[data-model="${SMOL}"] .last-exit summary`, (el) => el.textContent);
  assert.match(exit, /signal 9 \(SIGKILL\)/, exit);
  await shot('8-engines-crashed');

  await page.click('#nav-chat');
  await setMaxTokens(48);
  await send('Say hello.');
  const b = await finishedAnswer(MINUTE);
  assert.equal(b.error, '', b.error);
  assert.ok(b.text.length > 0);
  await page.click('#nav-engines');
  await waitCard(SMOL, 'ready');
  assert.equal(await fact(SMOL, 'restarts'), '1');
  assert.notEqual(await fact(SMOL, 'pid'), String(pid));
  await shot('9-engines-recovered');
});

test('unloading from the engines page stops the engine, and dark mode renders', async () => {
  await page.click(`article.engine[data-model="${SMOL}"] button.unload`);
  await waitCard(SMOL, 'stopped');
  assert.deepEqual((await server.json('/engine')).pool.resident, []);
  await page.emulateMedia({ colorScheme: 'dark' });
  await shot('10-engines-dark');
  await page.click('#nav-chat');
  await shot('11-chat-dark');
  assert.deepEqual(pageErrors, [], 'no script errors on the page');
});
