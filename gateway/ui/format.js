// Numbers for people: bytes, durations, rates, clock times.

export function bytes(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return '–';
  const units = ['B', 'KB', 'MB', 'GB', 'TB'];
  let v = Number(n);
  let i = 0;
  while (v >= 1000 && i < units.length - 1) {
    v /= 1000;
    i += 1;
  }
  return `${v >= 100 || i === 0 ? Math.round(v) : v.toFixed(1)} ${units[i]}`;
}

export function duration(secs) {
  if (secs === null || secs === undefined || Number.isNaN(secs) || secs < 0) return '–';
  const s = Math.floor(secs);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

export function rate(x) {
  if (x === null || x === undefined || !Number.isFinite(x)) return '–';
  return x >= 100 ? x.toFixed(0) : x.toFixed(1);
}

/** `1 file`, `3 files`: `plural(n, 'file')`, or with an irregular plural. */
export function plural(n, one, many = `${one}s`) {
  return `${count(n)} ${Number(n) === 1 ? one : many}`;
}

export function count(n) {
  if (n === null || n === undefined) return '–';
  return Number(n).toLocaleString('en-US');
}

/** A Unix time in seconds as a local clock time (and the date when not today). */
export function clock(unixSecs) {
  if (!unixSecs) return '–';
  const d = new Date(unixSecs * 1000);
  const today = new Date().toDateString() === d.toDateString();
  const t = d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
  return today ? t : `${d.toLocaleDateString()} ${t}`;
}

const SIGNALS = { 1: 'SIGHUP', 2: 'SIGINT', 6: 'SIGABRT', 9: 'SIGKILL', 11: 'SIGSEGV', 15: 'SIGTERM' };

/** How a process ended: `exit code 1`, `signal 9 (SIGKILL)`. */
export function exitHow(e) {
  if (!e) return '–';
  if (e.code !== null && e.code !== undefined) return `exit code ${e.code}`;
  if (e.signal !== null && e.signal !== undefined) {
    const name = SIGNALS[e.signal];
    return name ? `signal ${e.signal} (${name})` : `signal ${e.signal}`;
  }
  return 'unknown';
}
