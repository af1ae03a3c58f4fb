"""Random small recurrent-tensor programs for differential testing
(docs/testing.md, "What the suite rests on").

A program is plain data (:class:`RProgram`: dims, bounds, a list of statements, the outputs,
and optionally a ``tl.until`` bound, a loss to differentiate and sinks) that can be

* built with the tempo_lab API: :func:`build` -> ``(ctx, outputs, bounds)``;
* evaluated independently: :func:`numpy_eval` -> ``{name: array}`` (every tensor computed
  point by point with plain NumPy loops, ``t`` in increasing order; no tempo_lab code), and
  :func:`jax_grads` -> the gradients of the loss by ``jax.grad`` of the same point-by-point
  evaluation written with ``jax.numpy``;
* printed as readable RT code: :func:`to_source` (Python source with ``tl.`` calls that, when
  executed, leaves the compiled program in ``prog``, its run in ``out`` and the sink calls in
  ``calls``).

:func:`program_strategy` is the hypothesis strategy. Every program it draws is valid by
construction: reads stay inside their domains, placeholders are fully and disjointly covered, a
``tl.until`` condition reads only earlier points, a loss reads only what ``tl.grad`` can turn
around, and value magnitudes stay small (expressions whose bound could exceed 4 are scaled by a
power of two), so float32 results agree to ``rtol=1e-4, atol=1e-5``. With ``dtypes`` it also
draws programs of float16 or bfloat16 (inputs and recurrences of that dtype), some of whose
inputs hold the dtype's edge values (:func:`edge_values`); those are checked against the
reference interpreter, which computes each op as NumPy does (:func:`assert_16bit_match`).

Usage from another test (tests/ is not a package)::

    sys.path.insert(0, str(Path(__file__).parent))
    from randprog import build, numpy_eval, program_strategy, run_tempo, to_source
"""
from __future__ import annotations

import itertools
import math
from contextlib import ExitStack
from dataclasses import dataclass, field, replace

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

__all__ = [
    "RProgram", "Input", "Let", "Rec", "Read", "Const", "Unary", "Scale", "Binary", "SpatialRed",
    "DimWhere", "DimVal", "IntOp", "MatVec", "Until", "Loss", "Ix", "build", "compile_program",
    "run_tempo", "numpy_eval", "jax_grads", "expected", "to_source", "program_strategy",
    "features", "ALL_FEATURES", "input_array", "assert_outputs_match", "expr_source",
    "mk_read", "mk_unary", "mk_scale", "mk_binary", "mk_sred", "mk_matvec", "limit", "prune", "reads_of",
    "RTOL", "ATOL", "edge_values", "assert_16bit_match", "matmul_program_strategy",
]

RTOL, ATOL = 1e-4, 1e-5
F32 = np.float32
MAG_LIMIT = 4.0  # an expression whose magnitude bound exceeds this is scaled down
SINK = "sink:"   # run_tempo / expected: the calls of the sink on a statement, by point


# =================================================================================================
# The data structure
# =================================================================================================
@dataclass(frozen=True)
class Ix:
    """One temporal index entry of a read, for one dim of the source's domain.

    kind (with ``k``):
      ``cur``         the current point (``t``)
      ``shift``       ``t - k``           only in a recurrence's default branch, where valid
      ``clamp_back``  ``tl.max(0, t - k)``
      ``clamp_fwd``   ``tl.min(t + k, D - 1)``
      ``first``       ``0``               removes the dim
      ``last``        ``D - 1``           removes the dim
      ``causal``      ``0:t + 1``         slice
      ``window``      ``tl.max(0, t - k + 1):t + 1``  slice (window of k)
      ``suffix``      ``t:D``             slice
      ``all``         ``0:D``             slice, removes the dim
      ``prefix``      ``0:t``             slice; only for a recurrence's own earlier points
      ``prev_win``    ``tl.max(0, t - k):t``  slice; ditto
    """

    kind: str
    k: int = 0

    SLICES = ("causal", "window", "suffix", "all", "prefix", "prev_win")
    REMOVES = ("first", "last", "all")
    # along t: reads that need the bound T (a tl.until condition may not depend on them)
    NEEDS_BOUND = ("clamp_fwd", "last", "suffix", "all")
    # reads tl.grad cannot turn around (a point index must be a dim plus a constant)
    NO_GRADIENT = ("clamp_back", "clamp_fwd")

    @property
    def is_slice(self) -> bool:
        return self.kind in self.SLICES

    @property
    def keeps_dim(self) -> bool:
        return self.kind not in self.REMOVES


# -- expressions ----------------------------------------------------------------------------------
# Every expression node carries its domain (dim names in universe order), spatial shape and a
# bound on the magnitude of its values, filled in by the generator (or by ``mk_*`` helpers).
@dataclass(frozen=True)
class Read:
    """``src[entries]``, followed by ``.{red}(axis=...)`` over the new axes if any is a slice;
    ``moved``: those axes are first moved behind the value axes by a ``transpose`` (as
    attention reads its keys), then reduced there."""

    src: str
    entries: tuple[Ix, ...]
    red: str | None
    dom: tuple[str, ...]
    shape: tuple[int, ...]
    mag: float
    moved: bool = False


@dataclass(frozen=True)
class Const:
    value: float
    dom: tuple[str, ...] = ()
    shape: tuple[int, ...] = ()
    mag: float = 0.0


@dataclass(frozen=True)
class Unary:
    op: str  # tanh | neg | relu | sigmoid | abs
    x: object
    dom: tuple[str, ...]
    shape: tuple[int, ...]
    mag: float


@dataclass(frozen=True)
class Scale:
    c: float
    x: object
    dom: tuple[str, ...]
    shape: tuple[int, ...]
    mag: float


@dataclass(frozen=True)
class Binary:
    op: str  # add | sub | mul | maximum | minimum
    a: object
    b: object
    dom: tuple[str, ...]
    shape: tuple[int, ...]
    mag: float


@dataclass(frozen=True)
class SpatialRed:
    """``x.{op}(axis=-1, keepdims=...)`` over the (only) spatial axis."""

    op: str  # sum | mean | max
    keepdims: bool
    x: object
    dom: tuple[str, ...]
    shape: tuple[int, ...]
    mag: float


@dataclass(frozen=True)
class DimWhere:
    """``tl.where(d < k, a, b)``: a condition on a dim used as a value."""

    dim: str
    k: int
    a: object
    b: object
    dom: tuple[str, ...]
    shape: tuple[int, ...]
    mag: float


@dataclass(frozen=True)
class DimVal:
    """``(tl.zeros(()) + d) * c``: a dim's own value, as a float."""

    dim: str
    c: float
    dom: tuple[str, ...]
    shape: tuple[int, ...] = ()
    mag: float = 0.0


@dataclass(frozen=True)
class IntOp:
    """``((x * 4.0).astype('int32') {// | %} k).astype('float32')``: integer arithmetic (no
    gradient flows through it)."""

    op: str  # floordiv | mod
    k: int
    x: object
    dom: tuple[str, ...]
    shape: tuple[int, ...]
    mag: float


@dataclass(frozen=True)
class MatVec:
    """``x @ w``: a vector times a weight matrix ``w`` (a read of an input over ``()`` of shape
    ``(k, k)``, which only ``matmul_program_strategy`` draws)."""

    x: object
    w: object
    dom: tuple[str, ...]
    shape: tuple[int, ...]
    mag: float


# -- statements -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Input:
    """``name = tl.from_array(input_array(seed, shape), domain=dom)``."""

    name: str
    dom: tuple[str, ...]
    shape: tuple[int, ...]
    seed: int
    mag: float = 1.0


@dataclass(frozen=True)
class Let:
    """``name = expr``."""

    name: str
    expr: object

    @property
    def dom(self):
        return self.expr.dom

    @property
    def shape(self):
        return self.expr.shape

    @property
    def mag(self):
        return self.expr.mag


