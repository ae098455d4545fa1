// The page: two views (#/chat, #/engines) built once and shown by the URL's hash, so a
// stream keeps going while the engines page is open; a connection line fed by /health;
// Alt+1 / Alt+2 switch views.

import { getJson } from './api.js';
import { setText } from './dom.js';
import { Store } from './store.js';
import { ChatView } from './chat.js';
import { EnginesView } from './engines.js';

const HEALTH_MS = 5000;

const store = new Store();
const views = { chat: new ChatView(store), engines: new EnginesView() };
const main = document.getElementById('view');
for (const v of Object.values(views)) main.append(v.el);

let shown = null;

function route() {
  const name = (location.hash.match(/^#\/(\w+)/) || [])[1];
  const next = views[name] ? name : 'chat';
  if (!views[name]) history.replaceState(null, '', '#/chat');
  if (next === shown) return;
  if (shown) {
    views[shown].deactivate();
    views[shown].el.hidden = true;
  }
  shown = next;
  views[next].el.hidden = false;
  for (const [k] of Object.entries(views)) {
    const link = document.getElementById(`nav-${k}`);
    if (k === next) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  document.title = next === 'chat' ? 'Chat · corral' : 'Engines · corral';
  views[next].activate();
}

window.addEventListener('hashchange', route);
window.addEventListener('keydown', (e) => {
  if (!e.altKey || e.ctrlKey || e.metaKey) return;
  if (e.key === '1') location.hash = '#/chat';
  else if (e.key === '2') location.hash = '#/engines';
  else return;
  e.preventDefault();
});

const conn = document.getElementById('conn');

async function health() {
  try {
    await getJson('/health');
    setText(conn, 'connected');
    conn.classList.remove('down');
  } catch {
    setText(conn, 'cannot reach corral');
    conn.classList.add('down');
  }
  setTimeout(health, HEALTH_MS);
}

route();
health();
