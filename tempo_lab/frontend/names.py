"""Names from the source: the variable a user's statement assigns a traced value to.

``q = x @ wq`` names the matmul ``q``; ``att = tl.nn.attention(q, k, v, t)`` names the op that
holds attention's result ``att``; ``a, b = f(x)`` names both; ``h += y`` and ``y: RT = ...``
name their values too. How: every op made while tracing is observed with the user's frames
that made it (innermost first, up to the frame that runs the user's code). A statement of one
of those frames is finished when the next op comes from another statement, or from the same
statement called again (a loop); the finished statement is parsed (``ast``, cached per file
and per instruction, notebook cells included: IPython keeps their source in ``linecache``)
and, when it assigns, the values its targets now hold (read from the frame's variables) take
their names, provided they were made during that statement (a value made earlier keeps its
own). A name the user gave (``name=``) or that the op already has is never replaced.

The names are views' names only: they go into ``Op.name`` through ``context.named_results``
when the program is built, never into a tensor's ``.name`` (which names a compiled output).
"""
from __future__ import annotations

import ast
import linecache
import sys
from dataclasses import dataclass

from ..errors import _file_kind, _is_user

MAX_FRAMES = 64     # user frames followed out from the op (deeper recursion: the innermost)


class _Level:
    """One user frame's statement being executed while ops are made: ``lasti`` the call
    instruction running, ``callee`` the frame it called (held, so that its identity stays
    unique while it is compared), ``first`` the id of the first op made in it, ``stmt`` the
    statement (``statement``; None where the source cannot be read)."""

    __slots__ = ("frame", "lasti", "callee", "first", "stmt")

    def __init__(self, frame, lasti: int, callee, first: int, stmt):
        self.frame, self.lasti, self.callee, self.first = frame, lasti, callee, first
        self.stmt = stmt


