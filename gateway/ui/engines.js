// The engines page (#/engines): the pool (cap, memory budget, residents, gateway
// counters) and one card per model, live from /engine and /stats polled every second
// while the page is on screen. The decode rate is measured here: the growth of each
// engine's generated-token counter between polls, so it is every stream together.

import { getJson, postJson } from './api.js';
import { h, setText } from './dom.js';
import { bytes, count, duration } from './format.js';
import { EngineCard, HISTORY } from './engine_card.js';

const POLL_MS = 1000;

export class EnginesView {
  constructor() {
    this.cards = new Map();
    this.rates = new Map(); // model → tok/s samples
    this.last = new Map(); // model → {pid, tokens, t}
    this.active = false;
    this.timer = null;
    this.summary = {};
    const facts = h('dl.pool-facts');
    for (const [key, label] of [
      ['cap', 'Pool cap'],
      ['budget', 'Memory budget'],
      ['resident', 'Resident'],
      ['uptime', 'Gateway up'],
      ['requests', 'Requests'],
      ['switches', 'Switches'],
      ['evictions', 'Evictions'],
      ['crashes', 'Crashes'],
    ]) {
      const dd = h('dd', { dataset: { key } });
      this.summary[key] = dd;
      facts.append(h('div', {}, h('dt', {}, label), dd));
    }
    this.banner = h('div.banner#engines-banner', { hidden: true, role: 'alert' });
    this.grid = h('div.cards');
    this.el = h(
      'div.view.engines-view#engines',
      { hidden: true },
      h('section.pool', { 'aria-label': 'Pool' }, h('h1', {}, 'Engines'), facts),
      this.banner,
      this.grid,
    );
  }

  activate() {
    this.active = true;
    this.loop();
  }

  deactivate() {
    this.active = false;
    clearTimeout(this.timer);
  }

  /** Poll now, then every second; a later call takes over the schedule. */
  async loop() {
    clearTimeout(this.timer);
    if (!this.active) return;
    const round = (this.round = (this.round || 0) + 1);
    await this.poll();
    if (this.active && round === this.round) this.timer = setTimeout(() => this.loop(), POLL_MS);
  }

  async poll() {
    let snap;
    let stats = null;
    try {
      [snap, stats] = await Promise.all([getJson('/engine'), getJson('/stats').catch(() => null)]);
    } catch (e) {
      this.showBanner(`Cannot read /engine: ${e.message}`);
      return;
    }
    this.showBanner('');
    const t = performance.now();
    const nowSecs = Date.now() / 1000;
    const p = snap.pool;
    setText(this.summary.cap, `${p.cap} engine${p.cap === 1 ? '' : 's'}`);
    setText(this.summary.budget, p.memory_budget_bytes ? bytes(p.memory_budget_bytes) : 'none');
    setText(this.summary.resident, p.resident.length ? p.resident.join(', ') : 'none');
    const g = stats?.gateway;
    setText(this.summary.uptime, g ? duration(g.uptime_s) : '–');
    setText(this.summary.requests, g ? `${count(g.requests_total)} (${count(g.in_flight)} in flight)` : '–');
    setText(this.summary.switches, g ? `${count(g.switches)}${g.last_switch_ms ? ` (last ${(g.last_switch_ms / 1000).toFixed(1)} s)` : ''}` : '–');
    setText(this.summary.evictions, g ? count(g.evictions) : '–');
    setText(this.summary.crashes, g ? count(g.crashes) : '–');
    for (const e of snap.engines) {
      const s = stats?.engines?.[e.model];
      this.sample(e, s, t);
      this.cardFor(e.model).update(e, s, this.rates.get(e.model) || [], nowSecs);
    }
  }

  /** One decode-rate sample from the engine's generated-token counter. */
  sample(e, s, t) {
    const series = this.rates.get(e.model) || [];
    const prev = this.last.get(e.model);
    const live = s && !s.stale ? s : null;
    if (live && prev && prev.pid === live.pid && t > prev.t) {
      const tokens = Math.max(0, live.generated_tokens_total - prev.tokens);
      series.push(tokens / ((t - prev.t) / 1000));
    } else if (!live && e.state !== 'ready') {
      series.push(0);
    }
    if (series.length > HISTORY) series.splice(0, series.length - HISTORY);
    this.rates.set(e.model, series);
    if (live) this.last.set(e.model, { pid: live.pid, tokens: live.generated_tokens_total, t });
    else this.last.delete(e.model);
  }

  cardFor(model) {
    let card = this.cards.get(model);
    if (!card) {
      card = new EngineCard(model, (m, action) => this.act(m, action));
      this.cards.set(model, card);
      this.grid.append(card.el);
    }
    return card;
  }

  /** A Load or Unload button: POST /api/models/{id}/load|unload, polling meanwhile. */
  async act(model, action) {
    const card = this.cardFor(model);
    card.setBusy(action);
    card.showError('');
    this.loop();
    try {
      await postJson(`/api/models/${encodeURIComponent(model)}/${action}`, {});
    } catch (e) {
      card.showError(`${action === 'load' ? 'Loading' : 'Unloading'} failed: ${e.message}${e.code ? ` (${e.code})` : ''}`);
    } finally {
      card.setBusy(null);
      this.loop();
    }
  }

  showBanner(text) {
    setText(this.banner, text);
    this.banner.hidden = !text;
  }
}
