"""``tl.save`` / ``tl.load``: stage objects to JSON and back, so that a colleague can read and
explore a compiled program's views (graph, passes, loop code, memory plan) without its code.

What comes back is what ``to_dict()`` wrote: an SDG, a PassTrace and a MemoryPlan are the real
classes again (index expressions and conditions are parsed back from their text; attributes
that were not plain values stay text); a schedule comes back as its loop code and isl schedule
tree, a program as a ``SavedProgram`` that holds the others. Nothing loaded can run: the
functions and arrays a program was made of are not in its JSON."""
from __future__ import annotations

import ast
import json
import os
import pathlib
import types

import numpy as np

from .errors import ArgumentError, Location, user_location
from .files import JSONError, read_json, user_path
from .ir.ops import CATALOG, TensorType
from .ir.sdg import SDG, Edge, Op, Ragged
from .saved_schema import first_error
from .stage import Stage
from .symbolic import (
    FALSE,
    TRUE,
    Bound,
    Const,
    Dim,
    Slice,
    and_,
    eq,
    floordiv,
    le,
    lt,
    max_,
    min_,
    mod,
    ne,
    not_,
    or_,
)


def save(stage, path) -> pathlib.Path:
    """Write ``stage.to_dict()`` as JSON to ``path``; ``tl.load(path)`` reads it back."""
    if not hasattr(stage, "to_dict"):
        raise ArgumentError(f"tl.save needs a stage object (a Program, SDG, ...), got "
                            f"{type(stage).__name__}", user_location())
    path = user_path(path, "tl.save")
    try:
        path.write_text(json.dumps(stage.to_dict()), encoding="utf-8")
    except OSError as err:
        raise ArgumentError(f"tl.save: cannot write {path} ({err})", user_location()) from None
    return path


def load(source):
    """The stage object saved in ``source`` (a path to ``tl.save``'s JSON, or the dict that
    ``to_dict()`` returned)."""
    loc = user_location()
    data = source
    if not isinstance(source, (dict, str, os.PathLike)):
        raise ArgumentError(f"tl.load({source!r}): give the path of a file tl.save wrote, or "
                            "the dict a stage's to_dict() returned", loc)
    where = "tl.load" if isinstance(source, dict) else f"tl.load({os.fspath(source)!r})"
    if not isinstance(source, dict):
        try:
            data = read_json(user_path(source, where), dict)
        except (OSError, JSONError) as err:
            raise ArgumentError(f"{where}: cannot read it as JSON ({err}); give a file "
                                "written by tl.save(stage, path)", loc) from None
    schema = str(data.get("schema", "")) if isinstance(data, dict) else ""
    kind, _, version = schema.partition("/")
    readers = {"tempo_lab.sdg": sdg_from_dict, "tempo_lab.passtrace": passes_from_dict,
               "tempo_lab.schedule": SavedSchedule, "tempo_lab.program": SavedProgram}
    if kind not in readers:
        raise ArgumentError(f"{where}: schema {kind or 'missing'!r} is not one it reads back "
                            f"(it reads {', '.join(sorted(readers))}); a memory plan loads as "
                            "part of its program", loc)
    if version not in VERSIONS:
        raise ArgumentError(f"{where}: field 'schema' is {schema!r}, a version this tempo_lab "
                            f"does not read (it reads {kind}/{', '.join(sorted(VERSIONS))}); "
                            "save it again with this version", loc)
    try:
        broken = first_error(kind, data) or check_refs(kind, data)
    except RecursionError:
        broken = "it is nested too deeply"
    if broken:
        raise ArgumentError(f"{where}: {broken}; give a file written by tl.save(stage, path), "
                            "unedited", loc)
    try:
        return readers[kind](data)
    except (KeyError, TypeError, ValueError, SyntaxError, AttributeError, RecursionError,
            OverflowError, IndexError) as err:
        why = "nested too deeply" if isinstance(err, RecursionError) else repr(err)
        raise ArgumentError(f"{where}: the {kind} data is not what to_dict() writes ({why}); "
                            "was it edited or written by another version?", loc) from None


def check_refs(kind: str, data: dict) -> str | None:
    """What a schema cannot say about ``data``: every op id an edge, output, sink, until, ragged
    bound or store names is an op of its graph, and ids are unique; kinds and dtypes are known;
    the memory timeline is one."""
    if kind == "tempo_lab.program":
        return _sdg_refs(data["sdg"], "sdg") or _memory_refs(data.get("memory"), data["sdg"]) \
            or (_passes_refs(data["passes"]) if data.get("passes") else None)
    if kind == "tempo_lab.passtrace":
        return _passes_refs(data)
    return _sdg_refs(data, "") if kind == "tempo_lab.sdg" else None


