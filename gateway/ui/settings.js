// The chat's settings panel: system prompt, sampling, structured output and tools. A
// field left empty is not sent at all, so the server's defaults (its --temperature and
// the rest, shown as placeholders from /v1/models' gen_defaults) apply.

import { h } from './dom.js';

const NUMBERS = [
  // [field, label, step, min, max]
  ['temperature', 'Temperature', '0.05', '0', '5'],
  ['top_p', 'Top p', '0.01', '0', '1'],
  ['top_k', 'Top k', '1', '0', '1000000'],
  ['min_p', 'Min p', '0.01', '0', '1'],
  ['max_tokens', 'Max tokens', '1', '1', ''],
  ['seed', 'Seed', '1', '', ''],
];
const INTEGERS = new Set(['top_k', 'max_tokens', 'seed']);

/**
 * The request fields the settings add (only those set), or `{error}` naming the field
 * that cannot be sent. Pure: tested without a browser.
 */
export function requestFields(s) {
  const out = {};
  for (const [k] of NUMBERS) {
    const raw = String(s[k] ?? '').trim();
    if (!raw) continue;
    const v = Number(raw);
    if (!Number.isFinite(v) || (INTEGERS.has(k) && !Number.isInteger(v))) return { error: `${k} is not a number` };
    out[k] = v;
  }
  if (s.format === 'json_object') out.response_format = { type: 'json_object' };
  if (s.format === 'json_schema') {
    let schema;
    try {
      schema = JSON.parse(s.schema || '{}');
    } catch (e) {
      return { error: `the JSON schema does not parse: ${e.message}` };
    }
    out.response_format = { type: 'json_schema', json_schema: { name: 'answer', schema } };
  }
  if ((s.tools || '').trim()) {
    let tools;
    try {
      tools = JSON.parse(s.tools);
    } catch (e) {
      return { error: `the tools do not parse: ${e.message}` };
    }
    if (!Array.isArray(tools)) return { error: 'tools must be a JSON list' };
    out.tools = tools;
    if (s.tool_choice) out.tool_choice = s.tool_choice;
  }
  return out;
}

/** The system message the settings add, or null. */
export function systemMessage(s) {
  const text = (s.system || '').trim();
  return text ? { role: 'system', content: text } : null;
}

/** Does anything differ from the server's defaults? (shown on the settings button) */
export function anySet(s) {
  const fields = requestFields(s);
  return Boolean(systemMessage(s)) || Object.keys(fields).length > 0;
}

/** The panel. `onChange(settings)` after each edit; `defaults()` gives gen_defaults. */
export function settingsPanel(initial, onChange, defaults) {
  const s = { ...initial };
  const changed = () => onChange({ ...s });
  const bind = (el, key) => {
    el.value = s[key] ?? '';
    el.addEventListener('input', () => {
      s[key] = el.value;
      changed();
    });
    return el;
  };
  const numbers = NUMBERS.map(([k, label, step, min, max]) => {
    const input = bind(h(`input#set-${k}`, { type: 'number', step, min: min || null, max: max || null }), k);
    return h('div.field', {}, h('label', { for: `set-${k}` }, label), input);
  });
  const schema = bind(h('textarea#set-schema.mono', { rows: 4, placeholder: '{"type": "object", "properties": {…}}' }), 'schema');
  const format = bind(
    h(
      'select#set-format',
      {},
      h('option', { value: '' }, 'text (default)'),
      h('option', { value: 'json_object' }, 'any JSON object'),
      h('option', { value: 'json_schema' }, 'JSON matching a schema'),
    ),
    'format',
  );
  const showSchema = () => {
    schemaField.hidden = format.value !== 'json_schema';
  };
  format.addEventListener('change', showSchema);
  const schemaField = h('div.field.wide', {}, h('label', { for: 'set-schema' }, 'JSON schema'), schema);
  const toolChoice = bind(
    h(
      'select#set-tool-choice',
      {},
      h('option', { value: '' }, 'auto (default)'),
      h('option', { value: 'none' }, 'none'),
      h('option', { value: 'required' }, 'required'),
    ),
    'tool_choice',
  );
  const panel = h(
    'div.settings#settings',
    { hidden: true },
    h(
      'div.field.wide',
      {},
      h('label', { for: 'set-system' }, 'System prompt'),
      bind(h('textarea#set-system', { rows: 3, placeholder: 'none (the model’s template decides)' }), 'system'),
    ),
    h('div.grid', {}, numbers),
    h('div.grid', {}, h('div.field', {}, h('label', { for: 'set-format' }, 'Output'), format), schemaField),
    h(
      'div.grid',
      {},
      h(
        'div.field.wide',
        {},
        h('label', { for: 'set-tools' }, 'Tools (OpenAI JSON list)'),
        bind(h('textarea#set-tools.mono', { rows: 3, placeholder: '[{"type": "function", "function": {"name": …}}]' }), 'tools'),
      ),
      h('div.field', {}, h('label', { for: 'set-tool-choice' }, 'Tool choice'), toolChoice),
    ),
    h(
      'div.row',
      {},
      h('span.muted', {}, 'Empty fields are not sent: the server’s defaults apply.'),
      h('button.link', {
        type: 'button',
        onclick: () => {
          for (const k of Object.keys(s)) delete s[k];
          for (const el of panel.querySelectorAll('input, textarea, select')) el.value = '';
          showSchema();
          changed();
        },
      }, 'Reset all'),
    ),
  );
  showSchema();
  /** Show the model's defaults as placeholders. */
  panel.showDefaults = () => {
    const d = defaults() || {};
    for (const [k] of NUMBERS) {
      const el = panel.querySelector(`#set-${k}`);
      const v = d[k];
      el.placeholder = v === undefined || v === null ? 'default' : `default ${v}`;
    }
  };
  return panel;
}
