// One engine on the engines page: state, process, counters, cache hits, memory, its
// decode rate over time, the last exit with its stderr tail, and Load / Unload buttons.
// Built once per model and updated in place each poll (so focus and open details stay).

import { h, setText } from './dom.js';
import { bytes, clock, count, duration, exitHow, plural, rate } from './format.js';
import { Sparkline } from './chart.js';

export const HISTORY = 60;

/** An engine's stderr line (a JSON log event) as one readable line. */
export function logLine(line) {
  let ev;
  try {
    ev = JSON.parse(line);
  } catch {
    return line;
  }
  if (!ev || typeof ev !== 'object') return line;
  const { timestamp, level, message, target, ...fields } = ev;
  const time = typeof timestamp === 'string' ? timestamp.replace(/^.*T/, '').replace(/\.\d+/, '') : '';
  const rest = Object.entries(fields).map(([k, v]) => `${k}=${typeof v === 'string' ? v : JSON.stringify(v)}`);
  return [time, level, message, ...rest].filter(Boolean).join(' ');
}

export class EngineCard {
  /** `act(model, 'load' | 'unload')` runs a button's action. */
  constructor(model, act) {
    this.model = model;
    this.values = {};
    this.stateBadge = h('span.state', {});
    this.loadButton = h('button.load', { type: 'button', onclick: () => act(model, 'load') }, 'Load');
    this.unloadButton = h('button.unload', { type: 'button', onclick: () => act(model, 'unload') }, 'Unload');
    this.error = h('div.card-error', { role: 'alert', hidden: true });
    this.chart = new Sparkline({ label: `${model} decode tokens per second` });
    this.rateNow = h('span.rate-now');
    this.ratePeak = h('span.rate-peak');
    const dl = h('dl.facts');
    for (const [key, label] of [
      ['pid', 'PID'],
      ['device', 'Device'],
      ['uptime', 'Up'],
      ['restarts', 'Restarts'],
      ['in_flight', 'In flight'],
      ['requests', 'Requests'],
      ['model_bytes', 'Model file'],
      ['rss', 'Memory (RSS)'],
      ['kv', 'KV in use'],
      ['cache', 'Prompt cache'],
      ['hits', 'Cache hits'],
      ['ssd', 'SSD tier'],
      ['decode', 'Decode (avg)'],
      ['last_used', 'Last used'],
    ]) {
      const dd = h('dd', { dataset: { key } });
      this.values[key] = dd;
      dl.append(h('div', {}, h('dt', {}, label), dd));
    }
    this.exitSummary = h('span.exit-how');
    this.exitTail = h('pre.tail');
    this.exit = h('details.last-exit', { hidden: true }, h('summary', {}, 'Last exit: ', this.exitSummary), this.exitTail);
    this.el = h(
      'article.engine',
      { dataset: { model }, 'aria-label': `Engine ${model}` },
      h('header', {}, h('h2', {}, model), this.stateBadge, h('span.spacer'), this.loadButton, this.unloadButton),
      this.error,
      dl,
      h('div.chart', {}, h('div.chart-label', {}, 'Decode tok/s, all streams, last minute: ', this.rateNow, this.ratePeak), this.chart.el),
      this.exit,
    );
    this.busy = null;
  }

  showError(text) {
    setText(this.error, text);
    this.error.hidden = !text;
  }

  /** While a button's request runs: which one, so both stay disabled until it ends. */
  setBusy(action) {
    this.busy = action;
    setText(this.loadButton, action === 'load' ? 'Loading…' : 'Load');
    setText(this.unloadButton, action === 'unload' ? 'Unloading…' : 'Unload');
  }

  /**
   * `e`: this model's `/engine` entry; `s`: its `/stats` entry (absent unless ready);
   * `rates`: decode tok/s samples, oldest first.
   */
  update(e, s, rates, nowSecs) {
    const live = s && !s.stale ? s : null;
    setText(this.stateBadge, e.state);
    this.stateBadge.dataset.state = e.state;
    this.el.dataset.state = e.state;
    const resident = ['starting', 'ready', 'draining'].includes(e.state);
    this.loadButton.disabled = Boolean(this.busy) || e.state === 'ready' || e.state === 'starting' || e.state === 'draining';
    this.unloadButton.disabled = Boolean(this.busy) || e.state === 'stopped' || e.state === 'draining';
    const v = this.values;
    setText(v.pid, e.pid ?? '–');
    setText(v.device, e.device ?? '–');
    setText(v.uptime, resident ? duration(live ? live.uptime_s : nowSecs - (e.started_at || nowSecs)) : '–');
    setText(v.restarts, count(e.restarts));
    setText(v.in_flight, count(e.in_flight));
    setText(v.model_bytes, bytes(e.model_bytes));
    setText(v.last_used, clock(e.last_used_at));
    if (live) {
      const pc = live.prompt_cache;
      const ssd = live.ssd_cache;
      setText(v.requests, `${count(live.requests_total)} (${count(live.requests_cancelled)} cancelled, ${count(live.requests_failed)} failed)`);
      setText(v.rss, bytes(live.memory?.rss_bytes));
      setText(v.kv, `${bytes(live.batch?.kv_bytes)} of ${bytes(live.batch?.kv_budget_bytes)}`);
      setText(v.cache, `${plural(pc.entries, 'entry', 'entries')} · ${bytes(pc.bytes)}`);
      setText(v.hits, `${plural(pc.hits, 'hit')} (${plural(pc.hit_tokens, 'token')}) · ${plural(pc.misses, 'miss', 'misses')}`);
      setText(v.ssd, ssd ? `${plural(ssd.entries, 'file')} · ${bytes(ssd.bytes)} · ${plural(ssd.restores, 'restore')} · ${count(ssd.spills)} written` : 'off');
      setText(v.decode, `${rate(live.avg?.decode_tok_s)} tok/s per stream`);
    } else {
      for (const k of ['requests', 'rss', 'kv', 'cache', 'hits', 'ssd', 'decode']) setText(v[k], s?.stale ? 'no answer' : '–');
    }
    this.chart.draw(rates, HISTORY);
    setText(this.rateNow, rates.length ? `now ${rate(rates[rates.length - 1])}` : '–');
    setText(this.ratePeak, rates.length ? ` · peak ${rate(Math.max(...rates))}` : '');
    const x = e.last_exit;
    this.exit.hidden = !x;
    if (x) {
      setText(this.exitSummary, `${exitHow(x)} at ${clock(x.at)}`);
      // Exit 0 is a stop that was asked for (eviction, unload); anything else is a crash.
      this.exitSummary.classList.toggle('clean', x.code === 0);
      setText(this.exitTail, (x.stderr_tail || []).map(logLine).join('\n') || '(no output)');
    }
  }
}
