// A small markdown renderer for model output that cannot inject HTML: the whole source is
// HTML-escaped first (& < > " '), and every rule after that only adds our own tags around
// text that is already escaped. Link targets are kept only when they are http(s) URLs
// (and they can hold no quote: quotes were escaped). Unfinished constructs (a code fence
// still streaming) render as what they will become.
//
// Blocks: fenced code (```lang), headings, lists (-, *, +, 1.), block quotes, rules,
// pipe tables, paragraphs. Inline: `code`, **bold**, *italic* / _italic_, ~~strike~~,
// [links](https://…), bare https:// links, hard line breaks.

export function escapeHtml(s) {
  return String(s)
    .replace(/&/g, '&amp;')
    .replace(/</g, '&lt;')
    .replace(/>/g, '&gt;')
    .replace(/"/g, '&quot;')
    .replace(/'/g, '&#39;');
}

/** Markdown source → an HTML string safe to assign to innerHTML. */
export function renderMarkdown(src) {
  const text = String(src ?? '').replace(/\r\n?/g, '\n').replace(/\u0000/g, '');
  return blocks(escapeHtml(text).split('\n'));
}

// The block rules, on lines that are escaped already (block quotes recurse on their
// inner lines, which were escaped with everything else: never twice).
function blocks(lines) {
  const out = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^\s*(`{3,}|~{3,})\s*([\w+#.-]*)/);
    if (fence) {
      i = codeBlock(lines, i, fence, out);
    } else if (/^\s*$/.test(line)) {
      i += 1;
    } else if (/^#{1,6}\s/.test(line)) {
      const level = line.match(/^#+/)[0].length;
      out.push(`<h${level}>${inline(line.slice(level).trim().replace(/\s#+$/, ''))}</h${level}>`);
      i += 1;
    } else if (isRule(line)) {
      out.push('<hr>');
      i += 1;
    } else if (/^\s*&gt;/.test(line)) {
      const quoted = [];
      while (i < lines.length && /^\s*&gt;/.test(lines[i])) {
        quoted.push(lines[i].replace(/^\s*&gt;\s?/, ''));
        i += 1;
      }
      out.push(`<blockquote>${blocks(quoted)}</blockquote>`);
    } else if (listItem(line)) {
      i = list(lines, i, out);
    } else if (isTableStart(lines, i)) {
      i = table(lines, i, out);
    } else {
      const para = [];
      while (i < lines.length && !/^\s*$/.test(lines[i]) && (para.length === 0 || !startsBlock(lines, i))) {
        para.push(lines[i]);
        i += 1;
      }
      out.push(`<p>${para.map(inline).join('<br>')}</p>`);
    }
  }
  return out.join('\n');
}

function isRule(line) {
  return /^\s{0,3}([-*_])(\s*\1){2,}\s*$/.test(line);
}

function startsBlock(lines, i) {
  const l = lines[i];
  return (
    /^\s*(`{3,}|~{3,})/.test(l) ||
    /^#{1,6}\s/.test(l) ||
    /^\s*&gt;/.test(l) ||
    isRule(l) ||
    listItem(l) !== null ||
    isTableStart(lines, i)
  );
}

function codeBlock(lines, start, fence, out) {
  const marker = fence[1];
  const lang = (fence[2] || '').toLowerCase().replace(/[^a-z0-9+#.-]/g, '');
  const body = [];
  let i = start + 1;
  while (i < lines.length && !lines[i].trim().startsWith(marker)) {
    body.push(lines[i]);
    i += 1;
  }
  const cls = lang ? ` class="lang-${lang}"` : '';
  const label = lang ? `<span class="code-lang">${lang}</span>` : '';
  out.push(
    `<div class="code">${label}<button type="button" class="copy" aria-label="Copy code">Copy</button>` +
      `<pre><code${cls}>${body.join('\n')}</code></pre></div>`,
  );
  return i + 1; // past the closing fence (or the end, while it streams)
}

function listItem(line) {
  const m = line.match(/^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/);
  if (!m) return null;
  return { indent: m[1].length, ordered: /\d/.test(m[2]), start: parseInt(m[2], 10), text: m[3] };
}

function list(lines, start, out) {
  const first = listItem(lines[start]);
  const tag = first.ordered ? 'ol' : 'ul';
  const startAttr = first.ordered && first.start !== 1 ? ` start="${first.start}"` : '';
  const items = [];
  let i = start;
  while (i < lines.length) {
    const item = listItem(lines[i]);
    if (item && item.indent <= first.indent && item.ordered === first.ordered) {
      items.push([item.text]);
      i += 1;
    } else if (items.length && /^\s+\S/.test(lines[i]) && !(item && item.indent <= first.indent)) {
      items[items.length - 1].push(lines[i].trim()); // a continuation or a nested line
      i += 1;
    } else {
      break;
    }
  }
  const lis = items.map((parts) => `<li>${parts.map(inline).join('<br>')}</li>`);
  out.push(`<${tag}${startAttr}>${lis.join('')}</${tag}>`);
  return i;
}

function cells(line) {
  return line.trim().replace(/^\|/, '').replace(/\|$/, '').split('|').map((c) => c.trim());
}

function isTableStart(lines, i) {
  return (
    i + 1 < lines.length &&
    lines[i].includes('|') &&
    /^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$/.test(lines[i + 1])
  );
}

function table(lines, start, out) {
  const head = cells(lines[start]);
  let i = start + 2;
  const rows = [];
  while (i < lines.length && lines[i].includes('|') && !/^\s*$/.test(lines[i])) {
    rows.push(cells(lines[i]));
    i += 1;
  }
  const th = head.map((c) => `<th>${inline(c)}</th>`).join('');
  const trs = rows.map((r) => `<tr>${r.map((c) => `<td>${inline(c)}</td>`).join('')}</tr>`).join('');
  out.push(`<div class="table"><table><thead><tr>${th}</tr></thead><tbody>${trs}</tbody></table></div>`);
  return i;
}

// Inline rules on escaped text. Code spans are cut out first so nothing inside them is
// touched, then put back.
function inline(text) {
  const kept = [];
  const keep = (html) => {
    kept.push(html);
    return `\u0000${kept.length - 1}\u0000`;
  };
  let s = text.replace(/`([^`]+)`/g, (_, c) => keep(`<code>${c}</code>`));
  s = s.replace(/\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g, (_, label, url) => link(url, label, keep));
  s = s.replace(/(^|[\s(])(https?:\/\/[^\s<)]*[^\s<).,;:!?])/g, (_, pre, url) => pre + link(url, url, keep));
  s = s.replace(/\*\*([^*]+)\*\*/g, '<strong>$1</strong>');
  s = s.replace(/__([^_]+)__/g, '<strong>$1</strong>');
  s = s.replace(/(^|[^*\w])\*([^*\s][^*]*?)\*(?!\w)/g, '$1<em>$2</em>');
  s = s.replace(/(^|[^_\w])_([^_\s][^_]*?)_(?!\w)/g, '$1<em>$2</em>');
  s = s.replace(/~~([^~]+)~~/g, '<del>$1</del>');
  // Links may hold kept code spans in their labels: restore until none is left.
  while (/\u0000\d+\u0000/.test(s)) s = s.replace(/\u0000(\d+)\u0000/g, (_, n) => kept[Number(n)]);
  return s;
}

// `url` is escaped text matching https?://[^\s)]+: it holds no quote or angle bracket.
// The label gets the emphasis rules; the target is kept away from them.
function link(url, label, keep) {
  const open = keep(`<a href="${url}" target="_blank" rel="noopener noreferrer">`);
  return `${open}${label === url ? keep(url) : label}${keep('</a>')}`;
}