def _passes_refs(data: dict) -> str | None:
    return _sdg_refs(data["initial"], "passes.initial") or next(
        (why for k, p in enumerate(data["passes"])
         if (why := _sdg_refs(p["after"], f"passes.passes[{k}].after"))), None)


def _sdg_refs(sdg: dict, at: str) -> str | None:
    at = f"{at}." if at else ""
    ids = [o["id"] for o in sdg["ops"]]
    if len(set(ids)) != len(ids):
        return f"field {at}ops names an op id twice"
    for k, o in enumerate(sdg["ops"]):
        if o["kind"] not in CATALOG:
            return f"field {at}ops[{k}].kind is {o['kind'][:40]!r}: not an op kind it knows"
        if not _is_dtype(o["dtype"]):
            return f"field {at}ops[{k}].dtype is {o['dtype'][:40]!r}: not a NumPy dtype"
    ids = set(ids)
    named = [(f"edges[{k}].{end}", e[end]) for k, e in enumerate(sdg["edges"])
             for end in ("dst", "src")]
    named += [(f"outputs.{n}", i) for n, i in sdg["outputs"].items()]
    named += [(f"sinks[{k}]", i) for k, i in enumerate(sdg.get("sinks", ()))]
    named += [(f"untils.{n}", i) for n, i in sdg.get("untils", {}).items()]
    named += [(f"ragged.{n}.done", r["done"]) for n, r in sdg.get("ragged", {}).items()
              if r.get("done") is not None]
    return next((f"field {at}{field} is {i}: no op has that id" for field, i in named
                 if i not in ids), None)


def _memory_refs(memory: dict | None, sdg: dict) -> str | None:
    if memory is None:
        return None
    ids = {o["id"] for o in sdg["ops"]}
    for k, s in enumerate(memory["stores"]):
        if s["op"] not in ids:
            return f"field memory.stores[{k}].op is {s['op']}: no op has that id"
        if not _is_dtype(s["dtype"]):
            return f"field memory.stores[{k}].dtype is {s['dtype'][:40]!r}: not a NumPy dtype"
    steps, sizes = memory["timeline"]["steps"], memory["timeline"]["bytes"]
    if len(steps) != len(sizes) or steps != sorted(steps) or any(k > memory["steps"]
                                                                  for k in steps):
        return ("field memory.timeline: its steps and bytes are not a timeline (one byte count "
                "per step, steps in order, none past memory.steps)")
    if sizes and max(sizes) != memory["peak_bytes"]:
        return (f"field memory.peak_bytes is {memory['peak_bytes']}: the timeline's peak is "
                f"{max(sizes)}")
    return None


def _is_dtype(text: str) -> bool:
    """Whether ``text`` names a NumPy dtype (``float32``, ``bfloat16``; ``ml_dtypes`` is
    imported with the package)."""
    if not (text.isidentifier() and len(text) <= 16):
        return False
    try:
        np.dtype(text)
    except TypeError:
        return False
    return True


VERSIONS = ("1",)  # the schema versions tl.load reads (every stage's to_dict() writes /1)
MAX_TEXT = 4096  # characters of a saved index expression or condition


# -- index expressions and conditions from their text -------------------------------------------
def expr_from_str(text: str):
    """An index expression from its ``str`` (``t - 1``, ``min(T - 1, t)``, ``2*(t // 4)``):
    lower-case names are dims, upper-case ones bounds."""
    _short(text)
    return _expr(ast.parse(text.strip(), mode="eval").body)


def _short(text) -> None:
    if not isinstance(text, str) or len(text) > MAX_TEXT:
        raise ValueError(f"an index expression or condition of {len(str(text))} characters "
                         f"(at most {MAX_TEXT} are read)")


