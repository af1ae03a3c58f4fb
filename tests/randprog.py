"""Random small recurrent-tensor programs for differential testing (DESIGN §6).

A program is plain data (:class:`RProgram`: dims, bounds, a list of statements, the outputs) that
can be

* built with the tempo_lab API: :func:`build` -> ``(ctx, outputs, bounds)``;
* evaluated independently with NumPy: :func:`numpy_eval` -> ``{name: array}`` (every tensor is
  materialised over its whole domain with explicit loops, ``t`` in increasing order; no tempo_lab
  code is used);
* printed as readable RT code: :func:`to_source` (Python source with ``tl.`` calls that, when
  executed, leaves the compiled program in ``prog``).

:func:`program_strategy` is the hypothesis strategy. Every program it draws is valid by
construction: reads stay inside their domains, placeholders are fully and disjointly covered, and
value magnitudes stay small (expressions whose bound could exceed 4 are scaled by a power of two),
so float32 results agree to ``rtol=1e-4, atol=1e-5``.

Usage from another test (tests/ is not a package)::

    sys.path.insert(0, str(Path(__file__).parent))
    from randprog import build, numpy_eval, program_strategy, run_tempo, to_source
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

__all__ = [
    "RProgram", "Input", "Let", "Rec", "Read", "Const", "Unary", "Scale", "Binary", "SpatialRed",
    "Ix", "build", "compile_program", "run_tempo", "numpy_eval", "to_source", "program_strategy",
    "features", "ALL_FEATURES", "input_array", "assert_outputs_match", "expr_source",
    "mk_read", "mk_unary", "mk_scale", "mk_binary", "mk_sred", "limit", "prune", "reads_of",
    "RTOL", "ATOL",
]

RTOL, ATOL = 1e-4, 1e-5
F32 = np.float32
MAG_LIMIT = 4.0  # an expression whose magnitude bound exceeds this is scaled down


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
    """``src[entries]``, followed by ``.{red}(axis=...)`` over the new axes if any is a slice."""

    src: str
    entries: tuple[Ix, ...]
    red: str | None
    dom: tuple[str, ...]
    shape: tuple[int, ...]
    mag: float


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


@dataclass(frozen=True, repr=False)
class RProgram:
    dims: tuple[str, ...]          # ("t",) or ("b", "t")
    bounds: dict                   # {"T": 5} or {"B": 2, "T": 5}
    stmts: tuple
    outputs: tuple[str, ...]       # statement names to compile as outputs

    def stmt(self, name):
        return next(s for s in self.stmts if s.name == name)

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


def input_array(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """The values of an ``Input``: uniform in [-1, 1], float32."""
    return np.random.RandomState(seed).uniform(-1, 1, size=shape).astype(F32)


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
    return Read(src.name, tuple(entries), red, _union_dom(prog_dims, keep), tuple(src.shape),
                float(mag))


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


def build(program: RProgram):
    """Build ``program`` with tempo_lab. Returns ``(ctx, outputs, bounds)`` for
    ``ctx.compile(bounds=bounds, outputs=outputs)`` (outputs: name -> RecurrentTensor)."""
    import tempo_lab as tl

    ctx = tl.Context(dims=program.dims)
    dim_of = {d.name: d for d in ctx.dims}
    bound_obj = {d.name: d.bound for d in ctx.dims}
    env: dict[str, object] = {}

    def ev(e):
        if isinstance(e, Const):
            return e.value
        if isinstance(e, Read):
            src = program.stmt(e.src)
            key = tuple(_tl_index(tl, dim_of[d], bound_obj[d], ix)
                        for d, ix in zip(src.dom, e.entries))
            r = env[e.src][key] if key else env[e.src]
            nsl = sum(ix.is_slice for ix in e.entries)
            if nsl:
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
        raise TypeError(e)

    with ctx:
        for s in program.stmts:
            dom = tuple(dim_of[d] for d in s.dom)
            if isinstance(s, Input):
                env[s.name] = tl.from_array(input_array(s.seed, _dom_shape(program, s.dom)
                                                        + s.shape), domain=dom)
            elif isinstance(s, Let):
                env[s.name] = ev(s.expr)
            elif isinstance(s, Rec):
                x = tl.placeholder(s.shape, "float32", domain=dom)
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
    bounds = {bound_obj[d]: program.bounds[bound_of(d)] for d in program.dims}
    return ctx, outputs, bounds


def compile_program(program: RProgram, **kw):
    """``build`` then ``ctx.compile`` (extra keyword arguments go to ``compile``)."""
    ctx, outputs, bounds = build(program)
    return ctx.compile(bounds=bounds, outputs=outputs, **kw)


def run_tempo(program: RProgram, **kw) -> dict[str, np.ndarray]:
    """Outputs of ``program`` as computed by tempo_lab (``compile(...).run()``)."""
    run = compile_program(program, **kw).run()
    return {name: np.asarray(run[name]) for name in program.outputs}


# =================================================================================================
# (b) Independent NumPy evaluation
# =================================================================================================
def _dom_shape(program, dom):
    return tuple(program.bounds[bound_of(d)] for d in dom)


def _np_index(ix: Ix, v: int | None, n: int):
    """The NumPy index (int or slice) of entry ``ix`` at dim value ``v`` of a dim of size n
    (``v`` is None when the reader's domain lacks the dim: only ``first/last/all`` then)."""
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
        return slice(0, n)
    lo, hi = {"causal": (0, v + 1), "window": (max(0, v - ix.k + 1), v + 1), "suffix": (v, n),
              "prefix": (0, v), "prev_win": (max(0, v - ix.k), v)}[k]
    assert hi > lo, "generator bug: empty slice"
    return slice(lo, hi)


_NP_UNARY = {"tanh": np.tanh, "neg": np.negative, "relu": lambda x: np.maximum(x, F32(0)),
             "sigmoid": lambda x: F32(1) / (F32(1) + np.exp(-x)), "abs": np.abs}
_NP_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum,
              "minimum": np.minimum}
