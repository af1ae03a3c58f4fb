"""The facts about one op that the node inspector shows: where the user wrote it, its domain,
shape, dtype, reads and readers, its storage and, after a run, its kernel time and bytes."""
from __future__ import annotations

import html
import linecache
import os

from tempo_lab.errors import cell_name
from tempo_lab.symbolic import TRUE

from .graph import INLINE_KINDS
from .palette import region_of
from .search import op_names, op_title
from .units import amount, nbytes


def op_facts(sdg, op_id: int, plan=None, profile=None, bounds=None) -> dict[str, str]:
    """Label -> text, in display order; pure, so tests and the tutorial can print it."""
    op = sdg.ops[op_id]
    src = linecache.getline(op.loc.file, op.loc.line).strip()
    facts = {"op": f"{op_title(op)} ({op.kind}, {op.category})",
             "source": f"{op.loc.place}" + (f": {src}" if src else ""),
             "domain": region_of(op),
             "shape": str(tuple(str(s) for s in op.type.shape)).replace("'", ""),
             "dtype": op.type.dtype.name}
    names = op_names(op)
    if len(names) > 1:
        facts["names"] = ", ".join(names)   # a fused op: the names of the ops inside it
    if op.loc.call:
        facts["made by"] = op.loc.call
    if len(op.loc.stack) > 1:
        facts["called from"] = " → ".join(
            f"{fn.split('.<locals>.')[-1]} ({place(f, n)})" for f, n, fn in op.loc.stack)
    if op.scope:
        facts["scope"] = "/".join(op.scope)
    attrs = op.attrs_str()
    if attrs:
        facts["attrs"] = attrs
    links = op_links(sdg, op_id)
    facts["reads"] = ", ".join(text for _, text in links["reads"]) or "-"
    facts["read by"] = ", ".join(text for _, text in links["read by"]) or "-"
    outs = [n for n, i in sdg.outputs.items() if i == op_id]
    if outs:
        facts["output"] = ", ".join(outs)
    if plan is not None:
        s = plan.storages.get(op_id)
        if s is None:
            facts["storage"] = "none (not read after it is computed, or folded away)"
        else:
            a, b = plan.lifetimes.get(op_id, (0, 0))
            facts["storage"] = f"{s.describe()}, live steps {a}..{b}"
            if bounds:
                ext = tuple(bounds.get(d.bound.name, 1) for d in op.domain)
                facts["bytes"] = f"{nbytes(s.bytes_for(ext))} at the run's bounds"
    if profile is not None and op_id in profile.calls:
        facts["time"] = time_fact(sdg, profile, op_id)
    return facts


def place(file: str, line: int) -> str:
    """``cell [3], line 4`` for a notebook cell, else ``file.py:4``."""
    cell = cell_name(file)
    return f"{cell}, line {line}" if cell else f"{os.path.basename(file)}:{line}"


def op_links(sdg, op_id: int) -> dict[str, list[tuple[int, str]]]:
    """The ops ``op_id`` reads (with the index read and the branch's condition) and those
    that read it, as ``(op id, text)``: the inspector links each to its op."""
    reads = []
    for e in sdg.in_edges(op_id):
        ref = op_title(sdg.ops[e.src])
        if e.index and not e.is_identity(sdg.ops[e.src]):
            ref += f" [{e.index_str()}]"
        if e.cond != TRUE:
            ref += f" if {e.cond}"
        reads.append((e.src, ref))
    readers = sorted({e.dst for e in sdg.out_edges(op_id)})
    return {"reads": reads, "read by": [(i, op_title(sdg.ops[i])) for i in readers]}


def time_fact(sdg, profile, op_id: int) -> str:
    """What the run measured of an op, or where its time went: a kernel XLA fused it into
    (counted under that kernel's root op), or nothing left of it to time."""
    n, sec = profile.calls[op_id], profile.seconds.get(op_id, 0.0)
    if op_id in profile.seconds or not profile.synced:
        return f"{n} calls, {amount(sec, 's')} in all, {amount(sec / n, 's')} per call"
    if op_id in profile.fused:
        kernel, root = profile.fused[op_id]
        return (f"{n} calls inside XLA's fused kernel {kernel}, whose time is counted under "
                f"{op_title(sdg.ops[root])}: {amount(profile.seconds.get(root, 0.0), 's')} in all")
    if sdg.ops[op_id].kind in INLINE_KINDS:
        return "a constant of the compiled program: no kernel, no time of its own"
    return (f"{n} calls; no instruction of its own is left in the compiled program (XLA folded "
            "it into the ops that read it, say a transpose into a dot): no time of its own")


def facts_html(facts: dict[str, str], links: dict[str, list[tuple[int, str]]] | None = None) \
        -> str:
    """The facts as a table; the facts in ``links`` (``op_links``) as links to their ops
    (``tl-op-link``, ``data-op``): a click selects the op and centres the graph on it."""
    def cell(k: str, v: str) -> str:
        if links and links.get(k):
            return ", ".join(f'<a href="#" class="tl-op-link" data-op="{i}" title="select '
                             f'{html.escape(text)}"><code>{html.escape(text)}</code></a>'
                             for i, text in links[k])
        return f'<code style="white-space:pre-wrap">{html.escape(v)}</code>'
    # long values (a source line, a storage) wrap: the inspector is a column beside the graph
    rows = "".join(f'<tr><th style="text-align:left;padding-right:1em;vertical-align:top">'
                   f'{html.escape(k)}</th><td style="overflow-wrap:anywhere">{cell(k, v)}'
                   f'</td></tr>' for k, v in facts.items())
    return f'<table class="tempo-lab-inspector" style="font-size:90%">{rows}</table>'

