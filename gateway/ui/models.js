// The chat's model picker: every model from /v1/models (resident ones marked), and the
// chosen model's engine state from /engine, polled while the chat is on screen (faster
// while an engine is starting, so a switch shows as it happens).

import { getJson } from './api.js';
import { h, setText } from './dom.js';

const SLOW_MS = 2000;
const FAST_MS = 400;

/** What a person should read about an engine state. */
export function describeState(e) {
  if (!e) return { text: '', cls: '' };
  switch (e.state) {
    case 'ready':
      return { text: `ready${e.device ? ` · ${e.device}` : ''}`, cls: 'ok' };
    case 'starting':
      return { text: 'loading the model…', cls: 'busy' };
    case 'draining':
      return { text: 'stopping…', cls: 'busy' };
    case 'crashed':
      return { text: 'crashed · restarts on the next message', cls: 'bad' };
    case 'failed':
      return { text: 'failed · see the Engines page', cls: 'bad' };
    default:
      return { text: 'not loaded · loads on the first message', cls: '' };
  }
}

export class ModelPicker {
  /** `onPick(id)` when the person chooses a model. */
  constructor(onPick) {
    this.models = [];
    this.engines = new Map();
    this.chosen = null;
    this.active = false;
    this.timer = null;
    this.listeners = new Set();
    this.select = h('select#model', {
      'aria-label': 'Model',
      onchange: () => {
        this.chosen = this.select.value;
        onPick(this.chosen);
        this.redraw();
      },
    });
    this.state = h('span#model-state.state-line', { role: 'status', 'aria-live': 'polite' });
    this.el = h('div.picker', {}, h('label', { for: 'model' }, 'Model'), this.select, this.state);
  }

  /** Call `fn()` after every poll (the chat shows loading progress with it). */
  subscribe(fn) {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  engineOf(id) {
    return this.engines.get(id);
  }

  cardOf(id) {
    return this.models.find((m) => m.id === id);
  }

  /** Show `id` as chosen (a conversation's model; checked against the list once known). */
  choose(id) {
    if (id) this.chosen = id;
    this.redraw();
  }

  async refreshModels() {
    try {
      const list = await getJson('/v1/models');
      this.models = list.data || [];
      if (!this.chosen || !this.cardOf(this.chosen)) {
        const resident = this.models.find((m) => m.resident);
        this.chosen = (resident || this.models[0] || {}).id || null;
      }
    } catch {
      // The connection banner (app.js) says the gateway is unreachable.
    }
    this.redraw();
  }

  async poll() {
    let starting = false;
    try {
      const snap = await getJson('/engine');
      const before = new Map(this.engines);
      this.engines = new Map(snap.engines.map((e) => [e.model, e]));
      starting = snap.engines.some((e) => e.state === 'starting' || e.state === 'draining');
      // A model that became ready has a fresh card (its engine's gen_defaults).
      const newlyReady = snap.engines.some((e) => e.state === 'ready' && before.get(e.model)?.state !== 'ready');
      if (newlyReady || this.models.length === 0) await this.refreshModels();
    } catch {
      // Shown by the connection banner.
    }
    this.redraw();
    for (const fn of this.listeners) fn();
    return starting;
  }

  /** Poll now and then on a timer while active (`fast` for the next few seconds). */
  start() {
    this.active = true;
    this.kick();
  }

  stop() {
    this.active = false;
    clearTimeout(this.timer);
  }

  /** Poll at once (after a send or a switch), then keep going. */
  kick() {
    clearTimeout(this.timer);
    const round = (this.round = (this.round || 0) + 1);
    const loop = async () => {
      if (!this.active) return;
      const busy = await this.poll();
      // A later kick took over the schedule.
      if (this.active && round === this.round) this.timer = setTimeout(loop, busy || this.waiting ? FAST_MS : SLOW_MS);
    };
    loop();
  }

  redraw() {
    const ids = this.models.map((m) => m.id);
    const have = [...this.select.options].map((o) => o.value);
    if (ids.join('\n') !== have.join('\n')) {
      this.select.replaceChildren(...ids.map((id) => h('option', { value: id }, id)));
    }
    for (const o of this.select.options) {
      const e = this.engines.get(o.value);
      const resident = e ? ['ready', 'starting', 'draining'].includes(e.state) : this.cardOf(o.value)?.resident;
      setText(o, `${resident ? '● ' : '○ '}${o.value}${e && e.state !== 'stopped' ? ` (${e.state})` : ''}`);
    }
    if (this.chosen && this.select.value !== this.chosen) this.select.value = this.chosen;
    const d = describeState(this.engines.get(this.chosen));
    setText(this.state, d.text);
    this.state.className = `state-line ${d.cls}${d.cls === 'busy' ? ' pulse' : ''}`;
  }
}
