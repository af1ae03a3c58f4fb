"""Costs by scope: what the profile and memory views group ops by before listing them.

An op's scope is ``op.scope``, the path of ``tl.scope`` blocks and library calls (``tl.nn``,
``tl.optim``: ``("layer3", "attention")``, ``("update", "adam")``) it was made in; a fused
op without one takes the scope the ops inside it share. The scopes every op shares (a
``tl.scope("model")`` around the whole program) are dropped, so that the top level is where
the program divides (the layers). Scopes are ordered as the program made them (by their
first op), so that ``layer2`` comes before ``layer10`` and identical layers sit side by side.
Ops are named as everywhere else (``search.op_title``: ``q · %934``).
"""
from __future__ import annotations

import re
import statistics

from .search import INLINE_KINDS, body_ops

NO_SCOPE = "(outside scopes)"
_DIGITS = re.compile(r"\d+")


def scope_of(op) -> tuple[str, ...]:
    """The op's scope path; a fused op without one: the longest one its inner ops share."""
    if op.scope:
        return tuple(op.scope)
    inner = [tuple(o.scope) for o in body_ops(op)]
    if not inner or not all(inner):
        return ()
    common = inner[0]
    for s in inner[1:]:
        n = 0
        while n < min(len(common), len(s)) and common[n] == s[n]:
            n += 1
        common = common[:n]
    return common


def scope_paths(sdg, ops=None) -> dict[int, tuple[str, ...]]:
    """Each op's scope path less the scopes every scoped op shares (so long as some op sits
    deeper: the top level is where the program divides); an op made in the shared scope
    itself is in ``"<scope> (own ops)"``; ``()``: outside scopes. ``ops``: the op ids to
    consider (all by default)."""
    ids = list(sdg.ops) if ops is None else list(ops)
    paths = {i: scope_of(sdg.ops[i]) for i in ids}
    scoped = [p for p in paths.values() if p]
    common = 0
    if scoped:
        first = scoped[0]
        while common < len(first) and all(len(p) > common and p[common] == first[common]
                                           for p in scoped) \
                and any(len(p) > common + 1 for p in scoped):
            common += 1
    if not common:
        return paths
    own = (f"{first[common - 1]} (own ops)",)
    return {i: (p[common:] or own) if p else () for i, p in paths.items()}


def scope_order(paths: dict[int, tuple[str, ...]]) -> dict[tuple[str, ...], int]:
    """Every scope (and every prefix of one), numbered in program order: by its first op."""
    order: dict[tuple[str, ...], int] = {}
    for i in sorted(paths):
        for j in range(1, len(paths[i]) + 1):
            order.setdefault(paths[i][:j], len(order))
    return order


def top_label(path: tuple[str, ...]) -> str:
    return path[0] if path else NO_SCOPE


def stem(name: str) -> str:
    """A scope's name with its numbers as ``#``: ``layer12`` -> ``layer#``."""
    return _DIGITS.sub("#", name)


# -- time ---------------------------------------------------------------------------------------
def time_unit(profile) -> tuple[str, str]:
    """``(unit, what)``: ``ms`` of measured time, or ``calls`` where nothing was timed; and
    in words what the numbers are."""
    if not any(v > 0 for v in profile.seconds.values()):
        return "calls", "kernel calls (this executor measured no per-op time)"
    if profile.synced:
        runs = len(getattr(profile, "sessions", ()))
        how = f"median of {runs} profiled runs" if runs > 1 else "profiled runs"
        return "ms", f"measured device time ({how})"
    return "ms", "measured host dispatch time (not synced: kernels may run later)"


def op_value(profile, i: int, unit: str) -> float:
    return profile.seconds.get(i, 0.0) * 1e3 if unit == "ms" else float(profile.calls.get(i, 0))


