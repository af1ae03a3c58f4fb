"""The tracing context: dims, bounds, and the growing graph of traced ops.

Traced ops are mutable ``Node``s only while the program is being written (a placeholder gains
branches after it is read). ``compile`` freezes what the outputs reach into an immutable SDG.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import (
    ArgumentError,
    DefinitionError,
    ExprError,
    Location,
    TempoLabError,
    library_target,
    user_api,
    user_location,
)
from ..ir.ops import TensorType
from ..symbolic import TRUE, Cond, Dim, Expr, Slice
from .names import SourceNames
from .trace import Trace, TraceEntry

# Words of isl's textual set notation: a dim (or bound) of that name cannot be read back.
RESERVED = frozenset({"and", "or", "not", "exists", "implies", "mod", "min", "max", "floor",
                      "ceil", "floord", "ceild", "infty", "nan", "true", "false", "rat"})

_CURRENT: contextvars.ContextVar[tuple[Context, ...]] = contextvars.ContextVar(
    "tempo_lab_ctx", default=())


@dataclass(eq=False)
class Input:
    """A read of ``node`` at ``index`` (one entry per producer dim, in the reader's dims)."""

    node: Node
    index: tuple[Expr | Slice, ...]
    cond: Cond = TRUE
    loc: Location | None = None
    default: bool = False  # the default branch of a placeholder: cond is filled in at build


@dataclass(eq=False)
class Node:
    id: int
    kind: str
    attrs: dict
    domain: tuple[Dim, ...]
    type: TensorType
    loc: Location
    inputs: list[Input] = field(default_factory=list)
    name: str | None = None
    scope: tuple[str, ...] = ()
    target: tuple[str, int] | None = None  # (variable, call number): see Context.add_node
    var: str | None = None  # the user's variable that holds it (names.SourceNames)


_SCOPE: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("tempo_lab_scope",
                                                                        default=())


def user_name(name, api: str, loc=None) -> str | None:
    """The ``name=`` a user gave, or None: a string of text. Another object (a number, bytes,
    a list) was kept as it was and broke the views that show names later (a list was even
    changed in place), far from the line that gave it; so did a lone surrogate (plotly, the
    exported page)."""
    if name is not None and not isinstance(name, str):
        raise ArgumentError(f"{api}: name must be a string, got {type(name).__name__} "
                            f"{name!r}; give a str such as name='x'", loc)
    if name is not None and not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: no page, file or figure can hold it
            raise ArgumentError(f"{api}: name {name!r} is not text (it holds a lone "
                                "surrogate); give a str that UTF-8 can encode", loc) from None
    return name


def scope(name: str):
    """``with tl.scope("layer3"):`` tags the ops made inside with the scope path (nested scopes
    form a path, ``("block", "layer3")``): views group by it, ``to_dict()`` exports it."""
    if not isinstance(name, str) or not name:
        raise ArgumentError(f"tl.scope needs a non-empty name string, got {name!r}")
    return _entered(user_name(name, "tl.scope"))


@contextlib.contextmanager
def _entered(name: str):
    token = _SCOPE.set(_SCOPE.get() + (name,))
    try:
        yield
    finally:
        _SCOPE.reset(token)


class Context:
    """Declares the dims (outermost first) and records the program written inside ``with ctx:``."""

    def __init__(self, dims: Sequence[str]):
        if isinstance(dims, str) or not isinstance(dims, Sequence):
            raise ArgumentError(f"dims={dims!r}: give the dim names as a tuple, outermost "
                                "first, e.g. tl.Context(dims=('b', 't'))")
        names = list(dims)
        if not names:
            raise ArgumentError("a context needs at least one dim, e.g. tl.Context(dims=('t',))")
        for n in names:
            if not isinstance(n, str) or not n.isascii() or not n.isidentifier() \
                    or n != n.lower() or n == n.upper():
                raise ExprError(f"dim name {n!r} must be a lower-case ASCII identifier (its "
                                "bound is the upper-case name, e.g. t -> T)")
            if n in RESERVED:
                raise ExprError(f"dim name {n!r} is a word of isl's set notation, which the "
                                f"scheduler uses; choose another name (reserved: "
                                f"{', '.join(sorted(RESERVED))})")
        if len(set(names)) != len(names):
            raise ExprError(f"dim names repeat in {names}")
        self.dims: tuple[Dim, ...] = tuple(Dim(n) for n in names)
        self.bounds = tuple(d.bound for d in self.dims)
        self._nodes: list[Node] = []
        self._sinks: list[Node] = []
        self._calls: list[TraceEntry] = []
        self._entry, self._call_no = None, 0  # the library call being traced (add_node)
        self._source = SourceNames(self)       # the user's variables that hold the ops

    @user_api
    def compile(self, bounds, outputs, config=None):
        """Compile the program written in this context: ``bounds`` gives every bound used
        (an int, or ``tl.until(done, max=N)``), ``outputs`` the tensors to return (a dict of
        names, or a list); ``config`` a ``tl.CompileConfig``. Returns a ``tl.Program``."""
        from ..program import compile_context

        self._source.flush()
        return compile_context(self, bounds, outputs, config)

    @property
    def trace(self) -> Trace:
        """What has been recorded so far (a snapshot)."""
        return Trace(self.dims, self._calls)

    def record(self, api: str, text: str, node: Node | None, loc: Location):
        self._calls.append(TraceEntry(len(self._calls), api, text,
                                      None if node is None else node.id, loc))

    # -- scoping ------------------------------------------------------------------------------
    def __enter__(self) -> Context:
        _CURRENT.set(_CURRENT.get() + (self,))
        return self

    def __exit__(self, *exc):
        _CURRENT.set(_CURRENT.get()[:-1])

    def __repr__(self) -> str:
        return (f"Context(dims=({', '.join(d.name for d in self.dims)}), "
                f"ops={len(self._nodes)})")

    # -- graph building -----------------------------------------------------------------------
    def order(self, dims) -> tuple[Dim, ...]:
        """``dims`` as a domain: deduplicated, in universe order."""
        dims = set(dims)
        unknown = dims - set(self.dims)
        if unknown:
            raise ExprError(f"{', '.join(sorted(map(str, unknown)))} not a dim of this context "
                            f"(dims: {', '.join(d.name for d in self.dims)})")
        return tuple(d for d in self.dims if d in dims)

    def check_domain(self, domain) -> tuple[Dim, ...]:
        if isinstance(domain, Dim):
            domain = (domain,)
        if not isinstance(domain, Sequence) or any(not isinstance(d, Dim) for d in domain):
            raise ExprError(f"a domain is a tuple of dims such as (b, t), got {domain!r}")
        domain = tuple(domain)
        ordered = self.order(domain)
        if ordered != domain:
            raise DefinitionError(f"domain ({', '.join(map(str, domain))}) must list its dims in "
                                  f"the context's order: ({', '.join(map(str, ordered))})")
        return ordered

    def check_expr(self, e: Expr | Slice | Cond, what: str):
        allowed = set(self.dims) | set(self.bounds)
        extra = e.symbols() - allowed
        if extra:
            raise ExprError(f"{what} uses {', '.join(sorted(map(str, extra)))}, which are not "
                            "dims or bounds of this context")

    @property
    def active(self) -> bool:
        """Whether the program is being written: inside ``with ctx:``."""
        return self in _CURRENT.get()

    def check_open(self, what: str, loc: Location | None = None):
        """New ops and branches belong inside ``with ctx:``; after it closes the program is
        what was compiled, and a later addition would silently be left out or change it."""
        if not self.active:
            raise DefinitionError(f"{what} is written outside 'with ctx:'; the context's "
                                  "program is only written inside its with block (open it "
                                  "again with 'with ctx:' to add to the program)", loc)

    def add_node(self, kind: str, inputs: list[Input], attrs: dict, domain, type_: TensorType,
                 name: str | None = None, loc: Location | None = None) -> Node:
        loc = loc or user_location()
        self.check_open(f"this op ({kind})", loc)
        node = Node(len(self._nodes), kind, attrs, self.order(domain), type_, loc, inputs,
                    name, _SCOPE.get(), None if name else self._library_target())
        self._nodes.append(node)
        self._source.observe(node)
        return node

    def _library_target(self) -> tuple[str, int] | None:
        """The user's variable a library call's result goes to, and which call this is: the
        last op of each call takes the name when the program is built (``named_results``)."""
        site = library_target()
        if site is None:
            return None
        var, entry = site
        if entry is not self._entry:   # holding the frame keeps its id from being reused
            self._entry, self._call_no = entry, self._call_no + 1
        return var, self._call_no



def named_results(nodes) -> dict[int, str]:
    """Node id -> the variable that holds it: the user's variable found by
    ``names.SourceNames`` (``q = x @ wq``, ``att = tl.nn.attention(...)``), else, for the last
    of ``nodes`` made by a library call whose result the user's line assigns, that
    variable."""
    last: dict[int, Node] = {}
    for n in nodes:
        if n.target is not None:
            last[n.target[1]] = n
    out = {n.id: n.target[0] for n in last.values()}
    out.update((n.id, n.var) for n in nodes if n.var is not None)
    return out


def current_context(*candidates) -> Context:
    """The context of the given tensors, else the innermost ``with ctx:``."""
    from .tensor import RecurrentTensor

    ctxs = {id(c.ctx): c.ctx for c in candidates if isinstance(c, RecurrentTensor)}
    if len(ctxs) > 1:
        raise TempoLabError("these tensors come from different tl.Context objects; build a "
                            "program inside one context")
    if ctxs:
        return next(iter(ctxs.values()))
    stack = _CURRENT.get()
    if not stack:
        raise TempoLabError("no active context: write the program inside 'with ctx:' "
                            "(ctx = tl.Context(dims=(...)))")
    return stack[-1]
