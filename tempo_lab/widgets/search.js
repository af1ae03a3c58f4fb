// Search over ops by tokens, as search.py does in Python (the tests run both on the same
// rows and queries): terms joined by AND, each a word (a whole token, or a prefix that does
// not split a number: "layer1" is not "layer10"), kind:x, scope:x, name:x, line:n, id:n or
// %n, or /regex/. Rows are graph.search_rows: [op id, line shown, "name kind", constant,
// fields {name, kind, scope, line, word}]. Plain functions, prepended to the canvas module.

const TL_SCORES = { name: [60, 100], kind: [30, 50], scope: [20, 40], word: [5, 10] };
const TL_PUNCT = "()[]{},;'\"`";

function tlTokens(text) {
  const low = text.toLowerCase();
  if (!low) return [];
  const parts = low.split(/[^0-9a-z]+/).filter(Boolean);
  return [...new Set([low, ...parts])];
}

function tlStrip(s) {
  let a = 0, b = s.length;
  while (a < b && TL_PUNCT.includes(s[a])) a++;
  while (b > a && TL_PUNCT.includes(s[b - 1])) b--;
  return s.slice(a, b);
}

function tlWordMatches(word, token) {
  if (token === word) return 2;
  if (token.startsWith(word) &&
      !(/[0-9]$/.test(word) && /[0-9]/.test(token[word.length]))) return 1;
  return 0;
}

function tlParse(query) {
  const terms = [];
  for (let raw of query.match(/\/(?:[^/\\]|\\.)+\/|\S+/g) || []) {
    if (raw.length > 2 && raw[0] === "/" && raw[raw.length - 1] === "/") {
      try {
        terms.push(["regex", new RegExp(raw.slice(1, -1), "i")]);
        continue;
      } catch (e) {
        raw = raw.slice(1, -1);
      }
    }
    const low = raw.toLowerCase();
    const colon = low.indexOf(":");
    const field = colon > 0 ? low.slice(0, colon) : "", value = low.slice(colon + 1);
    if (colon > 0 && value && ["kind", "scope", "line", "name", "id"].includes(field)) {
      if (field === "line" || field === "id") {
        terms.push([field, /^[0-9]+$/.test(value) ? Number(value) : -1]);
      } else {
        const t = tlTokens(value);
        if (t.length) terms.push([field, t[0]]);
      }
    } else if (/^%[0-9]+$/.test(low)) {
      terms.push(["id", Number(low.slice(1))]);
    } else {
      const t = tlTokens(tlStrip(low));
      if (t.length) terms.push(["any", t[0]]);
    }
  }
  return terms;
}

function tlTermScore([field, value], id, fields, line) {
  if (field === "regex") return value.test(line) ? 10 : 0;
  if (field === "id") return id === value ? 100 : 0;
  if (field === "line") {
    const lines = fields.line;
    return lines.length && lines[0] === value ? 40 : lines.includes(value) ? 10 : 0;
  }
  if (field === "kind") {
    const kinds = fields.kind;
    return kinds.length && kinds[0] === value ? 50 : kinds.includes(value) ? 20 : 0;
  }
  let best = 0;
  for (const name of field === "any" ? ["name", "kind", "scope", "word"] : [field]) {
    for (const token of fields[name]) {
      const m = tlWordMatches(value, token);
      if (m) {
        best = Math.max(best, TL_SCORES[name][m - 1]);
        if (m === 2) break;
      }
    }
  }
  return best;
}

// [[-score, constant, id, line], ...] best first, for every row that matches every term
function tlSearch(rows, query) {
  const terms = tlParse(query);
  if (!terms.length) return [];
  const out = [];
  for (const [id, line, , constant, fields] of rows) {
    let total = 0, ok = true;
    for (const term of terms) {
      const s = tlTermScore(term, id, fields, line);
      if (!s) { ok = false; break; }
      total += s;
    }
    if (ok) out.push([-total, constant ? 1 : 0, id, line]);
  }
  return out.sort((a, b) => a[0] - b[0] || a[1] - b[1] || a[2] - b[2]);
}
