"""Contraction (passes/contract.py): a parameter's per-point gradient from a lifted function,
summed over a range, is one batched ``jax.vjp``. Checked against ``jax.grad`` on random
programs (which dims the parameter and the data vary along, a recurrence along ``t`` or not,
every executor), with the pass on and off, and on the RL training program."""
from __future__ import annotations

import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from rt_helpers import ALL, data_over

import tempo_lab as tl

DIMS = ("i", "b", "t")

def f(w, x):
    """A one-layer net's scalar output: its cotangent for ``w`` is an outer product per point."""
    return jnp.tanh(x @ w).sum() ** 2


def f2(w, x):
    """Two outputs of one call that both reach the loss (``_loss``): one vjp takes both."""
    y = jnp.tanh(x @ w)
    return y.sum() ** 2, y.mean()


def _loss(spec):
    """The scalar loss at one point, as a function of ``(w, x)``."""
    if spec.get("outputs", 1) == 1:
        return f
    return lambda w, x: f2(w, x)[0] + 0.5 * f2(w, x)[1] ** 2


def _contracted(prog) -> int:
    return sum(r.count("rewritten") for r in prog.passes.records if r.name == "contract")


@st.composite
def programs(draw):
    bounds = {d: draw(st.integers(1, 3)) for d in DIMS}
    param = tuple(d for d in DIMS if draw(st.booleans()))   # the dims the parameter varies on
    return {"bounds": bounds, "param": param, "recurrent": draw(st.booleans()),
            "executor": draw(st.sampled_from(ALL)), "contract": draw(st.booleans()),
            "outputs": draw(st.sampled_from([1, 2])), "groups": draw(st.booleans()),
            "seed": draw(st.integers(0, 2**16))}


def _build(spec):
    """``loss = sum over (i, b, t) of f(w[param dims], x[i, b, t])`` (or of both outputs of
    ``f2``: ``outputs`` 2); with ``recurrent``, ``x``
    is a running sum along ``t`` (so ``t`` stays a loop, as in a rollout)."""
    rng = np.random.default_rng(spec["seed"])
    n = [spec["bounds"][d] for d in DIMS]
    X = rng.normal(size=(*n, 3)).astype(np.float32)
    W = rng.normal(size=(*[spec["bounds"][d] for d in spec["param"]], 3, 2)).astype(np.float32)
    ctx = tl.Context(dims=DIMS)
    dims = dict(zip(DIMS, ctx.dims))
    with ctx:
        x, X = data_over(ctx, X, spec["recurrent"])
        pdom = tuple(dims[d] for d in spec["param"])
        w = tl.placeholder((3, 2), domain=pdom)
        w[pdom] = tl.from_array(W, domain=pdom) if pdom else tl.constant(W)
        if spec.get("outputs", 1) == 1:
            loss = tl.lift(f)(w, x)
        else:
            a, c = tl.lift(f2)(w, x)
            loss = a + 0.5 * c * c
        (g,) = tl.grad(loss, [w])
    bounds = dict(zip(ctx.bounds, n))
    return ctx, bounds, g, _expected(spec, X, W)


def _expected(spec, X, W):
    """``jax.grad`` of ``f`` at every point, summed over the dims the parameter lacks."""
    n = [spec["bounds"][d] for d in DIMS]
    grad = jax.grad(_loss(spec))
    want = np.zeros(W.shape, np.float32)
    for point in itertools.product(*map(range, n)):
        at = tuple(p for d, p in zip(DIMS, point) if d in spec["param"])
        want[at] += np.asarray(grad(W[at], X[point]))
    return want


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(programs())
def test_gradients_equal_jax_grad(spec):
    ctx, bounds, g, want = _build(spec)
    config = tl.CompileConfig(executor=spec["executor"], contract=spec["contract"],
                              vectorise_groups=spec.get("groups", False), check_invariants=True)
    prog = ctx.compile(bounds=bounds, outputs={"g": g}, config=config)
    np.testing.assert_allclose(prog.run()["g"], want, rtol=2e-4, atol=2e-4)
    summed = [d for d in DIMS if d not in spec["param"]]
    if spec["contract"] and summed:
        assert _contracted(prog) >= 1
    if not spec["contract"]:
        assert _contracted(prog) == 0