_NP_RED = {"sum": np.sum, "mean": np.mean, "max": np.max}


def numpy_eval(program: RProgram, all_tensors: bool = False) -> dict[str, np.ndarray]:
    """Every output (or every statement, with ``all_tensors``) as a float32 array over its whole
    domain: domain axes in universe order, then spatial axes. Plain loops, no tempo_lab."""
    sizes = {d: program.bounds[bound_of(d)] for d in program.dims}
    arrays: dict[str, np.ndarray] = {}

    def ev(e, point: dict[str, int]) -> np.ndarray:
        """The value of expression ``e`` at ``point`` (dim name -> int)."""
        if isinstance(e, Const):
            return np.asarray(e.value, F32)
        if isinstance(e, Read):
            src = program.stmt(e.src)
            idx = tuple(_np_index(ix, point.get(d), sizes[d])
                        for d, ix in zip(src.dom, e.entries))
            v = arrays[e.src][idx]
            assert not np.isnan(v).any(), f"generator bug: {e.src} read before it is computed"
            nsl = sum(ix.is_slice for ix in e.entries)
            if nsl:
                v = _NP_RED[e.red](v, axis=tuple(range(nsl)))
            return np.asarray(v, F32)
        if isinstance(e, Unary):
            out = _NP_UNARY[e.op](ev(e.x, point))
        elif isinstance(e, Scale):
            out = ev(e.x, point) * F32(e.c)
        elif isinstance(e, Binary):
            out = _NP_BINARY[e.op](ev(e.a, point), ev(e.b, point))
        elif isinstance(e, SpatialRed):
            out = _NP_RED[e.op](ev(e.x, point), axis=-1, keepdims=e.keepdims)
        else:
            raise TypeError(e)
        return np.asarray(out, F32)

    for s in program.stmts:
        dshape = _dom_shape(program, s.dom)
        arr = np.full(dshape + tuple(s.shape), np.nan, F32)
        if isinstance(s, Input):
            arr[...] = input_array(s.seed, dshape + s.shape)
            arrays[s.name] = arr
            continue
        arrays[s.name] = arr  # a recurrence reads its own earlier points while being filled
        # t outermost, in increasing order (a recurrence may read other batch entries of its
        # earlier points), then the other dims
        order = sorted(range(len(s.dom)), key=lambda i: s.dom[i] != "t")
        for opt in itertools.product(*(range(dshape[i]) for i in order)):
            pt = tuple(opt[order.index(i)] for i in range(len(s.dom)))
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
            arr[pt] = np.broadcast_to(val, s.shape)
        assert not np.isnan(arr).any(), f"generator bug: {s.name} not fully defined"
    names = [s.name for s in program.stmts] if all_tensors else program.outputs
    return {n: arrays[n] for n in names}


