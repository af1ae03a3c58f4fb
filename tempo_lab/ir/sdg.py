"""The symbolic dependence graph: primitive ops with domains, and edges that say which producer
points each consumer point reads. Immutable: passes build new SDGs."""
from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from ..errors import Location
from ..stage import Stage
from ..symbolic import TRUE, Cond, Dim, Expr, Slice
from ..symbolic import isl as I
from .ops import CATALOG, TensorType, norm_dim

SCHEMA = "tempo_lab.sdg/1"

# One colour per op category, fixed so that pictures are stable across runs.
CATEGORY_COLOURS = {"source": "#cfe8cf", "elementwise": "#dbe9f6", "reduce": "#f9dcc4",
                    "layout": "#eeeeee", "linalg": "#f6d5e5", "control": "#fff2b3",
                    "effect": "#e0d4f5", "fused": "#d5f0ec"}


@dataclass(frozen=True, eq=False)
class Op:
    id: int
    kind: str
    domain: tuple[Dim, ...]
    type: TensorType
    attrs: Mapping = field(default_factory=dict)
    loc: Location = Location("<unknown>", 0)
    name: str | None = None
    scope: tuple[str, ...] = ()  # tl.scope path it was made in

    @property
    def label(self) -> str:
        return self.name or f"%{self.id}"

    @property
    def category(self) -> str:
        return CATALOG[self.kind].category

    @property
    def closes_cycles(self) -> bool:
        """A merge that may close a cycle (a ``tl.placeholder``'s): demanded on its whole
        domain and numbered apart from its branches. A join a pass made of two parts of one
        op's domain (``attrs["join"]``, ``passes/prefix.py``) is demanded where it is read."""
        return self.kind == "merge" and not self.attrs.get("join")

    def attrs_str(self) -> str:
        return ", ".join(f"{k}={_attr_str(v)}" for k, v in sorted(self.attrs.items())
                         if k not in ("weak", "ndomain", "type"))


def _attr_str(v) -> str:
    if isinstance(v, tuple) and v and isinstance(v[0], tuple) and isinstance(v[0][0], Op):
        return "[" + ", ".join(op.kind for op, _ in v) + "]"  # a fused op's body
    if isinstance(v, np.ndarray):
        return str(v.item()) if v.ndim == 0 else f"array({TensorType(v.shape, v.dtype)})"
    if isinstance(v, np.dtype):
        return v.name
    if callable(v):
        return getattr(v, "__name__", type(v).__name__)
    return str(v)


# Dims the passes add, by role: "blocks" (tiling: the blocks of a range along a step dim),
# "parts" (incrementalisation: blocks of a vectorised dim's points, in its place), "prefix"
# (prefix splitting: a step dim's steps before a known prefix ends, passes/prefix.py).
ROLES = ("blocks", "parts", "prefix")


def read_type(producer: Op, e: Edge) -> TensorType:
    """The type of what read ``e`` gives its reader: the axes its slices prepend, then the
    producer's spatial shape at the points read."""
    lengths = tuple(norm_dim(x.length) for x in e.index if isinstance(x, Slice))
    points = {d: x for d, x in zip(producer.domain, e.index) if not isinstance(x, Slice)}
    shape = tuple(s if isinstance(s, int) else norm_dim(s.substitute(points))
                  for s in producer.type.shape)
    return TensorType(lengths + shape, producer.type.dtype, producer.type.weak)


@dataclass(frozen=True)
class Edge:
    """Consumer ``dst`` reads producer ``src`` (as its input ``slot``) at ``index``, under ``cond``.

    ``index`` has one entry per producer dim: a point expression or a slice, written in the
    consumer's dims. ``cond`` restricts the consumer points at which the read happens (branches).
    """

    dst: int
    src: int
    slot: int
    index: tuple[Expr | Slice, ...]
    cond: Cond = TRUE
    loc: Location = Location("<unknown>", 0)

    def index_str(self) -> str:
        return ", ".join(map(str, self.index))

    def is_identity(self, producer: Op) -> bool:
        return tuple(self.index) == tuple(producer.domain) and self.cond == TRUE


