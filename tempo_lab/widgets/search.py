"""Op names for the views and search over them.

Every view names an op the same way: its name from the source (the user's variable, see
``frontend/names.py``; for a fused op, the names of the ops inside it), then its id,
``q · %934``; an op without a name is its id. ``op_title`` gives that.

Search works on tokens, not substrings. A query is terms combined with AND:

* ``word``: a whole token or a prefix of one (names, kinds, scopes, functions, files), where
  a prefix may not split a number: ``layer1`` finds scope ``layer1``, not ``layer10``, and
  ``layer`` finds them all; ``att`` finds ``att`` and ``attention``;
* ``kind:softmax`` the op's kind (or, for a fused op, a kind inside it);
* ``scope:layer11`` a scope or group the op sits in (same rule as a word);
* ``name:q`` a name only; ``line:19`` the line the op was written on (or a line of a
  user function's caller that made it); ``%934`` or ``id:934`` one op;
* ``/regex/`` a regular expression over the op's search line (case-insensitive).

Results are ranked: an exact name match first, then name prefixes, kinds, scopes, the rest;
constants after other ops; then program order. ``search.js`` does the same in the browser on
``search_rows``; tests keep the two in step.
"""
from __future__ import annotations

import re

from .palette import region_of

INLINE_KINDS = ("const", "dimval")   # constants: ranked last, hidden from pickers and code
_SPLIT = re.compile(r"[^0-9a-z]+")
_TERM = re.compile(r"/(?:[^/\\]|\\.)+/|\S+")
_PUNCT = "()[]{},;'\"`"
_DIGITS = "0123456789"

# scores of a word's best match, by field and exactness (higher first)
SCORES = {("name", True): 100, ("name", False): 60, ("kind", True): 50, ("scope", True): 40,
          ("kind", False): 30, ("scope", False): 20, ("word", True): 10, ("word", False): 5}


def op_names(op) -> list[str]:
    """The op's names: its own, then, for a fused op, those of the ops inside it (the
    result's first)."""
    out = [op.name] if op.name else []
    for inner in reversed(body_ops(op)):
        if inner.name and inner.name not in out:
            out.append(inner.name)
    return out


def op_name(op) -> str | None:
    names = op_names(op)
    return names[0] if names else None


def op_title(op) -> str:
    """``q · %934``: the op's name from the source, then its id; ``%934`` without a name."""
    name = op_name(op)
    return f"{name} · %{op.id}" if name else f"%{op.id}"


def op_code_name(op) -> str:
    """The op in loop code: ``q·%934``, or ``%934`` without a name."""
    name = op_name(op)
    return f"{name}·%{op.id}" if name else f"%{op.id}"


def body_ops(op) -> list:
    """The ops inside a fused op (none for another op)."""
    body = op.attrs.get("body") if op.kind == "fused" else None
    if not isinstance(body, tuple):
        return []
    out = [item[0] if isinstance(item, tuple) and item else item for item in body]
    return [o for o in out if hasattr(o, "kind")]


def body_kinds(op) -> list[str]:
    return [o.kind for o in body_ops(op)]


def tokens(text: str) -> list[str]:
    """A name as tokens: the whole, lower-cased, and its parts between other characters
    (``layer1_norm`` -> ``layer1_norm``, ``layer1``, ``norm``)."""
    low = text.lower()
    parts = [p for p in _SPLIT.split(low) if p]
    return list(dict.fromkeys([low] + parts)) if low else []


def op_fields(op, path: tuple[str, ...] = ()) -> dict[str, list]:
    """What search matches an op by: ``name``, ``kind`` (its own first), ``scope`` (its
    scopes and the groups it is drawn in), ``line`` (its own first, then its callers'),
    ``word`` (file, cell, domain, id); tokens lower-cased."""
    groups = [p.rstrip("()") for p in path[:-1] if not p.startswith("%")]
    inner = [s for o in body_ops(op) for s in getattr(o, "scope", ())]
    scope = [t for s in list(op.scope) + groups + inner for t in tokens(s)]
    loc = op.loc
    place = loc.place if loc.line else ""
    words = tokens(place) + tokens(region_of(op)) + [f"%{op.id}"]
    return {"name": [t for n in op_names(op) for t in tokens(n)],
            "kind": list(dict.fromkeys([op.kind.lower()] + [k.lower() for k in body_kinds(op)])),
            "scope": list(dict.fromkeys(scope)),
            "line": [loc.line] + [n for _, n, _ in loc.stack[:-1]],
            "word": list(dict.fromkeys(words))}


