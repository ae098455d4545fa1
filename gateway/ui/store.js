// What the browser keeps (localStorage, this origin only): conversations, the chosen
// conversation, and the chat settings. Nothing here is sent anywhere but to this
// server, and only as part of a chat request.

const CONVS = 'corral.conversations';
const CURRENT = 'corral.current';
const SETTINGS = 'corral.settings';
const MAX_CONVERSATIONS = 100;

function read(key, fallback) {
  try {
    const v = localStorage.getItem(key);
    return v === null ? fallback : JSON.parse(v);
  } catch {
    return fallback;
  }
}

/** Returns false when the browser refused (storage full or disabled). */
function write(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
    return true;
  } catch {
    return false;
  }
}

function newId() {
  return `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 8)}`;
}

export class Store {
  constructor() {
    const list = read(CONVS, []);
    this.conversations = Array.isArray(list) ? list.filter((c) => c && c.id && Array.isArray(c.messages)) : [];
    // An answer still arriving when the page went away will not arrive any more.
    for (const m of this.conversations.flatMap((c) => c.messages)) {
      if (m.pending) {
        m.pending = false;
        m.interrupted = true;
      }
    }
    this.currentId = read(CURRENT, null);
    this.settings = { ...read(SETTINGS, {}) };
    this.failed = false;
  }

  /** The open conversation (a new empty one if there is none). */
  current() {
    let c = this.conversations.find((x) => x.id === this.currentId);
    if (!c) c = this.create();
    return c;
  }

  create(model) {
    const c = { id: newId(), title: '', model: model || null, messages: [], updated: Date.now() };
    this.conversations.unshift(c);
    this.conversations.length = Math.min(this.conversations.length, MAX_CONVERSATIONS);
    this.currentId = c.id;
    this.save();
    return c;
  }

  select(id) {
    if (this.conversations.some((c) => c.id === id)) {
      this.currentId = id;
      write(CURRENT, id);
    }
    return this.current();
  }

  remove(id) {
    this.conversations = this.conversations.filter((c) => c.id !== id);
    if (this.currentId === id) this.currentId = this.conversations[0]?.id ?? null;
    this.save();
  }

  /** Call after changing a conversation: it moves to the top and is written out. */
  touch(conv) {
    conv.updated = Date.now();
    if (!conv.title) {
      const first = conv.messages.find((m) => m.role === 'user');
      if (first) conv.title = first.content.replace(/\s+/g, ' ').trim().slice(0, 60);
    }
    this.conversations = [conv, ...this.conversations.filter((c) => c.id !== conv.id)];
    this.save();
  }

  save() {
    this.failed = !(write(CONVS, this.conversations) && write(CURRENT, this.currentId));
    return !this.failed;
  }

  saveSettings(settings) {
    this.settings = settings;
    return write(SETTINGS, settings);
  }
}