@dataclass(frozen=True, eq=False)
class Ragged:
    """A bound that depends on an outer dim's point: dim ``t`` of bound ``T`` has ``T_b``
    points at each point ``b`` of dim ``over``; ``T_b`` is ``lengths[b]``
    (``tl.lengths(lengths, over=b)``), or 1 + the first ``t`` where op ``done`` (a bool over
    ``(b, t)``) holds, at most ``max`` (``tl.until(done, max=N)``; ``lengths`` is then known
    after a run). Where ``b`` is in an op's domain, ``T`` means that instance's ``T_b``;
    elsewhere the longest."""

    over: str
    lengths: np.ndarray | None
    done: int | None = None
    max: int = 0

    @property
    def longest(self) -> int:
        return int(self.lengths.max()) if self.lengths is not None else self.max

    @property
    def shortest(self) -> int:
        return int(self.lengths.min()) if self.lengths is not None else 1

    def describe(self) -> str:
        if self.lengths is None:
            return f"1 + the first t where %{self.done} holds per {self.over}, at most {self.max}"
        return f"lengths[{self.over}] ({len(self.lengths)} instances, {self.shortest}.." \
               f"{self.longest} points)"


class SDG(Stage):
    """``untils`` maps the name of each data-dependent bound (``tl.until``) to the op that
    ends its dim: a bool over that dim alone; the dim stops after its first true point."""

    def __init__(self, dims, ops, edges, outputs: Mapping[str, int], sinks=(),
                 untils: Mapping[str, int] | None = None,
                 made: Mapping[str, tuple[str, str]] | None = None,
                 ragged: Mapping[str, Ragged] | None = None):
        self.dims: tuple[Dim, ...] = tuple(dims)
        self.ops: Mapping[int, Op] = MappingProxyType({op.id: op for op in ops})
        self.edges: tuple[Edge, ...] = tuple(sorted(edges, key=lambda e: (e.dst, e.slot)))
        self.outputs: Mapping[str, int] = MappingProxyType(dict(outputs))
        self.sinks: tuple[int, ...] = tuple(sinks)
        self.untils: Mapping[str, int] = MappingProxyType(dict(untils or {}))
        # dims a pass made: name -> (role, the dim it is made from); see ROLES
        self.made: Mapping[str, tuple[str, str]] = MappingProxyType(dict(made or {}))
        self.ragged: Mapping[str, Ragged] = MappingProxyType(dict(ragged or {}))
        self._isl: dict = {}  # isl maps and boxes, made on first use
        self._in: dict[int, list[Edge]] = {i: [] for i in self.ops}
        self._out: dict[int, list[Edge]] = {i: [] for i in self.ops}
        for e in self.edges:
            self._in[e.dst].append(e)
            self._out[e.src].append(e)

    # -- queries ------------------------------------------------------------------------------
    def in_edges(self, op_id: int) -> list[Edge]:
        return self._in[op_id]

    def out_edges(self, op_id: int) -> list[Edge]:
        return self._out[op_id]

    @property
    def roots(self) -> tuple[int, ...]:
        """What the program is for: its outputs, its sinks, and what ends its data-dependent
        dims."""
        return (tuple(self.outputs.values()) + self.sinks + tuple(self.untils.values())
                + tuple(r.done for r in self.ragged.values() if r.done is not None))

    def with_ragged(self, ragged: Mapping[str, Ragged]) -> SDG:
        """The same graph with other ragged bounds (e.g. lengths found by a run)."""
        return SDG(self.dims, self.ops.values(), self.edges, self.outputs, self.sinks,
                   self.untils, self.made, ragged)

    def until_dim(self, bound: str) -> Dim:
        return next(d for d in self.dims if d.bound.name == bound)

    def role(self, d: Dim) -> str | None:
        """The role of a dim a pass made (see ``ROLES``), else None."""
        return self.made.get(d.name, (None,))[0]

    def parted(self, op: Op) -> dict[str, str]:
        """The vectorised dims of ``op`` that run in blocks: their parts dim -> the dim."""
        names = {x.name for x in op.domain}
        return {m: src for m, (role, src) in self.made.items()
                if role == "parts" and m in names and src in op.attrs.get("vdims", ())}

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(d.bound.name for d in self.dims)

    def isl_map(self, e: Edge) -> I.isl.Map:
        """The edge as an isl map from consumer points to the producer points they read
        (made once: the SDG does not change)."""
        m = self._isl.get(e)
        if m is None:
            c, p = self.ops[e.dst], self.ops[e.src]
            m = self._isl[e] = I.edge_map((f"op{c.id}", c.domain), (f"op{p.id}", p.domain),
                                          e.index, e.cond, self.params)
        return m

    def isl_domain(self, op_id: int) -> I.isl.Set:
        key = ("domain", op_id)
        if key not in self._isl:
            op = self.ops[op_id]
            self._isl[key] = I.box(op.domain, self.params).set_tuple_name(f"op{op.id}")
        return self._isl[key]

    # -- stage vocabulary ---------------------------------------------------------------------
    def __repr__(self) -> str:
        return (f"SDG(ops={len(self.ops)}, edges={len(self.edges)}, "
                f"dims=({', '.join(d.name for d in self.dims)}))")

    def op_line(self, op: Op) -> str:
        ins = []
        for e in self.in_edges(op.id):
            ref = self.ops[e.src].label
            if e.index and tuple(e.index) != tuple(self.ops[e.src].domain):
                ref += f"[{e.index_str()}]"
            if e.cond != TRUE:
                ref += f" if {e.cond}"
            ins.append(ref)
        attrs = op.attrs_str()
        args = ", ".join(ins + ([attrs] if attrs else []))
        dom = ", ".join(map(str, op.domain))
        return f"{op.label} = {op.kind}({args}) : {op.type} over ({dom})  @ {op.loc}"

    def _sections(self):
        outs = [f"{name} = {self.ops[i].label}" for name, i in self.outputs.items()]
        outs += [f"sink {self.ops[i].label}" for i in self.sinks]
        outs += [f"{b} = 1 + the first {self.until_dim(b)} where {self.ops[i].label}"
                 for b, i in self.untils.items()]
        outs += [f"{b} = {r.describe()} (ragged)" for b, r in self.ragged.items()]
        by_dom: dict[str, int] = {}
        for op in self.ops.values():
            key = "(" + ", ".join(map(str, op.domain)) + ")"
            by_dom[key] = by_dom.get(key, 0) + 1
        return [("domains", [f"{k}: {v} ops" for k, v in sorted(by_dom.items())]),
                ("ops", [self.op_line(op) for op in self.ops.values()]),
                ("outputs", outs)]

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "dims": [d.name for d in self.dims],
            "ops": [{"id": op.id, "kind": op.kind, "name": op.name, "category": op.category,
                     "domain": [d.name for d in op.domain],
                     "shape": [str(s) for s in op.type.shape], "dtype": op.type.dtype.name,
                     "attrs": {k: _attr_str(v) for k, v in sorted(op.attrs.items())
                               if k not in ("weak", "type")},
                     "file": op.loc.file, "line": op.loc.line, "scope": list(op.scope),
                     "stack": [{"file": f, "line": n, "function": fn}
                               for f, n, fn in op.loc.stack],
                     "call": op.loc.call}
                    for op in self.ops.values()],
            "edges": [{"dst": e.dst, "src": e.src, "slot": e.slot,
                       "index": [str(x) for x in e.index], "cond": str(e.cond),
                       "file": e.loc.file, "line": e.loc.line} for e in self.edges],
            "outputs": dict(self.outputs),
            "sinks": list(self.sinks),
            "untils": dict(self.untils),
            "ragged": {b: {"over": r.over, "done": r.done, "max": r.max,
                           "lengths": None if r.lengths is None else r.lengths.tolist()}
                       for b, r in self.ragged.items()},
            "made_dims": {k: list(v) for k, v in self.made.items()},
        }

    def to_dot(self) -> str:
        """Graphviz DOT, data flowing from producer to consumer; one cluster per domain."""
        lines = ["digraph SDG {", '  rankdir=TB; node [shape=box, style="rounded,filled", '
                 'fontname="Helvetica", fontsize=10]; edge [fontname="Helvetica", fontsize=9];']
        clusters: dict[tuple, list[Op]] = {}
        for op in self.ops.values():
            clusters.setdefault(op.domain, []).append(op)
        outputs = {i: n for n, i in self.outputs.items()}
        for k, (dom, ops) in enumerate(sorted(clusters.items(), key=lambda kv: len(kv[0]))):
            name = ", ".join(map(str, dom))
            lines.append(f'  subgraph cluster_{k} {{ label="({dot_quote(name)})"; style=dashed; '
                         f'color="{_domain_colour(name)}";')
            for op in ops:
                label = f"{dot_quote(op.label)} {op.kind}\\n{dot_quote(str(op.type))}"
                if op.id in outputs:
                    label += f"\\n→ {dot_quote(outputs[op.id])}"
                lines.append(f'    n{op.id} [label="{label}", '
                             f'fillcolor="{CATEGORY_COLOURS[op.category]}"];')
            lines.append("  }")
        for e in self.edges:
            parts = []
            if not e.is_identity(self.ops[e.src]) and e.index:
                parts.append(e.index_str())
            if e.cond != TRUE:
                parts.append(f"if {e.cond}")
            label = "\\n".join(map(dot_quote, parts))
            style = ', style=dashed' if self.ops[e.dst].kind == "merge" else ""
            lines.append(f'  n{e.src} -> n{e.dst} [label="{label}"{style}];')
        lines.append("}")
        return "\n".join(lines)


