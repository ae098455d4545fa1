// The chat page (#/chat): conversations kept in this browser, a model picker, a
// settings panel, the message list and the composer. Sending streams the answer in;
// Stop (or Esc) aborts it. Errors are shown on the answer they ended, in words.

import { h, fill } from './dom.js';
import { ModelPicker } from './models.js';
import { settingsPanel, anySet } from './settings.js';
import { buildRequest, streamAnswer, statsOf } from './chat_send.js';
import { explain, renderMessage } from './chat_render.js';

export class ChatView {
  constructor(store) {
    this.store = store;
    this.streaming = null;
    this.items = new WeakMap(); // message → its <li>
    this.pendingRender = new Set();
    this.picker = new ModelPicker((id) => this.pick(id));
    this.picker.subscribe(() => this.onEngines());
    this.settings = settingsPanel(store.settings, (s) => this.saveSettings(s), () => this.picker.cardOf(this.picker.chosen)?.gen_defaults);
    this.settingsButton = h('button#settings-toggle', { type: 'button', 'aria-expanded': 'false', 'aria-controls': 'settings', onclick: () => this.toggleSettings() }, 'Settings');
    this.list = h('ul#conv-list', { 'aria-label': 'Conversations' });
    this.messages = h('ol#messages.messages', { 'aria-live': 'polite', onclick: (e) => this.onMessageClick(e) });
    this.banner = h('div.banner#chat-banner', { hidden: true, role: 'alert' });
    this.prompt = h('textarea#prompt', {
      rows: 3,
      placeholder: 'Message the model…',
      'aria-label': 'Message',
      onkeydown: (e) => {
        if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
          e.preventDefault();
          this.send();
        }
      },
    });
    this.sendButton = h('button#send.primary', { type: 'submit' }, 'Send');
    this.stopButton = h('button#stop.danger', { type: 'button', hidden: true, onclick: () => this.stop() }, 'Stop');
    this.el = h(
      'div.view.chat-view#chat',
      { hidden: true, onkeydown: (e) => e.key === 'Escape' && this.streaming && this.stop() },
      h('aside.convs', {}, h('button#new-chat', { type: 'button', onclick: () => this.newChat() }, '+ New chat'), this.list),
      h(
        'section.thread',
        {},
        h('div.toolbar', {}, this.picker.el, this.settingsButton),
        this.settings,
        this.banner,
        this.messages,
        h(
          'form#composer.composer',
          { onsubmit: (e) => { e.preventDefault(); this.send(); } },
          this.prompt,
          h('div.actions', {}, this.sendButton, this.stopButton),
        ),
        h('p.hint.muted', {}, 'Enter sends · Shift+Enter adds a line · Esc stops the answer'),
      ),
    );
    this.markSettings();
    this.renderConversation();
  }

  activate() {
    this.picker.start();
    this.prompt.focus();
  }

  deactivate() {
    this.picker.stop();
  }

  pick(id) {
    const conv = this.store.current();
    conv.model = id;
    this.store.save();
    this.settings.showDefaults();
  }

  newChat() {
    this.store.create(this.picker.chosen);
    this.renderConversation();
    this.prompt.focus();
  }

  saveSettings(s) {
    if (!this.store.saveSettings(s)) this.showBanner('This browser did not save the settings (storage full or off).');
    this.markSettings();
  }

  markSettings() {
    this.settingsButton.textContent = anySet(this.store.settings) ? 'Settings •' : 'Settings';
  }

  toggleSettings() {
    const open = this.settings.hidden;
    this.settings.hidden = !open;
    this.settingsButton.setAttribute('aria-expanded', String(open));
    if (open) {
      this.settings.showDefaults();
      this.settings.querySelector('textarea')?.focus();
    }
  }

  showBanner(text) {
    this.banner.textContent = text;
    this.banner.hidden = !text;
  }

  renderList() {
    const current = this.store.current();
    fill(
      this.list,
      this.store.conversations.map((c) =>
        h(
          'li',
          { class: c.id === current.id ? 'current' : null },
          h('button.conv', { type: 'button', 'aria-current': c.id === current.id ? 'true' : null, onclick: () => this.open(c.id) }, c.title || 'New chat'),
          h('button.link.delete', { type: 'button', 'aria-label': `Delete “${c.title || 'New chat'}”`, title: 'Delete', onclick: () => this.remove(c.id) }, '×'),
        ),
      ),
    );
  }

  open(id) {
    this.store.select(id);
    this.renderConversation();
  }

  remove(id) {
    if (this.streaming && this.store.current().id === id) this.stop();
    this.store.remove(id);
    this.renderConversation();
  }

  renderConversation() {
    const conv = this.store.current();
    if (conv.model) this.picker.choose(conv.model);
    this.renderList();
    this.messages.replaceChildren();
    for (const m of conv.messages) this.messages.append(this.itemFor(m));
    if (!conv.messages.length) {
      this.messages.append(h('li.empty.muted', {}, 'Pick a model and say something. Conversations stay in this browser.'));
    }
    this.scrollDown(true);
  }

  itemFor(m) {
    const li = h('li');
    renderMessage(li, m);
    this.items.set(m, li);
    return li;
  }

  /** Redraw one message at the next frame (a stream delivers many pieces a frame). */
  scheduleRender(m) {
    if (this.pendingRender.has(m)) return;
    this.pendingRender.add(m);
    requestAnimationFrame(() => {
      this.pendingRender.delete(m);
      const li = this.items.get(m);
      if (li) {
        const stick = this.nearBottom();
        renderMessage(li, m);
        if (stick) this.scrollDown(true);
      }
    });
  }

  nearBottom() {
    const el = this.messages;
    return el.scrollHeight - el.scrollTop - el.clientHeight < 80;
  }

  scrollDown(force) {
    if (force || this.nearBottom()) this.messages.scrollTop = this.messages.scrollHeight;
  }

  /** While an answer waits for its first token, say what the engine is doing. */
  onEngines() {
    const s = this.streaming;
    if (!s || s.answer.content) return;
    const e = this.picker.engineOf(s.answer.model);
    const text = {
      starting: `Loading ${s.answer.model}…`,
      crashed: `Restarting the ${s.answer.model} engine…`,
      draining: `Waiting for the ${s.answer.model} engine to stop and start again…`,
    }[e?.state] || 'Waiting for the model…';
    if (text !== s.answer.waitingText) {
      s.answer.waitingText = text;
      this.scheduleRender(s.answer);
    }
  }

  setBusy(busy) {
    this.sendButton.disabled = busy;
    this.stopButton.hidden = !busy;
    this.sendButton.hidden = busy;
    if (!busy) this.prompt.focus();
    else this.stopButton.focus({ preventScroll: true });
  }

  async send() {
    const text = this.prompt.value.trim();
    const model = this.picker.chosen;
    if (!text || this.streaming) return;
    if (!model) {
      this.showBanner('No model to send to: the server lists none, or it is unreachable.');
      return;
    }
    this.showBanner('');
    const conv = this.store.current();
    if (!conv.messages.length) this.messages.replaceChildren();
    conv.model = model;
    const answer = { role: 'assistant', model, content: '', pending: true };
    conv.messages.push({ role: 'user', content: text }, answer);
    this.store.touch(conv);
    this.renderList();
    this.messages.append(this.itemFor(conv.messages[conv.messages.length - 2]), this.itemFor(answer));
    this.scrollDown(true);
    this.prompt.value = '';
    const controller = new AbortController();
    this.streaming = { controller, answer };
    this.setBusy(true);
    this.picker.waiting = true;
    this.picker.kick();
    try {
      const body = buildRequest(model, conv.messages.slice(0, -1), this.store.settings);
      answer.timing = { t0: performance.now(), first: null, last: null, pieces: 0 };
      await streamAnswer({
        body,
        answer,
        signal: controller.signal,
        onUpdate: () => this.scheduleRender(answer),
        onHead: () => {
          this.picker.waiting = false;
        },
      });
    } catch (e) {
      if (e.name === 'AbortError') {
        answer.stopped = true;
      } else {
        answer.error = explain(e, model);
        answer.errorCode = e.code;
      }
      if (answer.timing && answer.timing.first !== null) answer.stats = statsOf(answer.usage, answer.timing);
    } finally {
      delete answer.timing;
      delete answer.waitingText;
      answer.pending = false;
      this.picker.waiting = false;
      this.streaming = null;
      if (!this.store.save()) this.showBanner('This browser did not save the conversation (storage full or off).');
      this.scheduleRender(answer);
      this.setBusy(false);
      this.picker.kick();
    }
  }

  stop() {
    this.streaming?.controller.abort();
  }

  onMessageClick(e) {
    const button = e.target.closest('button.copy');
    if (!button) return;
    const code = button.parentElement.querySelector('code');
    navigator.clipboard?.writeText(code.textContent).then(
      () => {
        button.textContent = 'Copied';
        setTimeout(() => (button.textContent = 'Copy'), 1200);
      },
      () => {
        button.textContent = 'Select and copy';
      },
    );
  }
}