def search_line(op, path: tuple[str, ...] = ()) -> str:
    """The line a search result shows: title, kind, domain, place, groups."""
    where = op.loc.place if op.loc.line else "?"
    groups = " / ".join(path[:-1]) if path else " / ".join(op.scope)
    more = op_names(op)[1:]       # a fused op: the other names inside it
    title = op_title(op) + (f" ({', '.join(more)})" if more else "")
    return f"{title} · {op.kind} · {region_of(op)} · {where}" + (
        f" · {groups}" if groups else "")


def word_matches(word: str, token: str) -> int:
    """2: ``token`` is ``word``; 1: it starts with ``word`` without splitting a number
    (``layer1`` is no prefix of ``layer10``); 0: no match."""
    if token == word:
        return 2
    if token.startswith(word) and not (word[-1:] in _DIGITS and word
                                       and token[len(word)] in _DIGITS):
        return 1
    return 0


def parse(query: str) -> list[tuple[str, object]]:
    """Terms of a query: ``(field, value)`` with field ``any``, ``name``, ``kind``,
    ``scope``, ``line``, ``id`` or ``regex`` (a compiled pattern); a regex that does not
    compile is searched for as words."""
    terms: list[tuple[str, object]] = []
    for raw in _TERM.findall(query):
        if len(raw) > 2 and raw[0] == raw[-1] == "/":
            try:
                terms.append(("regex", re.compile(raw[1:-1], re.IGNORECASE)))
                continue
            except re.error:
                raw = raw[1:-1]
        low = raw.lower()
        field, _, value = low.partition(":")
        if value and field in ("kind", "scope", "line", "name", "id"):
            if field in ("line", "id"):
                terms.append((field, int(value) if value.isdigit() else -1))
            else:
                terms.extend((field, t) for t in tokens(value)[:1])
        elif low.startswith("%") and low[1:].isdigit():
            terms.append(("id", int(low[1:])))
        else:
            terms.extend(("any", t) for t in tokens(low.strip(_PUNCT))[:1])
    return terms


def term_score(term: tuple[str, object], op_id: int, fields: dict, line: str) -> int:
    """How well one term matches an op (0: not at all)."""
    field, value = term
    if field == "regex":
        return 10 if value.search(line) else 0
    if field == "id":
        return 100 if op_id == value else 0
    if field == "line":
        lines = fields["line"]
        return 40 if lines and lines[0] == value else 10 if value in lines else 0
    if field == "kind":
        kinds = fields["kind"]
        return 50 if kinds and kinds[0] == value else 20 if value in kinds else 0
    best = 0
    for name in (("name", "kind", "scope", "word") if field == "any" else (field,)):
        for token in fields[name]:
            m = word_matches(value, token)
            if m:
                best = max(best, SCORES[(name, m == 2)])
                if m == 2:
                    break
    return best


def search(rows, query: str) -> list[int]:
    """Op ids matching every term of ``query``, best first. ``rows``: ``search_rows``."""
    terms = parse(query)
    if not terms:
        return []
    hits = []
    for op_id, line, _own, constant, fields in rows:
        total = 0
        for term in terms:
            s = term_score(term, op_id, fields, line)
            if not s:
                break
            total += s
        else:
            hits.append((-total, constant, op_id))
    return [i for *_, i in sorted(hits)]


def search_rows(sdg, paths: dict[int, tuple[str, ...]] | None = None) -> list[list]:
    """One row per op for the browser's search box and ``search``: ``[op id, line shown,
    "name kind", is a constant, fields]`` (``op_fields``)."""
    if paths is None:
        from .graph import group_paths

        paths = group_paths(sdg)
    rows = []
    for op in sdg.ops.values():
        path = paths.get(op.id, ())
        rows.append([op.id, search_line(op, path),
                     f"{op_name(op) or ''} {op.kind}".strip().lower(),
                     op.kind in INLINE_KINDS, op_fields(op, path)])
    return rows