@dataclass(frozen=True)
class Rec:
    """A placeholder over ``dom`` (which contains ``t``) with two branches.

    init: ``("t0",)``: ``x[..., 0] = init``; ``("lt", c)``: ``x[t < c] = init`` (both with the
    default ``x[..., t] = step``); ``("key", c)``: ``x[t < c] = init`` and ``x[..., t + c] = step``
    (no default branch: ``step`` is computed at ``t`` and defines ``x[t + c]``).
    ``step`` is a complete expression; it may read ``name`` itself (only earlier points).
    """

    name: str
    dom: tuple[str, ...]
    shape: tuple[int, ...]
    init_kind: tuple
    init: object
    step: object
    mag: float
    init_first: bool = True

    @property
    def lag(self) -> int:
        """How far back the default branch may read (points ``t - lag`` and later exist)."""
        return 1 if self.init_kind[0] == "t0" else self.init_kind[1]


@dataclass(frozen=True)
class Until:
    """``bounds={T: tl.until(done, max=T)}`` with ``done = src[.max(axis=-1)] > thr``; ``src``
    is over ``(t,)`` and reads only earlier points along ``t``."""

    src: str
    thr: float


@dataclass(frozen=True)
class Loss:
    """``d_x, ... = tl.grad(src[.sum(axis=-1)], [x, ...])``: the gradients (outputs ``d_x``)
    of ``src`` summed over all its points and elements, with respect to inputs."""

    src: str
    wrt: tuple[str, ...]


@dataclass(frozen=True, repr=False)
class RProgram:
    dims: tuple[str, ...]          # ("t",), ("b", "t") or ("a", "b", "t")
    bounds: dict                   # {"T": 5}, {"B": 2, "T": 5}, ... (T is the max under until)
    stmts: tuple
    outputs: tuple[str, ...]       # statement names to compile as outputs
    until: Until | None = None
    loss: Loss | None = None
    sinks: tuple[str, ...] = field(default=())
    scopes: tuple[tuple[str, str], ...] = ()  # (statement, tl.scope name): names users write
    dtype: str = "float32"         # of the inputs and recurrences: float32, float16, bfloat16
    edges: bool = False            # inputs hold some of the dtype's edge values

    def stmt(self, name):
        return next(s for s in self.stmts if s.name == name)

    @property
    def grad_names(self) -> tuple[str, ...]:
        return tuple(f"d_{x}" for x in self.loss.wrt) if self.loss else ()

    @property
    def result_names(self) -> tuple[str, ...]:
        """Every value a run is checked on: outputs, gradients, sink calls."""
        return self.outputs + self.grad_names + tuple(SINK + s for s in self.sinks)

    def __str__(self) -> str:
        return to_source(self)

    def __repr__(self) -> str:
        return f"RProgram(dims={self.dims}, bounds={self.bounds}, {len(self.stmts)} statements)"

    def _repr_pretty_(self, p, cycle):  # how hypothesis shows a falsifying example: as RT code
        p.text("<RT program>")
        for line in to_source(self).splitlines():
            p.break_()
            p.text(line)


def bound_of(dim: str) -> str:
    return dim.upper()


def input_array(seed: int, shape: tuple[int, ...], dtype: str = "float32",
                edges: bool = False) -> np.ndarray:
    """The values of an ``Input``: uniform in [-1, 1], float32 (or ``dtype``); with ``edges``,
    about half of them are the dtype's edge values, or (one input in two) all of them are
    one of its largest values (a sum of them overflows, their mean does not)."""
    r = np.random.RandomState(seed)
    x = r.uniform(-1, 1, size=shape).astype(F32)
    if edges:
        special = np.array(edge_values(dtype), F32)
        x = np.where(r.uniform(size=shape) < 1 / 2,
                     special[r.randint(0, len(special), size=shape)], x).astype(F32)
        if r.randint(2) == 0:
            x = np.full(shape, special[r.randint(4)], F32)
    return x.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)


def edge_values(dtype: str) -> list[float]:
    """Values at the edges of a 16-bit float: the largest finite ones and ones just below
    (a sum or a product of two overflows), the smallest normal, 0 and -0, and float16's
    smallest subnormal. Not bfloat16's: it is a float32 subnormal, which XLA on the CPU reads
    as zero (the README's "Floating point")."""
    fi = ml_dtypes.finfo(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype))
    big, below = float(fi.max), float(fi.max) * (1 - float(fi.eps))
    tiny = [float(fi.smallest_subnormal)] if dtype == "float16" else []
    return [big, -big, below, -below, float(fi.smallest_normal), 0.0, -0.0, *tiny]


# =================================================================================================
# Node constructors (fill in domain / shape / magnitude)
# =================================================================================================
def _union_dom(dims, *doms):
    s = set().union(*doms)
    return tuple(d for d in dims if d in s)


def _bshape(*shapes):
    return tuple(np.broadcast_shapes(*shapes))


def mk_read(prog_dims, bounds, src, entries, red=None) -> Read:
    """A read of statement ``src`` (any object with name/dom/shape/mag)."""
    assert len(entries) == len(src.dom)
    keep = [d for d, e in zip(src.dom, entries) if e.keeps_dim]
    lengths = [bounds[bound_of(d)] for d, e in zip(src.dom, entries) if e.is_slice]
    nsl = len(lengths)
    if nsl and red is None:
        red = "sum"
    if not nsl:
        red = None
    mag = src.mag * (math.prod(lengths) if red == "sum" else 1)
    moved = red == "max" and len(src.shape) > 0  # a choice of its own would reseed every example
    return Read(src.name, tuple(entries), red, _union_dom(prog_dims, keep), tuple(src.shape),
                float(mag), moved)


def mk_unary(op, x) -> Unary:
    mag = {"tanh": 1.0, "sigmoid": 1.0}.get(op, x.mag)
    return Unary(op, x, x.dom, x.shape, mag)


def mk_scale(c, x) -> Scale:
    return Scale(float(c), x, x.dom, x.shape, abs(c) * x.mag)


def mk_binary(dims, op, a, b) -> Binary:
    mag = {"add": a.mag + b.mag, "sub": a.mag + b.mag, "mul": a.mag * b.mag}.get(
        op, max(a.mag, b.mag))
    return Binary(op, a, b, _union_dom(dims, a.dom, b.dom), _bshape(a.shape, b.shape), mag)


def mk_sred(op, keepdims, x) -> SpatialRed:
    assert len(x.shape) == 1
    mag = x.mag * x.shape[0] if op == "sum" else x.mag
    return SpatialRed(op, keepdims, x, x.dom, (1,) if keepdims else (), mag)


def mk_where(dims, dim, k, a, b) -> DimWhere:
    return DimWhere(dim, k, a, b, _union_dom(dims, a.dom, b.dom, (dim,)),
                    _bshape(a.shape, b.shape), max(a.mag, b.mag))


def mk_dimval(bounds, dim, c) -> DimVal:
    return DimVal(dim, float(c), (dim,), (), abs(c) * (bounds[bound_of(dim)] - 1))


def mk_intop(op, k, x) -> IntOp:
    mag = x.mag * 4 / k + 1 if op == "floordiv" else float(k)
    return IntOp(op, k, x, x.dom, x.shape, mag)


def mk_matvec(x, w) -> MatVec:
    assert len(x.shape) == 1 and w.shape == (x.shape[0],) * 2 and not w.dom
    return MatVec(x, w, x.dom, x.shape, x.mag * w.mag * x.shape[0])


def limit(x, lim=MAG_LIMIT):
    """``x`` scaled by a power of two so that its magnitude bound is at most ``lim / 2``...``lim``."""
    if x.mag <= lim:
        return x
    e = math.ceil(math.log2(x.mag / (lim / 2)))
    return mk_scale(2.0 ** -e, x)


# =================================================================================================
# (a) Build with the tempo_lab API
# =================================================================================================
def _tl_index(tl, dimobj, boundobj, ix: Ix):
    d, D, k = dimobj, boundobj, ix.k
    return {
        "cur": lambda: d,
        "shift": lambda: d - k,
        "clamp_back": lambda: tl.max(0, d - k),
        "clamp_fwd": lambda: tl.min(d + k, D - 1),
        "first": lambda: 0,
        "last": lambda: D - 1,
        "causal": lambda: slice(0, d + 1),
        "window": lambda: slice(tl.max(0, d - k + 1), d + 1),
        "suffix": lambda: slice(d, D),
        "all": lambda: slice(0, D),
        "prefix": lambda: slice(0, d),
        "prev_win": lambda: slice(tl.max(0, d - k), d),
    }[ix.kind]()