class SourceNames:
    """Watches the ops a context makes and names them after the user's variables
    (``observe`` per op, ``flush`` once the program is written)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self._levels: list[_Level] = []   # outermost first

    def observe(self, node) -> None:
        """Record ``node``, just made; statements the user's frames have left are resolved.
        Runs for every op traced, so it is written for speed: one walk up the stack with a
        dict lookup per frame, and nothing more while the same call is still making ops."""
        kinds = _KINDS
        levels = self._levels
        innermost = levels[-1].frame if levels else None
        frame, callee = sys._getframe(2), None
        chain = []
        while frame is not None:   # the frames outside the package, innermost first
            if frame is innermost:  # the user's frames around it are those of the last op
                if not chain:
                    p, lasti = levels[-1], frame.f_lasti
                    if callee is p.callee and lasti == p.lasti:
                        return      # the same call is still making ops (the common case)
                    stmt = statement(frame.f_code, lasti)
                    if lasti > p.lasti and stmt is p.stmt and stmt is not None:
                        p.lasti, p.callee = lasti, callee   # a later call, same statement
                        return
                    self._resolve(p, node.id - 1)            # another statement
                    levels[-1] = _Level(frame, lasti, callee, node.id, stmt)
                    return
                chain.append((frame, frame.f_lasti, callee))
                chain.reverse()
                self._step(levels, len(levels) - 1, chain, node.id)
                return
            name = frame.f_code.co_filename
            kind = kinds.get(name)
            if kind is _PACKAGE:    # most frames: tempo_lab's own, passed over
                callee, frame = frame, frame.f_back
                continue
            if kind is None:
                kind = _kind(frame, name)
            if kind == "user":
                chain.append((frame, frame.f_lasti, callee))
                if len(chain) >= MAX_FRAMES:
                    break
            elif kind == "library" and chain:
                break             # what ran the user's code (IPython, pytest, a worker)
            callee, frame = frame, frame.f_back
        chain.reverse()
        self._step(levels, 0, chain, node.id)

    def _step(self, levels: list[_Level], start: int, chain: list, op: int) -> None:
        """Compare the user's frames of op ``op`` (``chain``, outermost first, standing for
        ``levels[start:]``) with those of the last op: statements left are resolved, the
        ones entered become levels."""
        keep = min(len(levels) - start, len(chain))
        for k in range(keep):
            p = levels[start + k]
            frame, lasti, callee = chain[k]
            if p.frame is not frame:
                keep = k
                break
            if lasti == p.lasti and callee is p.callee:
                continue                      # the same call is still making ops
            if lasti > p.lasti and p.stmt is not None and \
                    statement(frame.f_code, lasti) is p.stmt:
                p.lasti, p.callee = lasti, callee   # the statement goes on: a later call
                keep = k + 1
                break
            keep = k                          # another statement, or this one again
            break
        cut = start + keep
        if cut < len(levels):
            for p in reversed(levels[cut:]):
                self._resolve(p, op - 1)
            del levels[cut:]
        for frame, lasti, callee in chain[keep:]:
            levels.append(_Level(frame, lasti, callee, op, statement(frame.f_code, lasti)))

    def flush(self) -> None:
        """Resolve every statement still open (the program is written: compile)."""
        for p in reversed(self._levels):
            self._resolve(p, len(self.ctx._nodes) - 1)
        self._levels = []

    def _resolve(self, level: _Level, last: int) -> None:
        """Name the values ``level``'s statement assigned, if made by it (ids from its
        ``first`` op to ``last``)."""
        stmt = level.stmt
        if stmt is None or not stmt.targets:
            return
        frame = level.frame
        try:
            local = frame.f_locals
        except Exception:  # noqa: BLE001 - a frame that cannot show its variables: no names
            return
        for target in stmt.targets:
            value = _value(target, local, frame.f_globals)
            node = getattr(value, "node", None)
            if node is None or getattr(value, "index", 0) is not None \
                    or getattr(value, "ctx", None) is not self.ctx:
                continue       # not a recurrent tensor of this context, or a view
            if level.first <= node.id <= last and node.name is None and node.var is None:
                node.var = target[-1]


_KINDS: dict[str, str] = {}   # file name -> errors._file_kind, except generated methods
_PACKAGE = "package"


def _kind(frame, name: str) -> str:
    kind = _file_kind(name)
    if kind == "user" and name[:1] == "<":
        return "user" if _is_user(frame) else _PACKAGE   # a dataclass's __init__
    kind = _KINDS[name] = _PACKAGE if kind == _PACKAGE else kind
    return kind


def _value(target: tuple[str, ...], local, globals_):
    """What ``target`` (a variable, or ``obj.attr``) holds now; never runs user code (no
    property, no ``__getattr__``)."""
    head = target[0]
    value = local[head] if head in local else globals_.get(head)
    for attr in target[1:]:
        try:
            value = vars(value).get(attr)
        except TypeError:
            return None
    return value


# -- statements -------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Statement:
    """A statement of the user's source; ``targets``: what it assigns, as name paths
    (``("q",)``, ``("self", "q")``), in order."""

    line: int
    targets: tuple[tuple[str, ...], ...]


_FILES: dict[str, tuple[int, dict[int, list[tuple[ast.stmt, Statement]]]] | None] = {}
_CODES: dict[int, tuple[object, dict[int, Statement | None]]] = {}


def statement(code, lasti: int) -> Statement | None:
    """The innermost statement that the instruction at ``lasti`` of ``code`` belongs to
    (cached per code object and instruction), or None where the source cannot be read."""
    entry = _CODES.get(id(code))
    if entry is None or entry[0] is not code:
        entry = _CODES[id(code)] = (code, {})
    found = entry[1]
    if lasti not in found:
        found[lasti] = _find(code, lasti)
    return found[lasti]


def _find(code, lasti: int) -> Statement | None:
    try:
        positions = list(code.co_positions())
        line, end_line, col, end_col = positions[lasti // 2]
    except (IndexError, AttributeError, ValueError):
        return None
    if line is None:
        return None
    index = _index(code.co_filename)
    if index is None:
        return None
    best = None
    for node, stmt in index.get(line, ()):
        if col is not None and not _contains(node, line, col, end_line or line, end_col or col):
            continue
        if best is None or (node.lineno, node.col_offset) >= (best[0].lineno,
                                                             best[0].col_offset):
            best = (node, stmt)
    return None if best is None else best[1]


def _contains(node: ast.stmt, line: int, col: int, end_line: int, end_col: int) -> bool:
    start = (node.lineno, node.col_offset) <= (line, col)
    end = (end_line, end_col) <= (node.end_lineno or node.lineno, node.end_col_offset or 0)
    return start and end


def _index(filename: str):
    """Line -> the statements that span it, for ``filename``'s source (None: unreadable)."""
    lines = linecache.getlines(filename)
    cached = _FILES.get(filename)
    if cached is not None and cached[0] == len(lines):
        return cached[1]
    try:
        tree = ast.parse("".join(lines), filename)
    except (SyntaxError, ValueError):
        _FILES[filename] = (len(lines), None)
        return None
    index: dict[int, list[tuple[ast.stmt, Statement]]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt):
            stmt = Statement(node.lineno, _targets(node))
            for k in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                index.setdefault(k, []).append((node, stmt))
    _FILES[filename] = (len(lines), index)
    return index


def _targets(node: ast.stmt) -> tuple[tuple[str, ...], ...]:
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
        targets = [node.target]
    else:
        return ()
    out: list[tuple[str, ...]] = []
    for t in targets:
        out.extend(_paths(t))
    return tuple(out)


def _paths(t: ast.expr) -> list[tuple[str, ...]]:
    if isinstance(t, ast.Name):
        return [(t.id,)]
    if isinstance(t, (ast.Tuple, ast.List)):
        return [p for e in t.elts for p in _paths(e)]
    if isinstance(t, ast.Attribute):
        inner = _paths(t.value)
        return [inner[0] + (t.attr,)] if len(inner) == 1 and isinstance(
            t.value, (ast.Name, ast.Attribute)) else []
    return []     # a subscript (a placeholder's branch, a dict entry) or a starred name
