"""Canonical text of a small isl problem over a few statements, so that the repeated layers of
a program (a decoder's blocks written out one by one) solve each problem once.

A problem is named by the statements it involves (``op12``, ``op40``, ...) and their schedule,
whose constant positions (sequence indices of the schedule tree) differ from layer to layer.
The key renames the statements ``S0, S1, ...`` in id order and replaces every constant at a
position of the time vector by its rank among the involved statements' constants there: the
lexicographic order of any two instances is unchanged, so a lexmax or a "runs before" answer
read off the key holds for every problem with that key. Two times are only compared at a
position where they agree before it; where such statements mix constants with expressions there
(never in a schedule tree, where equal prefixes share a node; possible in a schedule read back
from an AST), there is no key and the caller computes directly.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import islpy as isl

_OP = re.compile(r"\bop(\d+)\b")
_RANGE = re.compile(r"->\s*\[([^\[\]]*)\]")
_INT = re.compile(r"-?\d+")


def _entries(text: str) -> list[str] | None:
    """The time vector of a statement's schedule map, entry by entry (None: not one piece)."""
    ranges = set(_RANGE.findall(text))
    if len(ranges) != 1:
        return None
    out, depth, cur = [], 0, ""
    for ch in ranges.pop():
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + [cur.strip()]


class Keys:
    """Keys for problems over the statements of one schedule map."""

    def __init__(self, by_op: dict[int, isl.Map], context: str = ""):
        self.text = {i: str(m) for i, m in by_op.items()}
        self.entries = {i: _entries(t) for i, t in self.text.items()}
        self.context = context

    def key(self, ops: Iterable[int], objects: Sequence = ()) -> tuple[str, list[int]] | None:
        """``(key, ops in key order)`` for a problem over ``ops``' schedule and ``objects``
        (isl sets and maps naming only these statements), or None."""
        order = sorted(set(ops))
        entries = [self.entries.get(i) for i in order]
        if any(e is None for e in entries) or len({len(e) for e in entries}) > 1:
            return None
        ranks = []
        for k in range(len(entries[0]) if entries else 0):
            kinds: dict[tuple, set] = {}  # statements whose times agree up to k compare at k
            for e in entries:
                kinds.setdefault(tuple(e[:k]), set()).add(bool(_INT.fullmatch(e[k])))
            if any(len(v) > 1 for v in kinds.values()):
                return None
            ints = {e[k] for e in entries if _INT.fullmatch(e[k])}
            ranks.append({c: str(r) for r, c in enumerate(sorted(ints, key=int))})
        names = {f"op{i}": f"S{j}" for j, i in enumerate(order)}

        def rename(text: str) -> str:
            return _OP.sub(lambda m: names.get(m.group(0), m.group(0)), text)

        parts = [self.context]
        for i, e in zip(order, entries):
            vector = ", ".join(ranks[k].get(c, c) for k, c in enumerate(e))
            parts.append(rename(_RANGE.sub(f"-> [{vector}]", self.text[i])))
        parts += sorted(rename(str(x)) for x in objects)
        return "\n".join(parts), order