def _expr(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return Const(node.value)
    if isinstance(node, ast.Name):
        return Bound(node.id) if node.id.isupper() else Dim(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_expr(node.operand)
    if isinstance(node, ast.BinOp):
        a, b = _expr(node.left), _expr(node.right)
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and not (
                isinstance(b, Const) and b.value > 0):
            raise ValueError(f"{ast.unparse(node)}: // and % take a positive constant")
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
               ast.FloorDiv: lambda: floordiv(a, b.value), ast.Mod: lambda: mod(a, b.value)}
        if type(node.op) not in ops:
            raise ValueError(f"not an index expression: {ast.unparse(node)}")
        return ops[type(node.op)]()
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id in ("min", "max"):
        return (min_ if node.func.id == "min" else max_)(*map(_expr, node.args))
    raise ValueError(f"not an index expression: {ast.unparse(node)}")


def index_from_str(text: str):
    """One entry of a read's index: an expression, or a range ``start:stop``."""
    cut = _top_level(text, ":")
    if not cut:
        return expr_from_str(text)
    return Slice(expr_from_str(text[:cut[0]]), expr_from_str(text[cut[0] + 1:]))


def cond_from_str(text: str):
    """A condition from its ``str``: comparisons joined by ``&`` and ``|``, ``~(...)``,
    ``true``/``false``."""
    _short(text)
    text = text.strip()
    while text.startswith("(") and _closing(text, 0) == len(text) - 1:
        text = text[1:-1].strip()
    for sep, join in (("|", or_), ("&", and_)):
        cuts = _top_level(text, sep)
        if cuts:
            parts, start = [], 0
            for c in cuts + [len(text)]:
                parts.append(cond_from_str(text[start:c]))
                start = c + 1
            return join(*parts)
    if text in ("true", "false"):
        return TRUE if text == "true" else FALSE
    if text.startswith("~"):
        return not_(cond_from_str(text[1:]))
    for sym, make in (("==", eq), ("!=", ne), (">=", lambda a, b: le(b, a)), ("<=", le),
                      ("<", lt), (">", lambda a, b: lt(b, a))):
        cut = _top_level(text, sym)
        if cut:
            return make(expr_from_str(text[:cut[0]]), expr_from_str(text[cut[0] + len(sym):]))
    raise ValueError(f"not a condition: {text}")


def _top_level(text: str, sym: str) -> list[int]:
    """Positions of ``sym`` outside parentheses, comparison operators read whole (the ``<`` of
    ``<=`` is not a ``<``)."""
    out, depth, k = [], 0, 0
    while k < len(text):
        depth += (text[k] == "(") - (text[k] == ")")
        two = text[k:k + 2]
        op = two if two in ("==", "!=", ">=", "<=") else text[k]
        if depth == 0 and op == sym:
            out.append(k)
        k += len(op) if op in ("==", "!=", ">=", "<=") else 1
    return out


def _closing(text: str, k: int) -> int:
    depth = 0
    for j in range(k, len(text)):
        depth += (text[j] == "(") - (text[j] == ")")
        if depth == 0:
            return j
    return -1


# -- stages -------------------------------------------------------------------------------------
def _attr(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _dim(text: str):
    return int(text) if text.lstrip("-").isdigit() else expr_from_str(text)


def sdg_from_dict(data: dict) -> SDG:
    """The SDG that ``SDG.to_dict()`` described (op attributes that were not plain values stay
    as their text)."""
    ops = []
    for o in data["ops"]:
        if o["kind"] not in CATALOG:
            raise ValueError(f"unknown op kind {o['kind']!r}")
        stack = tuple((f["file"], f["line"], f["function"]) for f in o.get("stack", ()))
        loc = Location(o["file"], o["line"], stack, o.get("call", ""))
        ops.append(Op(o["id"], o["kind"], tuple(Dim(d) for d in o["domain"]),
                      TensorType(tuple(_dim(s) for s in o["shape"]), np.dtype(o["dtype"])),
                      {k: _attr(v) for k, v in o["attrs"].items()}, loc, o["name"],
                      tuple(o.get("scope", ()))))
    edges = [Edge(e["dst"], e["src"], e["slot"], tuple(index_from_str(x) for x in e["index"]),
                  cond_from_str(e["cond"]), Location(e["file"], e["line"]))
             for e in data["edges"]]
    return SDG(tuple(Dim(d) for d in data["dims"]), ops, edges, data["outputs"],
               data.get("sinks", ()), data.get("untils", {}),
               {k: tuple(v) for k, v in data.get("made_dims", {}).items()},
               {k: Ragged(v["over"], None if v["lengths"] is None else
                          np.asarray(v["lengths"], np.int64), v.get("done"), v.get("max", 0))
                for k, v in data.get("ragged", {}).items()})


def passes_from_dict(data: dict):
    """The PassTrace: each pass's graph after it, the one before it, and its recorded edits."""
    from .passes.manager import Event, PassRecord, PassTrace

    initial = before = sdg_from_dict(data["initial"])
    records = []
    for p in data["passes"]:
        after = sdg_from_dict(p["after"])
        events = [Event(e["kind"], -1 if e["kind"] == "dim" else e["op"], e["source"],
                        e["note"]) for e in p["events"]]  # a dim event's op: -1 (Event)
        came_from = {int(k): v for k, v in p.get("came_from", {}).items()}
        records.append(PassRecord(p["name"], before, after, events, p["seconds"],
                                  came_from=came_from))
        before = after
    return PassTrace(initial, records)


def _count(value, field: str) -> int:
    """A saved count of steps or bytes: an int in [0, 2**63)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise ValueError(f"field {field!r} is {str(value)[:40]}, not a count of steps or bytes")
    return value


def memory_from_dict(data: dict, sdg: SDG):
    """The MemoryPlan over ``sdg`` (its stores, lifetimes and predicted timeline)."""
    from .memory.plan import MemoryPlan, Storage

    storages, lifetimes = {}, {}
    for s in data["stores"]:
        storages[s["op"]] = Storage(s["op"], tuple(s["dims"]), tuple(s["slots"]),
                                    tuple(s["spatial"]), np.dtype(s["dtype"]),
                                    tuple(s["blocks"]))
        lifetimes[s["op"]] = tuple(s["lifetime"])
    plan = MemoryPlan(sdg, storages, [_count(b, "timeline.bytes") for b in
                                      data["timeline"]["bytes"]], lifetimes, (),
                      [_count(k, "timeline.steps") for k in data["timeline"]["steps"]],
                      _count(data["steps"], "steps"), _count(data["peak_bytes"], "peak_bytes"),
                      _count(data.get("offloaded_bytes", 0), "offloaded_bytes"),
                      data.get("budget"))
    return plan


class SavedSchedule(Stage):
    """A saved schedule: its loop code, scheduler, statements and isl schedule tree (parsed
    back with isl when it can be). The loop AST itself is not saved: no iteration space."""

    def __init__(self, data: dict, sdg: SDG | None = None):
        import islpy as isl

        self.data, self.sdg, self.method = data, sdg, data.get("method", "")
        self.statements = sorted(int(i) for i in data.get("domains", {}))
        try:
            self.tree = isl.Schedule(data.get("tree", ""))
        except isl.Error:
            self.tree = data.get("tree", "")

    def code(self) -> str:
        return "\n".join(self.data.get("code", ()))

    def __repr__(self) -> str:
        return self.data.get("repr", f"Schedule(statements={len(self.statements)})")

    def _sections(self):
        return [("loops", list(self.data.get("code", ()))), ("scheduler", [self.method]),
                ("statements (demanded points)", [f"op{i}: {d}" for i, d in
                                                  self.data.get("domains", {}).items()]),
                ("validity = proximity (producer -> consumer)", self.data.get("validity", []))]

    def to_dict(self) -> dict:
        return dict(self.data)


class SavedProgram(Stage):
    """A program read back from ``tl.save``: its SDG, passes, schedule and memory plan, for
    reading and exploring. It cannot run (``run`` says so)."""

    def __init__(self, data: dict):
        self.data = data
        self.bounds = {str(k): _count(v, f"bounds.{k}") for k, v in data["bounds"].items()}
        self.executor = data.get("executor", "")
        self.sdg = sdg_from_dict(data["sdg"])
        self.passes = passes_from_dict(data["passes"]) if data.get("passes") else None
        self.schedule = SavedSchedule(data["schedule"], self.sdg) \
            if data.get("schedule") else None
        self.memory = memory_from_dict(data["memory"], self.sdg) if data.get("memory") else None
        self.compile_times = dict(data.get("compile_times", {}))
        self.lowered = self.executable = None
        self.config = types.SimpleNamespace(executor=self.executor)

    def run(self, *args, **kwargs):
        raise ArgumentError("a program loaded with tl.load has its graph, schedule and plan but "
                            "not the arrays and functions it was made of: compile it from its "
                            "code to run it", user_location())

    def __repr__(self) -> str:
        return self.data.get("repr", "Program(saved)").split("\n")[0]

    def _sections(self):
        outs = []
        for name, i in self.sdg.outputs.items():
            op = self.sdg.ops[i]
            outs.append(f"{name}: {op.type} over ({', '.join(map(str, op.domain))})")
        stages = [repr(x) for x in (self.passes, self.sdg, self.schedule, self.memory)
                  if x is not None]
        return [("bounds", [f"{k} = {v}" for k, v in self.bounds.items()]), ("outputs", outs),
                ("stages", stages), ("saved", ["loaded with tl.load: it cannot run"])]

    def to_dict(self) -> dict:
        return dict(self.data)