def test_the_sum_becomes_one_vjp_over_the_stacked_range():
    """The per-point cotangents are gone: the sum over ``t`` is a lift reading ``x[b, 0:T]``,
    and no value over ``(b, t)`` has the parameter's size."""
    spec = {"bounds": {"i": 1, "b": 2, "t": 4}, "param": ("i",), "recurrent": True,
            "executor": "xla", "contract": True, "seed": 0}
    ctx, bounds, g, want = _build(spec)
    prog = ctx.compile(bounds=bounds, outputs={"g": g})
    lifts = [op for op in prog.passes.records[-1].after.ops.values()
             if getattr(op.attrs.get("jax_fn"), "__name__", "").startswith("sum_vjp")]
    (lift,) = lifts  # vectorised over (i, b), one (3, 2) value per point there, none per t
    assert lift.attrs["vdims"] == ("i", "b") and lift.type.shape == (1, 2, 3, 2)
    np.testing.assert_allclose(prog.run()["g"], want, rtol=2e-4, atol=2e-4)
    off = ctx.compile(bounds=bounds, outputs={"g": g}, config=tl.CompileConfig(contract=False))
    assert prog.memory.peak_bytes < off.memory.peak_bytes


def test_ppo_has_no_per_point_parameter_gradients():
    """In the RL program every parameter-sized value is per update (a point of (i, e, m)) or
    constant, never per sample, and the losses equal the program without the pass."""
    cfg = tl.rl.PPOConfig(hidden=8, update_epochs=2, num_minibatches=3)
    ctx = tl.Context(dims=cfg.DIMS)
    env = tl.rl.CartPole()
    tr = tl.rl.ppo(ctx, env, cfg)
    size = tl.rl.ActorCritic.for_env(env, 8).size
    bounds = cfg.bounds(ctx, 2, 3, 5)
    outs = {"loss": tr.loss, "theta": tr.params["theta"]}
    prog = ctx.compile(bounds=bounds, outputs=outs)
    big = [op for op in prog.sdg.ops.values() if size in op.type.shape]
    assert big and all({d.name for d in op.domain} <= {"i", "e", "m"} for op in big)
    # the program without the pass on the reference interpreter: no schedule, no XLA compile
    off = ctx.compile(bounds=bounds, outputs=outs,
                      config=tl.CompileConfig(contract=False, executor="reference"))
    a, b = prog.run(), off.run()
    for k in outs:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-5)


def test_not_applied_where_the_parameter_varies_along_the_range(executor):
    """A parameter over ``(i, b, t)`` gets one cotangent per point: nothing to contract."""
    spec = {"bounds": {"i": 2, "b": 2, "t": 3}, "param": DIMS, "recurrent": False,
            "executor": executor, "contract": True, "seed": 1}
    ctx, bounds, g, want = _build(spec)
    prog = ctx.compile(bounds=bounds, outputs={"g": g},
                       config=tl.CompileConfig(executor=executor))
    assert _contracted(prog) == 0
    np.testing.assert_allclose(prog.run()["g"], want, rtol=2e-4, atol=2e-4)


def _matmuls(hlo: str) -> int:
    return len(re.findall(r"= \S+ (?:dot|convolution)\(", hlo))


def test_the_forward_pass_runs_once_in_the_compiled_gradient():
    """An actor-critic's loss and its contracted parameter gradient, as PPO's minibatch step
    makes them: the forward op and the vjp that re-traces the forward are one XLA program, and
    the compiled program holds no more matmuls than ``jax.value_and_grad`` of the same loss (the
    forward once, then its transpose), with the same values."""
    net = tl.rl.ActorCritic(obs_dim=4, out=2, hidden=8)
    theta0 = net.init(0)
    obs = np.random.default_rng(3).normal(size=(16, 4)).astype(np.float32)

    def loss_of(theta, o):
        logits, value = net.policy(theta, o), net.value(theta, o)
        return jax.nn.logsumexp(logits) - logits[0] + 0.5 * value ** 2

    ctx = tl.Context(dims=("b",))
    with ctx:
        theta = tl.placeholder((net.size,), domain=())
        theta[()] = tl.constant(theta0)
        o = tl.from_array(obs, domain=ctx.dims)
        logits, value = tl.lift(net.policy)(theta, o), tl.lift(net.value)(theta, o)
        m = logits.max()
        first = (logits * tl.constant(np.asarray([1.0, 0.0], np.float32))).sum()
        loss = (tl.log(tl.exp(logits - m).sum()) + m) - first + 0.5 * value * value
        (g,) = tl.grad(loss, [theta])
        total = loss[0:ctx.bounds[0]].sum()
    prog = ctx.compile(bounds={ctx.bounds[0]: 16}, outputs={"loss": total, "g": g},
                       config=tl.CompileConfig(executor="xla"))
    res = prog.run()

    def batch_loss(theta):
        return jax.vmap(loss_of, (None, 0))(theta, obs).sum()
    want_loss, want_g = jax.value_and_grad(batch_loss)(theta0)
    np.testing.assert_allclose(res["loss"], want_loss, rtol=1e-5)
    np.testing.assert_allclose(res["g"], want_g, rtol=1e-4, atol=1e-6)
    plain = jax.jit(jax.value_and_grad(batch_loss)).lower(theta0).compile().as_text()
    assert _matmuls(prog.executable.prepared.hlo()) <= _matmuls(plain)
