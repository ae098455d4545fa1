// A small line chart as inline SVG (no library): values over the last N samples, scaled
// to the largest, stretched to its box (the numbers are written beside it, in HTML).

const NS = 'http://www.w3.org/2000/svg';

function svg(tag, attrs) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  return el;
}

export class Sparkline {
  constructor({ width = 240, height = 48, label = '' } = {}) {
    this.w = width;
    this.h = height;
    this.el = svg('svg', {
      viewBox: `0 0 ${width} ${height}`,
      preserveAspectRatio: 'none',
      class: 'spark',
      role: 'img',
      'aria-label': label,
    });
    this.area = svg('path', { class: 'spark-area' });
    this.line = svg('polyline', { class: 'spark-line', fill: 'none', 'vector-effect': 'non-scaling-stroke' });
    const base = svg('line', { x1: 0, y1: height - 0.5, x2: width, y2: height - 0.5, class: 'spark-base', 'vector-effect': 'non-scaling-stroke' });
    this.el.append(base, this.area, this.line);
    this.label = label;
  }

  /** `values`: oldest first; `capacity`: how many samples the width holds. */
  draw(values, capacity) {
    const top = Math.max(1, ...values);
    const step = this.w / Math.max(1, capacity - 1);
    const x0 = this.w - step * (values.length - 1);
    const pts = values.map((v, i) => [x0 + i * step, this.h - 1 - (Math.max(0, v) / top) * (this.h - 4)]);
    const line = pts.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(' ');
    this.line.setAttribute('points', line);
    this.area.setAttribute('d', pts.length ? `M${pts[0][0].toFixed(1)},${this.h} L${line.replace(/ /g, ' L')} L${pts[pts.length - 1][0].toFixed(1)},${this.h} Z` : '');
    const peak = values.length ? Math.max(...values) : 0;
    const now = values.length ? values[values.length - 1] : 0;
    this.el.setAttribute('aria-label', `${this.label}: now ${now.toFixed(1)}, peak ${peak.toFixed(1)}`);
  }
}
