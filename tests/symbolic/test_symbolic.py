"""Index expressions, conditions and the isl bridge, checked by brute force over small boxes."""
import itertools

import islpy as isl
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tempo_lab as tl
from tempo_lab.runtime import index_code as ic
from tempo_lab.symbolic import TRUE, Dim, Slice, and_, eq, max_, min_, ne, not_, or_
from tempo_lab.symbolic import isl as I

t, b = Dim("t"), Dim("b")
T, B = t.bound, b.bound
PARAMS = ("B", "T")
BOUNDS = {"B": 3, "T": 6}


def points():
    for bv, tv in itertools.product(range(BOUNDS["B"]), range(BOUNDS["T"])):
        yield {"b": bv, "t": tv, **BOUNDS}


def test_structural_equality_and_canonical_form():
    assert t + 1 - 1 == t
    assert hash(t + 2) == hash(2 + t)
    assert 2 * t - t == t
    assert (t - 1) != (t - 2)
    assert str(t - 1) == "t - 1" and str(2 * t + 1) == "2*t + 1"
    assert min_(t + 3, t) == t and max_(t + 3, t) == t + 3
    assert max_(0, t - 2) == max_(t - 2, 0)
    assert (2 * t + 4) // 2 == t + 2 and (2 * t) % 2 == 0
    assert str((t + 5) // 2) == "(t + 5) // 2"
    assert t.bound == T and T.name == "T"


def test_conditions_normalise():
    assert (t < 3) == (t <= 2) == (3 > t)
    assert ~(t < 3) == (t >= 3)
    assert eq(t, 0) == eq(0, t)
    assert ne(t, 0) == not_(eq(t, 0))
    assert and_(t < 3, TRUE) == (t < 3)
    assert str(t < T) == "t < T" and str(eq(t, 0)) == "t == 0" and str(t >= 1) == "t >= 1"


def test_condition_has_no_truth_value():
    with pytest.raises(tl.ExprError):
        if t < 3:
            pass


def test_non_affine_product_is_a_value_not_an_expression():
    """``t * b`` is not an index expression (isl's are affine): it is a ``Product``, which the
    frontend lifts to a value, and an ExprError as soon as it is used as an expression."""
    from tempo_lab.symbolic import Product, as_expr

    assert isinstance(t * b, Product) and isinstance(t * b * 2, Product)
    for use in (lambda: as_expr(t * b), lambda: t * b + 1, lambda: 1 - t * b,
                lambda: t * b // 2, lambda: t < t * b):
        with pytest.raises(tl.ExprError, match="not an index expression"):
            use()


exprs = st.recursive(
    st.sampled_from([t, b, T, B]) | st.integers(-3, 3).map(lambda v: t - t + v),
    lambda inner: st.one_of(
        st.tuples(inner, inner).map(lambda p: p[0] + p[1]),
        st.tuples(inner, inner).map(lambda p: p[0] - p[1]),
        st.tuples(inner, st.integers(-2, 3)).map(lambda p: p[0] * p[1]),
        st.tuples(inner, st.integers(1, 3)).map(lambda p: p[0] // p[1]),
        st.tuples(inner, st.integers(1, 3)).map(lambda p: p[0] % p[1]),
        st.tuples(inner, inner).map(lambda p: min_(p[0], p[1])),
        st.tuples(inner, inner).map(lambda p: max_(p[0], p[1])),
    ),
    max_leaves=5,
)

conds = st.recursive(
    st.tuples(exprs, exprs, st.sampled_from(["<", "<=", "==", "!="])).map(
        lambda p: {"<": lambda a, c: a < c, "<=": lambda a, c: a <= c,
                   "==": eq, "!=": ne}[p[2]](p[0], p[1])),
    lambda inner: st.one_of(
        st.tuples(inner, inner).map(lambda p: p[0] & p[1]),
        st.tuples(inner, inner).map(lambda p: p[0] | p[1]),
        inner.map(lambda c: ~c),
    ),
    max_leaves=4,
)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(exprs)
def test_isl_pw_aff_agrees_with_evaluate(e):
    sp = I.space([b, t], PARAMS)
    affs = isl.affs_from_space(sp)
    pa = I.pw_aff(e, affs)
    universe = I.fix(isl.Set.universe(sp), BOUNDS)
    for p in points():
        pt = universe.fix_val(isl.dim_type.set, 0, p["b"]).fix_val(isl.dim_type.set, 1, p["t"])
        holds = pa.eq_set(affs[0] + e.evaluate(p))
        assert not (pt & holds).is_empty()


@settings(max_examples=100, deadline=None, derandomize=True)
@given(exprs, st.integers(2, 5))
def test_traced_index_code_agrees_with_evaluate(e, k):
    """The XLA trace's integer code (lax floor division and modulo, minima) on every point at
    once, negative values included, against the expressions' own evaluation."""
    pts = list(points())
    env = {ic.var(d): jnp.asarray([p[d] for p in pts], jnp.int32) for d in ("b", "t")}
    env.update({ic.bound(n): jnp.int32(v) for n, v in BOUNDS.items()})
    for x in (e, (e - 3) // k, (e - 3) % k):
        got = np.broadcast_to(np.asarray(ic.jax_int(x, env)), (len(pts),))
        assert got.tolist() == [x.evaluate(p) for p in pts], x


@settings(max_examples=150, deadline=None, derandomize=True)
@given(conds)
def test_cond_set_round_trip(c):
    box = I.fix(I.box([b, t], PARAMS), BOUNDS)
    s = I.cond_set(c, box.get_space()) & box
    back = I.cond_from_set(s)
    for p in points():
        inside = c.evaluate(p)
        assert inside == back.evaluate(p)
        pt = box.fix_val(isl.dim_type.set, 0, p["b"]).fix_val(isl.dim_type.set, 1, p["t"])
        assert (not (pt & s).is_empty()) == inside



linear_conds = st.recursive(  # a loop's guards: a * t + k * T + c compared with zero
    st.tuples(st.integers(-2, 2), st.integers(-1, 1), st.integers(-4, 4),
              st.sampled_from([">=", "==", "!="])).map(
        lambda p: {">=": lambda e: e >= 0, "==": lambda e: eq(e, 0),
                   "!=": lambda e: ne(e, 0)}[p[3]](p[0] * t + p[1] * T + p[2])),
    lambda inner: st.one_of(st.tuples(inner, inner).map(lambda p: p[0] & p[1]),
                            st.tuples(inner, inner).map(lambda p: p[0] | p[1]),
                            inner.map(lambda c: ~c)),
    max_leaves=3,
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.one_of(conds, linear_conds), st.sampled_from([0, 1, 2, -3, T - 2, 1 - T, T + b]),
       st.booleans(), st.sampled_from([None, 1, 3]))
def test_a_loops_range_decides_a_condition_only_where_it_holds_throughout(c, first, exact,
                                                                            floor):
    """``decide(c, {t: (first, exact), T: (floor, False)})``: True or False only if ``c`` is
    that at every point with ``t >= first`` (``t == first`` if exact) and ``T >= floor``,
    checked by brute force."""
    from tempo_lab.symbolic.cond import decide

    got = decide(c, {t: (first, exact), **({} if floor is None else {T: (floor, False)})})
    if got is None:
        return
    for bv, tv_bound in itertools.product(range(3), range(floor or 1, 7)):
        env = {"b": bv, "B": 3, "T": tv_bound}
        start = tl.symbolic.as_expr(first).evaluate(env)
        for tv in [start] if exact else range(start, start + 12):
            assert c.evaluate({**env, "t": tv}) == got, (c, first, exact, env, tv)


two_bound_conds = st.recursive(  # guards of a loop cut at B: a * t + k * T + m * B + c
    st.tuples(st.integers(-1, 1), st.integers(-1, 1), st.integers(-1, 1), st.integers(-3, 3),
              st.sampled_from([">=", "=="])).map(
        lambda p: (lambda e: e >= 0 if p[4] == ">=" else eq(e, 0))(
            p[0] * t + p[1] * T + p[2] * B + p[3])),
    lambda inner: st.one_of(st.tuples(inner, inner).map(lambda p: p[0] & p[1]),
                            inner.map(lambda c: ~c)),
    max_leaves=3,
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(two_bound_conds, st.sampled_from(["before", "from", "whole"]))
def test_a_cut_loops_ranges_decide_a_condition_only_where_it_holds_throughout(c, part):
    """The ranges of the two loops a loop over ``t in 0..T`` is cut into at ``B``
    (``schedule/cut.py``: ``0..min(T, B)`` and ``max(0, B)..T``, each end read as each of its
    arguments, and the fact that a loop that runs has its end above its start): ``decide``
    answers only what holds at every point, by brute force."""
    from tempo_lab.schedule.cut import loop_ranges
    from tempo_lab.schedule.loops import For, Seq

    lo, hi = {"before": (0, min_(T, B)), "from": (max_(0, B), T), "whole": (0, T)}[part]
    ranges = loop_ranges(For("t", tl.symbolic.as_expr(lo), tl.symbolic.as_expr(hi), Seq(())),
                         {}, {}, lo, False)
    got = tl.symbolic.cond.decide(c, ranges)
    if got is None:
        return
    for tv_bound, bv_bound in itertools.product(range(1, 8), range(1, 8)):
        env = {"T": tv_bound, "B": bv_bound}
        first = tl.symbolic.as_expr(lo).evaluate(env)
        for tv in range(first, tl.symbolic.as_expr(hi).evaluate(env)):
            assert c.evaluate({**env, "t": tv}) == got, (c, part, env, tv)


def test_a_cut_loops_ranges_settle_its_branches():
    """The two parts of ``t in 0..T`` cut at ``B``: ``t >= B`` is False before and True from
    it, and a guard that the part runs at all implies (``T >= B + 1``) is True from it."""
    from tempo_lab.schedule.cut import loop_ranges
    from tempo_lab.schedule.loops import For, Seq
    from tempo_lab.symbolic.cond import decide

    def ranges(lo, hi):
        return loop_ranges(For("t", tl.symbolic.as_expr(lo), hi, Seq(())), {}, {}, lo, False)

    before, after = ranges(0, min_(T, B)), ranges(max_(0, B), T)
    assert decide(t >= B, before) is False and decide(t >= B, after) is True
    assert decide(T - B - 1 >= 0, after) is True and decide(T - B - 1 >= 0, before) is None


def test_a_recurrences_guards_are_settled_after_its_first_step():
    from tempo_lab.symbolic.cond import decide

    c0 = Dim("c0")
    assert decide(t >= 1, {t: (0, False)}) is None
    assert decide(t >= 1, {t: (1, False)}) is True and decide(t >= 1, {t: (0, True)}) is False
    assert decide(ne(t, 0), {t: (1, False)}) is True and decide(eq(t, 0), {t: (0, True)})
    # a loop over c0 = -t from 1 - T: its first step is t = T - 1, whatever T is
    assert decide(c0 + T - 2 >= 0, {c0: (1 - T, True)}) is False
    assert decide(c0 + T - 2 >= 0, {c0: (2 - T, False)}) is True
    assert decide(t <= T - 1, {t: (0, False)}) is None  # the end is not known: not decided
    # with T at least 8 (XlaPlan.floors): the loop's range over c0 is named by T, which cancels
    assert decide(T - 2 >= 0, {T: (8, False)}) is True
    assert decide(T - 9 >= 0, {T: (8, False)}) is None
    assert decide(c0 + T - 2 >= 0, {c0: (2 - T, False), T: (8, False)}) is True
    assert decide(c0 + 2 * T - 18 >= 0, {c0: (1 - T, True), T: (8, False)}) is None
    assert decide(c0 + 2 * T - 9 >= 0, {c0: (1 - T, True), T: (8, False)}) is True


def test_edge_map_reverse_and_reads():
    m = I.edge_map(("C", [b, t]), ("P", [b, t]), [b, Slice(max_(0, t - 2), t + 1)],
                   t >= 1, PARAMS)
    fixed = I.fix(m, BOUNDS)
    reads = I.reads_at(fixed, {"b": 1, "t": 4})
    got = sorted(tuple(p.get_coordinate_val(isl.dim_type.set, i).to_python() for i in range(2))
                 for p in _points(reads))
    assert got == [(1, 2), (1, 3), (1, 4)]
    assert I.reads_at(fixed, {"b": 0, "t": 0}).is_empty()  # the condition t >= 1 excludes t = 0
    # the reverse map: producer point (1, 2) is read by consumer points t = 2, 3, 4
    rev = fixed.reverse()
    readers = sorted(p.get_coordinate_val(isl.dim_type.set, 1).to_python()
                     for p in _points(I.reads_at(rev, {"b'": 1, "t'": 2})))
    assert readers == [2, 3, 4]


def _points(s):
    out = []
    s.foreach_point(out.append)
    return out


def test_substitute_and_slices():
    s = Slice(max_(0, t - 2), t + 1)
    assert s.substitute({t: t - 1}) == Slice(max_(0, t - 3), t)
    assert s.length.evaluate({"t": 5}) == 3
    assert Slice.of(slice(None, None), T) == Slice(t - t, T)
    assert or_(t < 1, t >= 1).evaluate({"t": 3})


def test_float_arithmetic_on_index_expressions_says_how_to_lift():
    for bad in (lambda: t * 0.5, lambda: t / 2, lambda: t + 1.5):
        with pytest.raises(tl.ExprError, match="lift it"):
            bad()


@pytest.mark.executors(("interpreter", "reference"), reason="the reference and one back end")
def test_conditions_on_dims_are_bool_values(executor):
    ctx = tl.Context(dims=("t",))
    (tt,), (TT,) = ctx.dims, ctx.bounds
    with ctx:
        y = tl.where(tt < 3, tl.ones(()), tl.zeros(()) + tt)
        z = (tt < TT - 1) & (tl.zeros(()) + tt > 0)
    run = ctx.compile(bounds={TT: 5}, outputs={"y": y, "z": z},
                      config=tl.CompileConfig(executor=executor)).run()
    assert run["y"].tolist() == [1, 1, 1, 3, 4]
    assert run["z"].tolist() == [False, True, True, True, False]
