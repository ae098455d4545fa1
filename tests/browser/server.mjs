// The real `corral serve` for the browser test: the binary the Rust tests built, on a
// free port (--port 0, the address read from its `listening` line), with a temporary
// home, runtime dir, SSD tier and Responses store, over the two test models.

import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, existsSync } from 'node:fs';
import { tmpdir, homedir } from 'node:os';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';

export const SMOL = 'SmolLM2-135M-Instruct.Q4_1';
export const GEMMA = 'gemma-3-270m-q4_k_m';

const ROOT = resolve(new URL('.', import.meta.url).pathname, '../..');

export function modelsDir() {
  return process.env.CORRAL_MODELS_DIR || join(homedir(), '.cache/corral/models');
}

export function corralBinary() {
  const bin = resolve(ROOT, process.env.CORRAL_BIN || 'target/debug/corral');
  if (!existsSync(bin)) throw new Error(`${bin} is missing: run the Rust tests (cargo test) first, or set CORRAL_BIN`);
  return bin;
}

/** Start the server; resolves once it listens. `stop()` kills it and removes its files. */
export async function startServer() {
  const dir = mkdtempSync(join(tmpdir(), 'corral-browser-'));
  const models = modelsDir();
  for (const id of [SMOL, GEMMA]) {
    if (!existsSync(join(models, `${id}.gguf`))) throw new Error(`${id}.gguf is missing in ${models}: run scripts/models/fetch`);
  }
  const args = [
    'serve', '--port', '0', '--no-open',
    '--runtime-dir', join(dir, 'run'),
    '--ssd-cache', join(dir, 'kv'),
    '--responses-dir', join(dir, 'responses'),
    '--model', join(models, `${SMOL}.gguf`),
    '--model', join(models, `${GEMMA}.gguf`),
    '--threads', '1',
  ];
  const child = spawn(corralBinary(), args, {
    env: { PATH: process.env.PATH, HOME: dir, RUST_LOG: 'info', LD_LIBRARY_PATH: process.env.LD_LIBRARY_PATH || '' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const log = [];
  createInterface({ input: child.stderr }).on('line', (l) => log.push(l));
  const lines = createInterface({ input: child.stdout });
  const addr = await new Promise((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`corral serve did not start:\n${log.join('\n')}`)), 30_000);
    child.once('exit', (code) => fail(new Error(`corral serve exited (${code}):\n${log.join('\n')}`)));
    lines.once('line', (line) => {
      clearTimeout(timer);
      const ev = JSON.parse(line);
      if (ev.event !== 'listening') fail(new Error(`unexpected first line: ${line}`));
      ok(ev.addr);
    });
  });
  lines.on('line', () => {});
  const url = `http://${addr}`;
  return {
    url,
    log,
    async json(path) {
      const r = await fetch(url + path);
      if (!r.ok) throw new Error(`GET ${path}: ${r.status} ${await r.text()}`);
      return r.json();
    },
    async engineOf(model) {
      const snap = await this.json('/engine');
      return snap.engines.find((e) => e.model === model);
    },
    async stop() {
      if (child.exitCode === null) {
        child.kill('SIGKILL'); // its engines exit with it (stdin EOF, parent-death signal)
        await new Promise((ok) => child.once('exit', ok));
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Poll `fn` until it returns a truthy value or `ms` pass. */
export async function until(fn, ms, what) {
  const end = Date.now() + ms;
  let last;
  while (Date.now() < end) {
    last = await fn();
    if (last) return last;
    await new Promise((ok) => setTimeout(ok, 100));
  }
  throw new Error(`timed out after ${ms} ms waiting for ${what} (last: ${JSON.stringify(last)})`);
}