def _reduce_rt(x, red, axis, keepdims=False):
    return getattr(x, red)(axis=axis, keepdims=keepdims)


def build(program: RProgram, calls: dict | None = None):
    """Build ``program`` with tempo_lab. Returns ``(ctx, outputs, bounds)`` for
    ``ctx.compile(bounds=bounds, outputs=outputs)`` (outputs: name -> RecurrentTensor; the
    gradients are outputs ``d_x``). ``calls``: where the sinks append ``(point, value)``."""
    import tempo_lab as tl

    ctx = tl.Context(dims=program.dims)
    dim_of = {d.name: d for d in ctx.dims}
    bound_obj = {d.name: d.bound for d in ctx.dims}
    env: dict[str, object] = {}
    calls = {} if calls is None else calls
    scope_of = dict(program.scopes)

    def ev(e):
        if isinstance(e, Const):
            return e.value
        if isinstance(e, Read):
            src = program.stmt(e.src)
            key = tuple(_tl_index(tl, dim_of[d], bound_obj[d], ix)
                        for d, ix in zip(src.dom, e.entries))
            r = env[e.src][key] if key else env[e.src]
            nsl = sum(ix.is_slice for ix in e.entries)
            if nsl and e.moved:
                nd = nsl + len(src.shape)
                r = _reduce_rt(r.transpose(*range(nsl, nd), *range(nsl)), e.red,
                               tuple(range(nd - nsl, nd)))
            elif nsl:
                r = _reduce_rt(r, e.red, 0 if nsl == 1 else tuple(range(nsl)))
            return r
        if isinstance(e, Unary):
            x = ev(e.x)
            return -x if e.op == "neg" else getattr(tl, e.op)(x)
        if isinstance(e, Scale):
            return ev(e.x) * e.c
        if isinstance(e, Binary):
            a, b = ev(e.a), ev(e.b)
            return {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
                    "maximum": lambda: tl.maximum(a, b),
                    "minimum": lambda: tl.minimum(a, b)}[e.op]()
        if isinstance(e, SpatialRed):
            return _reduce_rt(ev(e.x), e.op, -1, e.keepdims)
        if isinstance(e, DimWhere):
            return tl.where(dim_of[e.dim] < e.k, ev(e.a), ev(e.b))
        if isinstance(e, DimVal):
            return (tl.zeros((), program.dtype) + dim_of[e.dim]) * e.c
        if isinstance(e, IntOp):
            n = (ev(e.x) * 4.0).astype("int32")
            return (n // e.k if e.op == "floordiv" else n % e.k).astype(program.dtype)
        if isinstance(e, MatVec):
            return ev(e.x) @ ev(e.w)
        raise TypeError(e)

    with ctx:
        for s in program.stmts:
            with ExitStack() as scoped:
                if s.name in scope_of:
                    scoped.enter_context(tl.scope(scope_of[s.name]))
                dom = tuple(dim_of[d] for d in s.dom)
                if isinstance(s, Input):
                    env[s.name] = tl.from_array(input_array(
                        s.seed, _dom_shape(program, s.dom) + s.shape, program.dtype,
                        program.edges), domain=dom)
                elif isinstance(s, Let):
                    env[s.name] = ev(s.expr)
                elif isinstance(s, Rec):
                    x = tl.placeholder(s.shape, program.dtype, domain=dom)
                    env[s.name] = x
                    t = dim_of["t"]
                    cur = tuple(dim_of[d] for d in s.dom)

                    def assign_init(s=s, x=x, t=t, cur=cur):
                        if s.init_kind[0] == "t0":
                            x[cur[:-1] + (0,)] = ev(s.init)
                        else:
                            x[t < s.init_kind[1]] = ev(s.init)

                    def assign_step(s=s, x=x, t=t, cur=cur):
                        if s.init_kind[0] == "key":
                            x[cur[:-1] + (t + s.init_kind[1],)] = ev(s.step)
                        else:
                            x[cur] = ev(s.step)

                    for f in ((assign_init, assign_step) if s.init_first
                              else (assign_step, assign_init)):
                        f()
                else:
                    raise TypeError(s)
        outputs = {name: env[name] for name in program.outputs}
        if program.loss is not None:
            grads = tl.grad(_spatial_sum(env[program.loss.src], program.stmt(program.loss.src)),
                            [env[x] for x in program.loss.wrt])
            outputs.update(zip(program.grad_names, grads))
        for name in program.sinks:
            calls[name] = []
            tl.sink(env[name], lambda p, v, name=name: calls[name].append((p, np.array(v))))
        done = _until_done(program, env)
    bounds = {bound_obj[d]: program.bounds[bound_of(d)] for d in program.dims}
    if done is not None:
        bounds[bound_obj["t"]] = tl.until(done, max=program.bounds["T"])
    return ctx, outputs, bounds


def _spatial_sum(x, stmt):
    return x.sum(axis=-1) if stmt.shape else x


def _until_done(program, env):
    if program.until is None:
        return None
    src = env[program.until.src]
    if program.stmt(program.until.src).shape:
        src = src.max(axis=-1)
    return src > program.until.thr


def compile_program(program: RProgram, calls: dict | None = None, **kw):
    """``build`` then ``ctx.compile`` (extra keyword arguments go to ``compile``)."""
    ctx, outputs, bounds = build(program, calls)
    return ctx.compile(bounds=bounds, outputs=outputs, **kw)


def run_tempo(program: RProgram, prog=None, calls: dict | None = None, **kw) -> dict:
    """What tempo_lab computes for ``program``: every output and gradient, ``"_bounds"`` (the
    bounds reached) and, for each sink, ``"sink:<name>"`` -> ``{point: value}`` (a point called
    twice fails). ``prog``: an already compiled program whose sinks append to ``calls``."""
    if prog is None:
        calls = {}
        prog = compile_program(program, calls, **kw)
    for v in (calls or {}).values():
        v.clear()
    run = prog.run()
    out = {name: np.asarray(run[name]) for name in program.outputs + program.grad_names}
    for name in program.sinks:
        got: dict = {}
        for p, v in calls[name]:
            key = tuple(p[d] for d in program.stmt(name).dom)
            assert key not in got, f"the sink on {name} was called twice at {p}"
            got[key] = v
        out[SINK + name] = got
    out["_bounds"] = dict(run.bounds)
    if run.profile is not None:  # store bytes: measured (per step on the loop executors), planned
        out["_peak"] = (run.profile.peak_bytes, prog.memory.peak_bytes)
        out["_calls"] = dict(run.profile.calls)  # statement instances each executor counted
    return out


# =================================================================================================
# (b) Independent evaluation, point by point (NumPy, or jax.numpy for gradients)
# =================================================================================================
def _dom_shape(program, dom, sizes=None):
    sizes = sizes or program.bounds
    return tuple(sizes[bound_of(d)] for d in dom)


def _np_index(ix: Ix, v: int | None, n: int):
    """The index (int or range) of entry ``ix`` at dim value ``v`` of a dim of size n (``v``
    is None when the reader's domain lacks the dim: only ``first/last/all`` then)."""
    k = ix.kind
    if k == "cur":
        return v
    if k == "shift":
        assert v - ix.k >= 0, "generator bug: shift before the start"
        return v - ix.k
    if k == "clamp_back":
        return max(0, v - ix.k)
    if k == "clamp_fwd":
        return min(v + ix.k, n - 1)
    if k == "first":
        return 0
    if k == "last":
        return n - 1
    if k == "all":
        return range(0, n)
    lo, hi = {"causal": (0, v + 1), "window": (max(0, v - ix.k + 1), v + 1), "suffix": (v, n),
              "prefix": (0, v), "prev_win": (max(0, v - ix.k), v)}[k]
    assert hi > lo, "generator bug: empty slice"
    return range(lo, hi)


class _Ops:
    """The elementwise vocabulary of one array library, in float32."""

    def __init__(self, xp):
        self.xp = xp
        self.unary = {"tanh": xp.tanh, "neg": xp.negative, "abs": xp.abs,
                      "relu": lambda x: xp.maximum(x, F32(0)),
                      "sigmoid": lambda x: F32(1) / (F32(1) + xp.exp(-x))}
        self.binary = {"add": xp.add, "sub": xp.subtract, "mul": xp.multiply,
                       "maximum": xp.maximum, "minimum": xp.minimum}
        self.red = {"sum": xp.sum, "mean": xp.mean, "max": xp.max}

    def f32(self, x):
        return self.xp.asarray(x, dtype=F32)


def _points(program, dom, sizes):
    """The points of ``dom``, ``t`` outermost in increasing order (a recurrence may read other
    batch entries of its earlier points), as tuples in ``dom``'s order."""
    order = sorted(range(len(dom)), key=lambda i: dom[i] != "t")
    shape = _dom_shape(program, dom, sizes)
    for opt in itertools.product(*(range(shape[i]) for i in order)):
        yield tuple(opt[order.index(i)] for i in range(len(dom)))


def _evaluate(program: RProgram, xp, inputs: dict, sizes: dict) -> dict[str, dict]:
    """Every statement's value at every point (``{name: {point: value}}``), computed point by
    point with array library ``xp`` from the ``inputs`` arrays, for bound values ``sizes``."""
    o = _Ops(xp)
    vals: dict[str, dict] = {}

    def ev(e, point: dict[str, int]):
        if isinstance(e, Const):
            return o.f32(e.value)
        if isinstance(e, Read):
            src = program.stmt(e.src)
            idx = [_np_index(ix, point.get(d), sizes[bound_of(d)])
                   for d, ix in zip(src.dom, e.entries)]
            axes = [list(x) if isinstance(x, range) else [x] for x in idx]
            got = [vals[e.src].get(q) for q in itertools.product(*axes)]
            assert all(v is not None for v in got), \
                f"generator bug: {e.src} read before it is computed"
            lens = tuple(len(x) for x in idx if isinstance(x, range))
            if not lens:
                return got[0]
            v = xp.reshape(xp.stack(got), lens + tuple(src.shape))
            return o.f32(o.red[e.red](v, axis=tuple(range(len(lens)))))
        if isinstance(e, Unary):
            return o.f32(o.unary[e.op](ev(e.x, point)))
        if isinstance(e, Scale):
            return ev(e.x, point) * F32(e.c)
        if isinstance(e, Binary):
            return o.f32(o.binary[e.op](ev(e.a, point), ev(e.b, point)))
        if isinstance(e, SpatialRed):
            return o.f32(o.red[e.op](ev(e.x, point), axis=-1, keepdims=e.keepdims))
        if isinstance(e, DimWhere):
            return o.f32(xp.where(point[e.dim] < e.k, ev(e.a, point), ev(e.b, point)))
        if isinstance(e, DimVal):
            return o.f32(point[e.dim] * e.c)
        if isinstance(e, IntOp):
            n = (ev(e.x, point) * F32(4)).astype(np.int32)
            n = xp.floor_divide(n, e.k) if e.op == "floordiv" else xp.mod(n, e.k)
            return n.astype(F32)
        if isinstance(e, MatVec):
            return o.f32(xp.matmul(ev(e.x, point), ev(e.w, point)))
        raise TypeError(e)

    for s in program.stmts:
        vals[s.name] = {}
        if isinstance(s, Input):
            arr = inputs[s.name]
            for pt in _points(program, s.dom, sizes):
                vals[s.name][pt] = arr[pt]
            continue
        for pt in _points(program, s.dom, sizes):
            point = dict(zip(s.dom, pt))
            if isinstance(s, Let):
                val = ev(s.expr, point)
            else:
                t, c = point["t"], s.lag
                if (t == 0) if s.init_kind[0] == "t0" else (t < c):
                    val = ev(s.init, point)
                elif s.init_kind[0] == "key":  # x[t + c] = step(t): step at t - c
                    val = ev(s.step, {**point, "t": t - c})
                else:
                    val = ev(s.step, point)
            vals[s.name][pt] = xp.broadcast_to(o.f32(val), s.shape)
    return vals


def _inputs(program: RProgram, sizes: dict) -> dict[str, np.ndarray]:
    """Each input's array, generated at the program's bounds and cut to ``sizes``."""
    out = {}
    for s in program.stmts:
        if isinstance(s, Input):
            arr = input_array(s.seed, _dom_shape(program, s.dom) + s.shape)
            out[s.name] = arr[tuple(slice(0, n) for n in _dom_shape(program, s.dom, sizes))]
    return out


def reached_bounds(program: RProgram) -> dict[str, int]:
    """The bound values a run reaches: ``T`` cut after the first point of the ``tl.until``
    condition (the condition reads only earlier points, so it is the same for every ``T``)."""
    sizes = dict(program.bounds)
    if program.until is None:
        return sizes
    src = program.stmt(program.until.src)
    vals = _evaluate(program, np, _inputs(program, sizes), sizes)[src.name]
    for t in range(sizes["T"]):
        v = vals[(t,)]
        if (np.max(v) if src.shape else v) > F32(program.until.thr):
            sizes["T"] = t + 1
            break
    return sizes


def _stack(program, s, vals, sizes, xp=np):
    dshape = _dom_shape(program, s.dom, sizes)
    items = [vals[pt] for pt in itertools.product(*(range(n) for n in dshape))]
    if not items:
        return xp.zeros(dshape + tuple(s.shape), F32)
    return xp.reshape(xp.stack(items), dshape + tuple(s.shape))


def numpy_eval(program: RProgram, all_tensors: bool = False) -> dict[str, np.ndarray]:
    """Every output (or every statement, with ``all_tensors``) as a float32 array over its whole
    domain (the bounds reached): domain axes in universe order, then spatial axes."""
    sizes = reached_bounds(program)
    vals = _evaluate(program, np, _inputs(program, sizes), sizes)
    names = [s.name for s in program.stmts] if all_tensors else program.outputs
    return {n: _stack(program, program.stmt(n), vals[n], sizes) for n in names}


def jax_grads(program: RProgram) -> dict[str, np.ndarray]:
    """The loss's gradients (``d_x`` for each input ``x`` in ``loss.wrt``) by ``jax.grad`` of
    the point-by-point evaluation written with ``jax.numpy`` (the program unrolled)."""
    import jax
    import jax.numpy as jnp

    if program.loss is None:
        return {}
    sizes = reached_bounds(program)
    inputs = _inputs(program, sizes)
    wrt = program.loss.wrt

    def total(xs):
        vals = _evaluate(program, jnp, {**inputs, **dict(zip(wrt, xs))}, sizes)
        return sum(jnp.sum(v) for v in vals[program.loss.src].values())

    grads = jax.grad(total)([jnp.asarray(inputs[x]) for x in wrt])
    return {f"d_{x}": np.asarray(g) for x, g in zip(wrt, grads)}


def expected(program: RProgram) -> dict:
    """What every result of ``program`` should be (the keys of ``run_tempo``): outputs and
    sink calls from NumPy, gradients from ``jax.grad``."""
    sizes = reached_bounds(program)
    vals = _evaluate(program, np, _inputs(program, sizes), sizes)
    out = {n: _stack(program, program.stmt(n), vals[n], sizes) for n in program.outputs}
    out.update(jax_grads(program))
    for name in program.sinks:
        out[SINK + name] = dict(vals[name])
    out["_bounds"] = sizes
    return out


def assert_outputs_match(program: RProgram, got, what: str = "tempo_lab",
                         rtol: float = RTOL, atol: float = ATOL, want=None) -> None:
    """Compare the results in ``got`` (a ``run_tempo`` dict, a ``Run``, any mapping with the
    outputs) with :func:`expected` (or ``want``); the failure message shows the program."""
    want = expected(program) if want is None else want
    src = to_source(program)
    have = set(got.keys())
    if "_bounds" in have:
        assert got["_bounds"]["T"] == want["_bounds"]["T"], (
            f"T reached: {what} {got['_bounds']['T']}, expected {want['_bounds']['T']}, for the "
            f"program\n{src}")
    for name in program.result_names:
        if name not in have:  # a Run has no sink calls
            continue
        g, w = got[name], want[name]
        if name.startswith(SINK):
            assert set(g) == set(w), (f"{name}: {what} called the sink at {sorted(g)}, "
                                      f"expected {sorted(w)}, for the program\n{src}")
            for pt in w:
                np.testing.assert_allclose(
                    np.asarray(g[pt]), np.asarray(w[pt]), rtol=rtol, atol=atol,
                    err_msg=f"{name} at {pt}: {what} vs NumPy, for the program\n{src}")
            continue
        oracle = "jax.grad" if name in program.grad_names else "NumPy"
        np.testing.assert_allclose(np.asarray(g), w, rtol=rtol, atol=atol,
                                   err_msg=f"{name!r}: {what} vs {oracle}, for the program\n{src}")


def assert_16bit_match(program: RProgram, got, want, what: str) -> None:
    """``got`` equals ``want`` (``run_tempo`` dicts; the reference interpreter's) for a 16-bit
    program: the bound reached, the same NaNs and infinities in the same places, and finite
    values within a few roundings of the dtype (executors may add a sum's float32 terms in
    another order: one rounding apart, then carried through the ops after it)."""
    src = to_source(program)
    assert got["_bounds"] == want["_bounds"], f"{what}: bounds {got['_bounds']}, for\n{src}"
    eps = float(ml_dtypes.finfo(ml_dtypes.bfloat16 if program.dtype == "bfloat16"
                                else np.dtype(program.dtype)).eps)
    for name in program.result_names:
        g, w = got[name], want[name]
        msg = f"{name!r}: {what} vs the reference, for the program\n{src}"
        if name.startswith(SINK):
            assert set(g) == set(w), f"{name}: {what} called it at {sorted(g)}, for\n{src}"
            pairs = [(g[p], w[p]) for p in w]
        else:
            pairs = [(g, w)]
        for a, b in pairs:
            a, b = np.asarray(a, F32), np.asarray(b, F32)
            for test in (np.isnan, np.isposinf, np.isneginf):
                np.testing.assert_array_equal(test(a), test(b), err_msg=msg)
            fin = np.isfinite(b)
            np.testing.assert_allclose(a[fin], b[fin], rtol=16 * eps, atol=16 * eps * MAG_LIMIT,
                                       err_msg=msg)


# =================================================================================================
# (c) Readable RT source
# =================================================================================================
def _src_index(ix: Ix, d: str) -> str:
    D, k = bound_of(d), ix.k
    return {
        "cur": lambda: d,
        "shift": lambda: f"{d} - {k}",
        "clamp_back": lambda: f"tl.max(0, {d} - {k})",
        "clamp_fwd": lambda: f"tl.min({d} + {k}, {D} - 1)",
        "first": lambda: "0",
        "last": lambda: f"{D} - 1",
        "causal": lambda: f"0:{d} + 1",
        "window": lambda: f"tl.max(0, {d} - {k - 1}):{d} + 1",
        "suffix": lambda: f"{d}:{D}",
        "all": lambda: f"0:{D}",
        "prefix": lambda: f"0:{d}",
        "prev_win": lambda: f"tl.max(0, {d} - {k}):{d}",
    }[ix.kind]()


_PREC_ATOM, _PREC_MUL, _PREC_ADD = 3, 2, 1


def _expr_src(program, e) -> tuple[str, int]:
    """Source text of ``e`` and its precedence (for minimal parentheses)."""
    if isinstance(e, Const):
        return repr(float(e.value)), _PREC_ATOM if e.value >= 0 else _PREC_ADD
    if isinstance(e, Read):
        src = program.stmt(e.src)
        if all(ix.kind == "cur" for ix in e.entries):
            return e.src, _PREC_ATOM
        text = f"{e.src}[{', '.join(_src_index(ix, d) for d, ix in zip(src.dom, e.entries))}]"
        nsl = sum(ix.is_slice for ix in e.entries)
        if nsl and e.moved:
            nd = nsl + len(src.shape)
            order = ", ".join(map(str, [*range(nsl, nd), *range(nsl)]))
            text += f".transpose({order}).{e.red}(axis={tuple(range(nd - nsl, nd))})"
        elif nsl:
            axis = "0" if nsl == 1 else str(tuple(range(nsl)))
            text += f".{e.red}(axis={axis})"
        return text, _PREC_ATOM
    if isinstance(e, Unary):
        x, p = _expr_src(program, e.x)
        if e.op == "neg":
            return f"-{_paren(x, p, _PREC_ATOM)}", _PREC_ADD
        return f"tl.{e.op}({x})", _PREC_ATOM
    if isinstance(e, Scale):
        x, p = _expr_src(program, e.x)
        return f"{_paren(x, p, _PREC_MUL)} * {e.c!r}", _PREC_MUL
    if isinstance(e, Binary):
        a, pa = _expr_src(program, e.a)
        b, pb = _expr_src(program, e.b)
        if e.op in ("maximum", "minimum"):
            return f"tl.{e.op}({a}, {b})", _PREC_ATOM
        if e.op == "mul":
            return f"{_paren(a, pa, _PREC_MUL)} * {_paren(b, pb, _PREC_ATOM)}", _PREC_MUL
        sym = "+" if e.op == "add" else "-"  # a + (b - c) keeps its float evaluation order
        return f"{_paren(a, pa, _PREC_ADD)} {sym} {_paren(b, pb, _PREC_MUL)}", _PREC_ADD
    if isinstance(e, SpatialRed):
        x, p = _expr_src(program, e.x)
        kd = ", keepdims=True" if e.keepdims else ""
        return f"{_paren(x, p, _PREC_ATOM)}.{e.op}(axis=-1{kd})", _PREC_ATOM
    if isinstance(e, DimWhere):
        a, _ = _expr_src(program, e.a)
        b, _ = _expr_src(program, e.b)
        return f"tl.where({e.dim} < {e.k}, {a}, {b})", _PREC_ATOM
    if isinstance(e, DimVal):
        zeros = "tl.zeros(())" if program.dtype == "float32" else \
            f"tl.zeros((), {program.dtype!r})"
        return f"({zeros} + {e.dim}) * {e.c!r}", _PREC_MUL
    if isinstance(e, IntOp):
        x, p = _expr_src(program, e.x)
        sym = "//" if e.op == "floordiv" else "%"
        return (f"(({_paren(x, p, _PREC_MUL)} * 4.0).astype('int32') {sym} {e.k})"
                f".astype({program.dtype!r})", _PREC_ATOM)
    if isinstance(e, MatVec):
        x, p = _expr_src(program, e.x)
        w, _ = _expr_src(program, e.w)
        return f"{_paren(x, p, _PREC_ATOM)} @ {w}", _PREC_MUL
    raise TypeError(e)


def _paren(text, prec, need):
    return text if prec >= need else f"({text})"


def expr_source(program: RProgram, e) -> str:
    return _expr_src(program, e)[0]


def to_source(program: RProgram) -> str:
    """Readable RT code; ``exec`` it and ``prog`` (compiled), ``out`` (its run) and ``calls``
    (each sink's ``(point, value)`` calls) are defined."""
    dims = program.dims
    dims_t = ", ".join(f'"{d}"' for d in dims) + ("," if len(dims) == 1 else "")
    names = ", ".join(dims) + ("," if len(dims) == 1 else "")
    bnames = ", ".join(map(bound_of, dims)) + ("," if len(dims) == 1 else "")
    lines = ["import numpy as np", "import tempo_lab as tl"] + (
        [] if program.dtype == "float32" else ["from randprog import input_array"]) + ["",
             f"ctx = tl.Context(dims=({dims_t})); {names} = ctx.dims; {bnames} = ctx.bounds"]
    if program.sinks:
        lines.append("calls = {" + ", ".join(f'"{n}": []' for n in program.sinks) + "}")
    lines.append("with ctx:")

    def dom_text(dom):
        return "(" + ", ".join(dom) + ("," if len(dom) == 1 else "") + ")"

    scope_of = dict(program.scopes)
    for s in program.stmts:
        first = len(lines)
        if isinstance(s, Input):
            shape = _dom_shape(program, s.dom) + s.shape
            values = (f"np.random.RandomState({s.seed}).uniform(-1, 1, size={shape})"
                      f".astype('float32')" if program.dtype == "float32" else
                      f"input_array({s.seed}, {shape}, {program.dtype!r}, {program.edges})")
            lines.append(f"    {s.name} = tl.from_array({values}, domain={dom_text(s.dom)})")
        elif isinstance(s, Let):
            lines.append(f"    {s.name} = {expr_source(program, s.expr)}")
        else:
            lines.append(f"    {s.name} = tl.placeholder({s.shape}, {program.dtype!r}, "
                         f"domain={dom_text(s.dom)})")
            cur = list(s.dom)
            kind, c = s.init_kind[0], s.lag
            if kind == "t0":
                init_key = ", ".join(cur[:-1] + ["0"])
            else:
                init_key = f"t < {c}"
            step_key = ", ".join(cur[:-1] + ([f"t + {c}"] if kind == "key" else ["t"]))
            init = f"    {s.name}[{init_key}] = {expr_source(program, s.init)}"
            step = f"    {s.name}[{step_key}] = {expr_source(program, s.step)}"
            lines += [init, step] if s.init_first else [step, init]
        if s.name in scope_of:
            lines[first:] = [f"    with tl.scope({scope_of[s.name]!r}):",
                             *("    " + line for line in lines[first:])]
    outs = [f'"{n}": {n}' for n in program.outputs]
    if program.loss is not None:
        src = program.loss.src + (".sum(axis=-1)" if program.stmt(program.loss.src).shape
                                  else "")
        targets = ", ".join(program.grad_names)
        lines.append(f"    {targets}{',' if len(program.grad_names) == 1 else ''} = "
                     f"tl.grad({src}, [{', '.join(program.loss.wrt)}])")
        outs += [f'"{n}": {n}' for n in program.grad_names]
    for n in program.sinks:
        lines.append(f"    tl.sink({n}, lambda p, v: calls[{n!r}].append((p, v)))")
    if program.until is not None:
        src = program.until.src + (".max(axis=-1)" if program.stmt(program.until.src).shape
                                   else "")
        lines.append(f"    done = {src} > {program.until.thr!r}")
    bounds = []
    for d in dims:
        b = bound_of(d)
        if b == "T" and program.until is not None:
            bounds.append(f"T: tl.until(done, max={program.bounds['T']})")
        else:
            bounds.append(f"{b}: {program.bounds[b]}")
    lines += [f"prog = ctx.compile(bounds={{{', '.join(bounds)}}}, outputs={{{', '.join(outs)}}})",
              "out = prog.run()"]
    return "\n".join(lines) + "\n"


# =================================================================================================
# Features (for coverage checks)
# =================================================================================================
_DOMS = {("t",): "t", ("b", "t"): "bt", ("b",): "b", (): "scalar_dom", ("a", "b", "t"): "abt",
         ("a", "t"): "at", ("a",): "a"}
ALL_FEATURES = frozenset(
    ["dims1", "dims2", "dims3", "spatial_scalar", "spatial_vec", "rec_t0", "rec_lt", "rec_key",
     "rec_tanh", "rec_damped", "init_second", "broadcast_t_bt", "spatial_red",
     "spatial_keepdims", "two_slices", "until", "until_never", "loss", "loss_through_until",
     "sink", "dim_where", "dim_val", "int_floordiv", "int_mod", "whole_read_odd_bound",
     "moved_read", "hostile_scope"]
    + [f"input_{v}" for v in _DOMS.values()]
    + [f"ix_{k}" for k in ("shift", "clamp_back", "clamp_fwd", "first", "last", "causal",
                           "window", "suffix", "all", "prefix", "prev_win")]
    + [f"red_{r}" for r in ("sum", "mean", "max")]
    + [f"un_{u}" for u in ("tanh", "neg", "relu", "sigmoid", "abs")]
    + [f"bin_{b}" for b in ("add", "sub", "mul", "maximum", "minimum")]
    + ["scale", "const", "const_init", "view_output"])


_CHILDREN = ("x", "a", "b", "w")


def _walk(e):
    yield e
    for f in _CHILDREN:
        child = getattr(e, f, None)
        if child is not None and not isinstance(child, (int, float, str)):
            yield from _walk(child)


def _roots(stmt):
    return ([stmt.expr] if isinstance(stmt, Let) else
            [stmt.init, stmt.step] if isinstance(stmt, Rec) else [])


def features(program: RProgram) -> set[str]:
    """Which generator features ``program`` uses (names from ``ALL_FEATURES``)."""
    out = {f"dims{len(program.dims)}"} | ({"hostile_scope"} if program.scopes else set())
    exprs = []
    for s in program.stmts:
        out.add("spatial_vec" if s.shape else "spatial_scalar")
        if isinstance(s, Input):
            out.add(f"input_{_DOMS[s.dom]}")
        elif isinstance(s, Let):
            exprs.append(s.expr)
            if isinstance(s.expr, Read) and s.name in program.outputs and any(
                    ix.kind != "cur" for ix in s.expr.entries) and s.expr.red is None:
                out.add("view_output")
        else:
            out.add({"t0": "rec_t0", "lt": "rec_lt", "key": "rec_key"}[s.init_kind[0]])
            out.add("rec_tanh" if isinstance(s.step, Unary) else "rec_damped")
            if not s.init_first:
                out.add("init_second")
            if isinstance(s.init, Const):
                out.add("const_init")
            exprs += [s.init, s.step]
    for root in exprs:
        for e in _walk(root):
            if isinstance(e, Read):
                out.update(f"ix_{ix.kind}" for ix in e.entries if ix.kind != "cur")
                if e.red:
                    out.add(f"red_{e.red}")
                if e.moved:
                    out.add("moved_read")
                if sum(ix.is_slice for ix in e.entries) == 2:
                    out.add("two_slices")
                src = program.stmt(e.src)
                if any(ix.kind == "all" and program.bounds[bound_of(d)] & (
                        program.bounds[bound_of(d)] - 1) for d, ix in zip(src.dom, e.entries)):
                    out.add("whole_read_odd_bound")
            elif isinstance(e, Unary):
                out.add(f"un_{e.op}")
            elif isinstance(e, Binary):
                out.add(f"bin_{e.op}")
                if {e.a.dom, e.b.dom} == {("t",), ("b", "t")}:
                    out.add("broadcast_t_bt")
            elif isinstance(e, Scale):
                out.add("scale")
            elif isinstance(e, Const):
                out.add("const")
            elif isinstance(e, SpatialRed):
                out.add("spatial_keepdims" if e.keepdims else "spatial_red")
            elif isinstance(e, DimWhere):
                out.add("dim_where")
            elif isinstance(e, DimVal):
                out.add("dim_val")
            elif isinstance(e, IntOp):
                out.add(f"int_{e.op}")
    if program.until is not None:
        out.add("until" if reached_bounds(program)["T"] < program.bounds["T"] else "until_never")
    if program.loss is not None:
        out.add("loss")
        if program.until is not None:
            out.add("loss_through_until")
    if program.sinks:
        out.add("sink")
    return out & ALL_FEATURES


# =================================================================================================
# The hypothesis strategy
# =================================================================================================
class _Gen:
    """Draws one program statement by statement; every choice keeps the program valid."""

    def __init__(self, draw, dims, bounds, k, max_depth, ints=True):
        self.draw, self.dims, self.bounds, self.k = draw, dims, bounds, k
        self.max_depth, self.ints = max_depth, ints  # ints: IntOp (not of inf or NaN)
        self.stmts: list = []
        self.others = tuple(d for d in dims if d != "t")

    # -- helpers ------------------------------------------------------------------------------
    def pick(self, options):
        return options[self.draw(st.integers(0, len(options) - 1))]

    # -- reads --------------------------------------------------------------------------------
    def read(self, allowed: tuple[str, ...], rec: Rec | None, own: bool | None = None) -> Read:
        """A read of an earlier statement, or of ``rec`` itself, whose domain is inside
        ``allowed``. ``rec`` given: we are drawing its step, where ``t - j`` for ``j <= rec.lag``
        is valid (in a ``key`` step, computed at ``t`` for ``t + c``, only ``t`` and before).
        ``own``: force (True) or forbid (False) a read of ``rec`` itself; None: draw it."""
        if rec is not None and own is None:
            own = self.draw(st.integers(0, 2)) == 0
        src = rec if own else self.pick(self.stmts)
        key_step = rec is not None and rec.init_kind[0] == "key"
        entries = []
        for d in src.dom:
            if src is rec:  # own points strictly before the one being defined
                if d != "t":
                    opts = [Ix("cur"), Ix("cur"), Ix("first"), Ix("last"), Ix("all")]
                elif key_step:
                    opts = [Ix("cur"), Ix("clamp_back", 1), Ix("causal"), Ix("window", 2)]
                else:
                    opts = ([Ix("shift", j) for j in range(1, rec.lag + 1)]
                            + [Ix("prefix"), Ix("prev_win", 2), Ix("prev_win", 3)])
            elif d not in allowed:
                opts = [Ix("first"), Ix("last"), Ix("all")]
            elif d != "t":
                opts = [Ix("cur"), Ix("cur"), Ix("first"), Ix("last"), Ix("all")]
            else:
                opts = [Ix("cur"), Ix("clamp_back", 1), Ix("clamp_back", 2), Ix("clamp_fwd", 1),
                        Ix("first"), Ix("last"), Ix("causal"), Ix("window", 2), Ix("window", 3),
                        Ix("suffix"), Ix("all")]
                if rec is not None and not key_step:
                    opts += [Ix("shift", j) for j in range(1, rec.lag + 1)]
            entries.append(self.pick(opts))
        nsl = sum(ix.is_slice for ix in entries)
        red = self.pick(["sum", "mean", "max"]) if nsl else None
        if src is rec and red == "sum":
            red = "mean"  # keeps recurrences bounded
        return mk_read(self.dims, self.bounds, src, entries, red)

    # -- expressions --------------------------------------------------------------------------
    def expr(self, allowed, rec=None, depth=0):
        choice = self.draw(st.integers(0, 12 if self.ints else 11)) \
            if depth < self.max_depth else 0
        if choice <= 3:
            e = self.read(allowed, rec)
        elif choice == 4:
            e = mk_unary(self.pick(["tanh", "neg", "relu", "sigmoid", "abs"]),
                         self.expr(allowed, rec, depth + 1))
        elif choice == 5:
            e = mk_scale(self.pick([0.5, -0.5, 2.0, 0.25]), self.expr(allowed, rec, depth + 1))
        elif choice <= 8:
            op = self.pick(["add", "sub", "mul", "maximum", "minimum"])
            a = self.expr(allowed, rec, depth + 1)
            if self.draw(st.integers(0, 4)) == 0:
                b = Const(self.pick([0.5, -0.25, 1.0]), mag=1.0)
            else:
                b = self.expr(allowed, rec, depth + 1)
            if op == "mul":
                a, b = limit(a, 2.0), limit(b, 2.0)
            e = mk_binary(self.dims, op, a, b)
        elif choice == 9:
            x = self.expr(allowed, rec, depth + 1)
            if len(x.shape) == 1:
                e = mk_sred(self.pick(["sum", "mean", "max"]), self.draw(st.booleans()), x)
            else:
                e = x
        elif choice == 10:
            d = self.pick([d for d in self.dims if d in allowed])
            k = self.draw(st.integers(1, self.bounds[bound_of(d)]))
            e = mk_where(self.dims, d, k, self.expr(allowed, rec, depth + 1),
                         self.expr(allowed, rec, depth + 1))
        elif choice == 11:
            d = self.pick([d for d in self.dims if d in allowed])
            e = mk_dimval(self.bounds, d, self.pick([0.25, -0.5]))
        else:
            e = mk_intop(self.pick(["floordiv", "mod"]), self.pick([2, 3]),
                         self.expr(allowed, rec, depth + 1))
        return limit(e)

    def fit(self, e, shape):
        """``e`` made assignable to a placeholder of ``shape``."""
        if len(e.shape) > len(shape):
            e = mk_sred("mean", False, e)
        return e

    # -- statements ---------------------------------------------------------------------------
    def name(self):
        return f"v{len(self.stmts)}"

    def shape(self):
        return self.pick([(), (self.k,)])

    def input(self):
        dom = self.pick({("t",): [("t",), ("t",), ("t",), ()],
                         ("b", "t"): [("b", "t"), ("b", "t"), ("t",), ("b",)],
                         ("a", "b", "t"): [("a", "b", "t"), ("a", "b", "t"), ("b", "t"),
                                           ("a", "t"), ("t",), ("a",)]}[self.dims])
        return Input(self.name(), dom, self.shape(), self.draw(st.integers(0, 2**16)))

    def let(self):
        return Let(self.name(), self.expr(self.dims))

    def rec(self):
        dom = self.pick({1: [("t",)], 2: [("b", "t"), ("t",)],
                         3: [("a", "b", "t"), ("b", "t"), ("t",)]}[len(self.dims)])
        shape = self.shape()
        kind = self.pick([("t0",), ("t0",), ("lt", 1), ("lt", 2), ("key", 1), ("key", 2)])
        name = self.name()
        if self.draw(st.integers(0, 5)) == 0:  # a Python float: weak-typed, broadcast
            init = Const(self.pick([0.0, 0.5, -1.0]), mag=1.0)
        else:
            init = self.fit(self.expr(dom), shape)
        # magnitude of the recurrence: at most max(init, 2 * |rest|) for the damped form
        proto = Rec(name, dom, shape, kind, init, None, 4.0)  # for the step's self reads
        tanh_form = self.draw(st.booleans())
        selfread = self.read(dom, proto, own=True)
        rest = self.fit(limit(self.expr(dom, proto), 2.0), shape)
        if tanh_form:
            step = mk_unary("tanh", mk_binary(self.dims, "add", selfread, rest))
        else:
            step = mk_binary(self.dims, "add", mk_scale(self.pick([0.5, -0.5]), selfread), rest)
        step = self.fit(step, shape)
        mag = max(init.mag, 1.0) if tanh_form else max(init.mag, 2 * rest.mag, 1.0)
        return Rec(name, dom, shape, kind, init, step, mag, init_first=self.draw(st.booleans()))


def _ancestry(program: RProgram, name: str) -> set[str]:
    """``name`` and every statement it reads, transitively."""
    seen, todo = set(), [name]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(reads_of(program.stmt(n)))
    return seen


def _entries_along(program: RProgram, names, dim: str) -> set[str]:
    """The kinds of index entries along ``dim`` in the reads of the statements ``names``."""
    out = set()
    for n in names:
        for r in _roots(program.stmt(n)):
            for e in _walk(r):
                if isinstance(e, Read):
                    out |= {ix.kind for d, ix in zip(program.stmt(e.src).dom, e.entries)
                            if d == dim}
    return out


def _causal(program: RProgram, name: str) -> bool:
    """Whether ``name`` reads only earlier points along ``t`` (never ``T``): a valid
    ``tl.until`` condition."""
    return not _entries_along(program, _ancestry(program, name), "t") & set(Ix.NEEDS_BOUND)


def _differentiable(program: RProgram, name: str) -> bool:
    """Whether ``tl.grad`` can differentiate ``name``: no clamped point reads on the way."""
    anc = _ancestry(program, name)
    return not any(_entries_along(program, anc, d) & set(Ix.NO_GRADIENT) for d in program.dims)


def _until(draw, program: RProgram) -> Until | None:
    """A ``tl.until`` condition on a causal statement over ``(t,)`` whose threshold lies in a
    gap of its values (so float rounding cannot move the end)."""
    cands = [s.name for s in program.stmts if s.dom == ("t",) and _causal(program, s.name)]
    if not cands:
        return None
    src = program.stmt(cands[draw(st.integers(0, len(cands) - 1))])
    vals = numpy_eval(replace(program, outputs=(src.name,), until=None, loss=None, sinks=()))
    v = vals[src.name].max(axis=-1) if src.shape else vals[src.name]
    levels = np.unique(np.concatenate([v, [v.max() + 1.0]]))
    gaps = [(a + b) / 2 for a, b in zip(levels[:-1], levels[1:]) if b - a > 4e-3]
    if not gaps:
        return None
    return Until(src.name, float(np.float32(gaps[draw(st.integers(0, len(gaps) - 1))])))


def _loss(draw, program: RProgram) -> Loss | None:
    cands = [s.name for s in program.stmts if not isinstance(s, Input)
             and _differentiable(program, s.name)]
    if not cands:
        return None
    src = cands[draw(st.integers(0, len(cands) - 1))]
    inputs = [s.name for s in program.stmts if isinstance(s, Input)]
    used = [n for n in inputs if n in _ancestry(program, src)]
    if not used:
        return None
    mask = draw(st.lists(st.booleans(), min_size=len(inputs), max_size=len(inputs)))
    wrt = tuple(n for n, m in zip(inputs, mask) if m or n == used[0])
    return Loss(src, wrt)


@st.composite
def program_strategy(draw, max_stmts: int = 7, max_depth: int = 2, dims=None,
                     extras: bool = True, dtypes: tuple[str, ...] = ("float32",)):
    """Random valid programs: 1 to 3 dims, T in 1..9, B in 1..3, A in 1..2, spatial () or
    (k,), k in 1..3, of one of ``dtypes``; a 16-bit program's inputs hold its edge values
    half of the time (and it has no integer arithmetic then: an inf cast to int32 is
    undefined).

    The first statement is an input; later ones are inputs, elementwise expressions over earlier
    tensors (point / causal / window / suffix / constant reads and reductions, conditions on
    dims as values, dims' values, integer arithmetic), or recurrences. Outputs: a random
    non-empty subset of the statements. With ``extras``, some programs also get a ``tl.until``
    bound, a loss to differentiate with ``tl.grad`` and sinks.
    """
    ndims = draw(st.sampled_from([1, 2, 2, 3])) if dims is None else len(dims)
    dims = {1: ("t",), 2: ("b", "t"), 3: ("a", "b", "t")}[ndims]
    bounds = {"T": draw(st.integers(1, 9))}
    if ndims >= 2:
        bounds["B"] = draw(st.integers(1, 3))
    if ndims == 3:
        bounds["A"] = draw(st.integers(1, 2))
    k = draw(st.integers(1, 3))
    dtype = draw(st.sampled_from(dtypes))
    edges = dtype != "float32" and draw(st.booleans())
    g = _Gen(draw, dims, bounds, k, max_depth, ints=not edges)
    g.stmts.append(g.input())
    n = draw(st.integers(1, max_stmts - 1))
    for _ in range(n):
        kind = draw(st.integers(0, 5))
        s = g.input() if kind == 0 else g.rec() if kind >= 4 else g.let()
        g.stmts.append(s)
    names = [s.name for s in g.stmts]
    mask = draw(st.lists(st.booleans(), min_size=len(names), max_size=len(names)))
    outs = tuple(nm for nm, m in zip(names, mask) if m) or (names[-1],)
    program = RProgram(dims, bounds, tuple(g.stmts), outs, dtype=dtype, edges=edges)
    if extras:
        until = _until(draw, program) if draw(st.integers(0, 3)) == 0 else None
        loss = _loss(draw, program) if draw(st.integers(0, 2)) == 0 else None
        kept = prune(program).stmts
        sinks = (kept[draw(st.integers(0, len(kept) - 1))].name,) \
            if draw(st.integers(0, 4)) == 0 else ()
        program = replace(program, until=until, loss=loss, sinks=sinks)
        if draw(st.integers(0, 3)) == 0:
            program = replace(program, scopes=hostile_scopes(draw, program))
    return prune(program)


@st.composite
def matmul_program_strategy(draw, lengths: tuple[int, ...] = (64, 128, 130)):
    """Random chains of matrix products over a long ``t``, differentiated with respect to
    their weights: the gradient of a weight read at every point is contracted over the points
    (``OpDef.vjp_sum``), and loops this long are split into spans on XLA, where a gradient
    of a product once failed at ``T >= 128``. Over ``(t,)`` or ``(b, t)``: an input ``x`` of
    width ``k``, two ``(k, k)`` weights, then 1 to 3 layers, each a projection
    ``tanh(h @ w)``, a residual ``h + 0.5 * tanh(h @ w)``, a window mean projected, or a
    recurrence ``tanh(r[t - 1] @ w + h @ w')`` (its products scaled to contract, so that the
    gradient through every step stays bounded). The loss is the last layer, summed."""
    dims = draw(st.sampled_from([("t",), ("b", "t")]))
    bounds = {"T": draw(st.sampled_from(lengths))}
    if len(dims) == 2:
        bounds["B"] = draw(st.integers(1, 2))
    k = draw(st.integers(2, 5))
    seed = st.integers(0, 2 ** 16)
    stmts: list = [Input("v0", dims, (k,), draw(seed))]
    weights = [Input(f"v{j}", (), (k, k), draw(seed)) for j in (1, 2)]
    stmts += weights

    def w():
        return mk_read(dims, bounds, weights[draw(st.integers(0, 1))], ())

    def at(src, t_entry=Ix("cur")):
        return mk_read(dims, bounds, src, [t_entry if d == "t" else Ix("cur")
                                           for d in src.dom], "mean")

    for _ in range(draw(st.integers(1, 3))):
        h, name = stmts[-1] if stmts[-1].dom else stmts[0], f"v{len(stmts)}"
        kind = draw(st.sampled_from(["proj", "residual", "window", "rec"]))
        if kind == "rec":
            proto = Rec(name, dims, (k,), ("t0",), None, None, 1.0)
            step = mk_unary("tanh", mk_binary(
                dims, "add", limit(mk_matvec(at(proto, Ix("shift", 1)), w()), 1.0),
                limit(mk_matvec(at(h), w()), 1.0)))
            stmts.append(replace(proto, init=mk_unary("tanh", limit(mk_matvec(at(h), w()))),
                                 step=step))
            continue
        x = at(h, Ix("window", draw(st.sampled_from([2, 8])))) if kind == "window" else at(h)
        e = mk_unary("tanh", limit(mk_matvec(x, w())))
        if kind == "residual":
            e = mk_binary(dims, "add", x, mk_scale(0.5, e))
        stmts.append(Let(name, limit(e)))
    last = stmts[-1].name
    wrt = ("v1", "v2") + (("v0",) if draw(st.booleans()) else ())
    program = RProgram(dims, bounds, tuple(stmts), (last,), loss=Loss(last, wrt))
    return prune(program)


# names a user may give (tl.scope): every emitter (DOT, HTML, JSON, generated code) escapes them
HOSTILE_NAMES = ('q"uote', "new\nline", "<script>alert(1)</script>", "back\\slash",
                 "uni\u00e9\u2603", "{curly} %s", "a b")


def hostile_scopes(draw, program) -> tuple[tuple[str, str], ...]:
    """Some of ``program``'s statements, each in a ``tl.scope`` with a hostile name."""
    return tuple((s.name, draw(st.sampled_from(HOSTILE_NAMES))) for s in program.stmts
                 if draw(st.booleans()))


def reads_of(stmt) -> set[str]:
    """Names of the statements that ``stmt`` reads (itself included, for a recurrence)."""
    return {e.src for r in _roots(stmt) for e in _walk(r) if isinstance(e, Read)}


def prune(program: RProgram) -> RProgram:
    """``program`` without the statements nothing depends on (names are kept), so that a
    shrunk failing example shows only what matters."""
    live = set(program.outputs) | set(program.sinks)
    if program.until is not None:
        live.add(program.until.src)
    if program.loss is not None:
        live |= {program.loss.src, *program.loss.wrt}
    for s in reversed(program.stmts):
        if s.name in live:
            live |= reads_of(s)
    stmts = tuple(s for s in program.stmts if s.name in live)
    return replace(program, stmts=stmts)