def assert_outputs_match(program: RProgram, got, what: str = "tempo_lab",
                         rtol: float = RTOL, atol: float = ATOL) -> None:
    """Compare ``got[name]`` (any mapping, e.g. a ``Run``) with :func:`numpy_eval` for every
    output; the failure message shows the program as RT code."""
    expected = numpy_eval(program)
    for name in program.outputs:
        g = np.asarray(got[name])
        np.testing.assert_allclose(
            g, expected[name], rtol=rtol, atol=atol,
            err_msg=f"output {name!r}: {what} vs NumPy, for the program\n{to_source(program)}")


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
        if nsl:
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
    raise TypeError(e)


def _paren(text, prec, need):
    return text if prec >= need else f"({text})"


def expr_source(program: RProgram, e) -> str:
    return _expr_src(program, e)[0]


def to_source(program: RProgram) -> str:
    """Readable RT code; ``exec`` it and ``prog`` (compiled) and ``out`` (its run) are defined."""
    dims = program.dims
    dims_t = ", ".join(f'"{d}"' for d in dims) + ("," if len(dims) == 1 else "")
    names = ", ".join(dims) + ("," if len(dims) == 1 else "")
    bnames = ", ".join(map(bound_of, dims)) + ("," if len(dims) == 1 else "")
    lines = ["import numpy as np", "import tempo_lab as tl", "",
             f"ctx = tl.Context(dims=({dims_t})); {names} = ctx.dims; {bnames} = ctx.bounds",
             "with ctx:"]

    def dom_text(dom):
        return "(" + ", ".join(dom) + ("," if len(dom) == 1 else "") + ")"

    for s in program.stmts:
        if isinstance(s, Input):
            shape = _dom_shape(program, s.dom) + s.shape
            lines.append(f"    {s.name} = tl.from_array(np.random.RandomState({s.seed})"
                         f".uniform(-1, 1, size={shape}).astype('float32'), "
                         f"domain={dom_text(s.dom)})")
        elif isinstance(s, Let):
            lines.append(f"    {s.name} = {expr_source(program, s.expr)}")
        else:
            lines.append(f"    {s.name} = tl.placeholder({s.shape}, 'float32', "
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
    bounds = ", ".join(f"{bound_of(d)}: {program.bounds[bound_of(d)]}" for d in dims)
    outs = ", ".join(f'"{n}": {n}' for n in program.outputs)
    lines += [f"prog = ctx.compile(bounds={{{bounds}}}, outputs={{{outs}}})", "out = prog.run()"]
    return "\n".join(lines) + "\n"


# =================================================================================================
# Features (for coverage checks)
# =================================================================================================
ALL_FEATURES = frozenset(
    ["dims1", "dims2", "input_t", "input_bt", "input_b", "input_scalar_dom", "spatial_scalar",
     "spatial_vec", "rec_t0", "rec_lt", "rec_key", "rec_tanh", "rec_damped", "init_second",
     "broadcast_t_bt", "spatial_red", "spatial_keepdims", "two_slices"]
    + [f"ix_{k}" for k in ("shift", "clamp_back", "clamp_fwd", "first", "last", "causal",
                           "window", "suffix", "all", "prefix", "prev_win")]
    + [f"red_{r}" for r in ("sum", "mean", "max")]
    + [f"un_{u}" for u in ("tanh", "neg", "relu", "sigmoid", "abs")]
    + [f"bin_{b}" for b in ("add", "sub", "mul", "maximum", "minimum")]
    + ["scale", "const", "const_init", "view_output"])


def _walk(e):
    yield e
    for f in ("x", "a", "b"):
        child = getattr(e, f, None)
        if child is not None and not isinstance(child, (int, float, str)):
            yield from _walk(child)


def features(program: RProgram) -> set[str]:
    """Which generator features ``program`` uses (names from ``ALL_FEATURES``)."""
    out = {f"dims{len(program.dims)}"}
    exprs = []
    for s in program.stmts:
        out.add("spatial_vec" if s.shape else "spatial_scalar")
        if isinstance(s, Input):
            out.add({("t",): "input_t", ("b", "t"): "input_bt", ("b",): "input_b"}.get(
                s.dom, "input_scalar_dom"))
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
                if sum(ix.is_slice for ix in e.entries) == 2:
                    out.add("two_slices")
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
    return out & ALL_FEATURES


# =================================================================================================
# The hypothesis strategy
# =================================================================================================
class _Gen:
    """Draws one program statement by statement; every choice keeps the program valid."""

    def __init__(self, draw, dims, bounds, k, max_depth):
        self.draw, self.dims, self.bounds, self.k = draw, dims, bounds, k
        self.max_depth = max_depth
        self.stmts: list = []

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
        choice = self.draw(st.integers(0, 9)) if depth < self.max_depth else 0
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
        else:
            x = self.expr(allowed, rec, depth + 1)
            if len(x.shape) == 1:
                e = mk_sred(self.pick(["sum", "mean", "max"]), self.draw(st.booleans()), x)
            else:
                e = x
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
        if len(self.dims) == 1:
            dom = self.pick([("t",), ("t",), ("t",), ()])
        else:
            dom = self.pick([("b", "t"), ("b", "t"), ("t",), ("b",)])
        return Input(self.name(), dom, self.shape(), self.draw(st.integers(0, 2**16)))

    def let(self):
        return Let(self.name(), self.expr(self.dims))

    def rec(self):
        dom = self.dims if len(self.dims) == 1 else self.pick([("b", "t"), ("t",)])
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


@st.composite
def program_strategy(draw, max_stmts: int = 7, max_depth: int = 2, dims=None):
    """Random valid programs: 1 or 2 dims, T in 1..7, B in 1..3, spatial () or (k,), k in 1..3.

    The first statement is an input; later ones are inputs, elementwise expressions over earlier
    tensors (with point / causal / window / suffix / constant reads and reductions), or
    recurrences. Outputs: a random non-empty subset of the statements.
    """
    ndims = draw(st.sampled_from([1, 2])) if dims is None else len(dims)
    dims = ("t",) if ndims == 1 else ("b", "t")
    T = draw(st.integers(1, 7))
    bounds = {"T": T} if ndims == 1 else {"B": draw(st.integers(1, 3)), "T": T}
    k = draw(st.integers(1, 3))
    g = _Gen(draw, dims, bounds, k, max_depth)
    g.stmts.append(g.input())
    n = draw(st.integers(1, max_stmts - 1))
    for _ in range(n):
        kind = draw(st.integers(0, 5))
        s = g.input() if kind == 0 else g.rec() if kind >= 4 else g.let()
        g.stmts.append(s)
    names = [s.name for s in g.stmts]
    mask = draw(st.lists(st.booleans(), min_size=len(names), max_size=len(names)))
    outs = tuple(nm for nm, m in zip(names, mask) if m) or (names[-1],)
    return prune(RProgram(dims, bounds, tuple(g.stmts), outs))


def reads_of(stmt) -> set[str]:
    """Names of the statements that ``stmt`` reads (itself included, for a recurrence)."""
    roots = ([stmt.expr] if isinstance(stmt, Let) else
             [stmt.init, stmt.step] if isinstance(stmt, Rec) else [])
    return {e.src for r in roots for e in _walk(r) if isinstance(e, Read)}


def prune(program: RProgram) -> RProgram:
    """``program`` without the statements no output depends on (names are kept), so that a
    shrunk failing example shows only what matters."""
    live = set(program.outputs)
    for s in reversed(program.stmts):
        if s.name in live:
            live |= reads_of(s)
    stmts = tuple(s for s in program.stmts if s.name in live)
    return RProgram(program.dims, program.bounds, stmts, program.outputs)