def scope_costs(sdg, profile) -> dict:
    """Top-level scopes in program order with what their ops cost: ``rows`` of
    ``{"scope", "value", "low", "high", "ops", "calls", "parts"}`` (``low``/``high``: the
    least and most over the profiled runs, where there were several; ``parts``: the value per
    scope one level down, ``""`` for the scope's own ops), ``unit``, ``what``, ``total``, and
    ``alike``: groups of scopes that do the same work (``like_scopes``)."""
    unit, what = time_unit(profile)
    ops = [i for i in profile.calls if i in sdg.ops]
    paths = scope_paths(sdg, ops)
    order = scope_order(paths)
    rows: dict[str, dict] = {}
    sessions = getattr(profile, "sessions", [])
    sessions = sessions if unit == "ms" and len(profile.sessions) > 1 else []
    for i in sorted(ops):
        path = paths[i]
        top = top_label(path)
        row = rows.setdefault(top, {"scope": top, "value": 0.0, "ops": 0, "calls": 0,
                                    "parts": {}, "runs": [0.0] * len(sessions),
                                    "order": order.get(path[:1], -1), "kinds": []})
        v = op_value(profile, i, unit)
        row["value"] += v
        row["ops"] += 1
        row["calls"] += profile.calls.get(i, 0)
        part = path[1] if len(path) > 1 else ""
        row["parts"][part] = row["parts"].get(part, 0.0) + v
        for k, s in enumerate(sessions):
            row["runs"][k] += s.get(i, 0.0) * 1e3
        if sdg.ops[i].kind not in INLINE_KINDS:
            row["kinds"].append(sdg.ops[i].kind)
    out = sorted(rows.values(), key=lambda r: r["order"])
    for r in out:
        # the value is the sum of each op's median: it may lie outside the runs' own sums
        r["low"] = min(r["runs"] + [r["value"]])
        r["high"] = max(r["runs"] + [r["value"]])
    return {"rows": out, "unit": unit, "what": what,
            "total": sum(r["value"] for r in out), "alike": like_scopes(out),
            "elsewhere": counted_elsewhere(sdg, profile, paths)}


def like_scopes(rows: list[dict]) -> list[dict]:
    """Scopes that do the same work: the same name but for its numbers (``layer#``) and the
    same op kinds (constants aside). Per group of at least two: ``names``, ``median``,
    ``low``, ``high`` and ``spread`` (high / low)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["scope"] != NO_SCOPE:
            groups.setdefault((stem(r["scope"]), tuple(sorted(r["kinds"]))), []).append(r)
    out = []
    for (name, _), rs in groups.items():
        if len(rs) < 2:
            continue
        vals = [r["value"] for r in rs]
        out.append({"stem": name, "names": [r["scope"] for r in rs],
                    "median": statistics.median(vals), "low": min(vals), "high": max(vals),
                    "spread": max(vals) / min(vals) if min(vals) > 0 else float("inf"),
                    "run_spread": _run_spread(rs)})
    return out


def _run_spread(rows: list[dict]) -> float | None:
    """How much one scope's time moves between profiled runs (the largest high / low): a
    difference between like scopes below this is noise of the measurement. None: one run."""
    if not any(r["runs"] for r in rows):
        return None
    out = 1.0
    for r in rows:
        if r["low"] > 0:
            out = max(out, r["high"] / r["low"])
    return out


def counted_elsewhere(sdg, profile, paths) -> dict[str, int]:
    """Per top-level scope: its ops that XLA fused into a kernel whose time is counted under
    an op of another top-level scope (``profile.fused``), so that their time is there."""
    out: dict[str, int] = {}
    for i, (_kernel, root) in (profile.fused or {}).items():
        if i in paths and root in sdg.ops:
            mine = top_label(paths[i])
            theirs = top_label(paths.get(root, scope_of(sdg.ops[root])))
            if mine != theirs:
                out[mine] = out.get(mine, 0) + 1
    return out


# -- memory -------------------------------------------------------------------------------------
def store_shape(store, op, bounds) -> tuple[int, ...]:
    """The store's buffer shape: per dim of the op's domain its slots (a ring), or the
    points it holds at ``bounds`` in whole blocks (a growing axis), then the spatial shape."""
    lead = []
    for d, s, b in zip(op.domain, store.slots, store.blocks):
        if s is not None:
            lead.append(s)
        else:
            x = (bounds or {}).get(d.bound.name, b)
            lead.append(-(-x // b) * b)
    return (*lead, *store.spatial)


def largest_stores(plan, bounds=None, top: int = 20) -> list[dict]:
    """The ``top`` stores by bytes (at ``bounds``; a growing store's one block without them),
    largest first: ``op``, ``name`` (``op_title``), ``scope`` (``/``-joined), ``shape``,
    ``dtype``, ``bytes``, ``kind``, ``live`` (first and last schedule step)."""
    from .search import op_title

    sdg = plan.sdg
    paths = scope_paths(sdg, plan.storages)
    rows = []
    for i, s in plan.storages.items():
        op = sdg.ops[i]
        shape = store_shape(s, op, bounds)
        n = s.dtype.itemsize
        for x in shape:
            n *= x
        rows.append({"op": i, "name": op_title(op), "scope": "/".join(paths[i]) or NO_SCOPE,
                     "shape": shape, "dtype": s.dtype.name, "bytes": n, "kind": s.kind,
                     "live": plan.lifetimes.get(i, (0, 0))})
    rows.sort(key=lambda r: (-r["bytes"], r["op"]))
    return rows[:top]