def taken_view(graph, i: int, cheap: set[int]) -> bool:
    """Whether op ``i`` is a ``take`` of a value held over fewer dims, read at its own point,
    at an index of ``cheap`` ops read at theirs (a layer's weights at the layer's index,
    ``tl.take(w, n)``): as cheap to take again where a reader runs as an index function."""
    op = graph.ops[i]
    if op.kind != "take" or op.attrs.get("vdims"):
        return False
    ins = graph.in_edges(i)
    if len(ins) != 2 or any(e.cond != TRUE for e in ins):
        return False
    value, index = (graph.ops[e.src] for e in ins)
    return bool(value.domain) and set(value.domain) < set(op.domain) \
        and tuple(ins[0].index) == tuple(value.domain) and index.id in cheap \
        and tuple(ins[1].index) == tuple(index.domain)


def taken_views(graph, cheap: set[int]) -> set[int]:
    """The ``taken_view`` ops read by one op each (``passes/vectorise.py`` gives each reader
    its own): placed with their reader, as index functions are."""
    return {i for i in graph.ops if taken_view(graph, i, cheap)
            and len({e.dst for e in graph.out_edges(i)}) == 1}


def index_functions(graph) -> set[int]:
    """The ops (of an SDG or a pass's Editor) computed from dim values alone: a dimval, or a
    computing op (not a source, an effect or a placeholder) whose inputs are such ops read at their own point or constants
    without a domain (at least one not a constant). Cheap to recompute anywhere, so passes
    recompute them where they are read and the scheduler places them with their readers."""
    memo: dict[int, bool] = {}

    def test(i: int) -> bool:
        if i not in memo:
            op = graph.ops[i]
            memo[i] = False  # a cycle (a placeholder) is not an index function
            if op.kind == "dimval":
                memo[i] = bool(op.domain)
            elif CATALOG[op.kind].category not in ("source", "effect", "control") \
                    or op.kind in ("identity", "fused"):
                ins = graph.in_edges(i)
                srcs = [graph.ops[e.src] for e in ins]
                memo[i] = any(p.kind != "const" for p in srcs) and all(
                    e.cond == TRUE and ((p.kind == "const" and not p.domain)
                                        or (e.index == tuple(p.domain) and test(p.id)))
                    for e, p in zip(ins, srcs))
        return memo[i]

    return {i for i in graph.ops if test(i)}


def _domain_colour(name: str) -> str:
    palette = ["#4c72b0", "#55a868", "#c44e52", "#8172b2", "#ccb974", "#64b5cd"]
    return palette[zlib.crc32(name.encode()) % len(palette)]


# what no picture or page should carry raw: control characters but tab and line breaks (a
# NUL ends graphviz's input there: the dashboard lost its graph), lone surrogates (no UTF-8)
_UNSHOWABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def _shown(m: re.Match) -> str:
    """A control character as its Unicode picture (NUL as ␀, DEL as ␡), another as �."""
    c = ord(m.group())
    return chr(0x2400 + c) if c < 0x20 else "\u2421" if c == 0x7F else "\ufffd"


def showable(s: str) -> str:
    """``s`` with control characters (but tab and line breaks) and lone surrogates shown as
    symbols: what of a user's names reaches DOT, SVG and HTML."""
    return _UNSHOWABLE.sub(_shown, s)


def dot_quote(s: str) -> str:
    """``s`` inside a DOT double-quoted string: backslashes, quotes and line breaks escaped,
    other control characters shown as symbols (a user's names reach the text; one with a
    quote or a NUL made the whole DOT invalid)."""
    return showable(str(s).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
                    .replace("\r", ""))
