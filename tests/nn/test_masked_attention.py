"""Attention over every token under a causal mask (``tl.nn.attention(masked=True)``): what a
training step reads when the whole sequence is known. Each point's attention then has one
shape, so the tokens batch into one masked attention (no loop over ``t``) and the gradients
of the keys and values contract over the tokens (batched ``vjp_sum`` of matmul) instead of a
(T, T, d) value summed afterwards. Checked against the reads over ``0:t+1`` and ``jax.grad``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tempo_lab as tl

T, D = 12, 8
CASES = {  # heads, kv_heads (0: a vector query), window
    "vector": (0, 0, None), "heads": (2, 2, None), "grouped": (4, 2, None),
    "window": (4, 2, 5),
}


def _program(case: str, masked: bool, executor: str):
    heads, kv, window = CASES[case]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, D)).astype(np.float32)
    hd = 4
    wq = rng.standard_normal((D, max(heads, 1) * hd)).astype(np.float32) * 0.5
    wk = rng.standard_normal((D, max(kv, 1) * hd)).astype(np.float32) * 0.5
    wv = rng.standard_normal((D, max(kv, 1) * hd)).astype(np.float32) * 0.5
    ctx = tl.Context(dims=("t",))
    (t,), (bound,) = ctx.dims, ctx.bounds
    with ctx:
        xs = tl.from_array(x, domain=(t,))
        ws = [tl.from_array(w, domain=()) for w in (wq, wk, wv)]
        q, k, v = (xs @ w for w in ws)
        if heads:
            q, k, v = q.reshape(heads, hd), k.reshape(kv, hd), v.reshape(kv, hd)
        o = tl.nn.attention(q, k, v, t, window, masked=masked)
        loss = (o * o).sum()
        grads = tl.grad(loss, ws)
    prog = ctx.compile(bounds={bound: T}, outputs={"o": o, **dict(zip("qkv", grads))},
                       config=tl.CompileConfig(executor=executor))
    return prog, (x, wq, wk, wv)


def _jax(case: str, x, wq, wk, wv):
    heads, kv, window = CASES[case]
    hd = 4

    def f(wq, wk, wv):
        q, k, v = x @ wq, x @ wk, x @ wv
        if heads:
            q = q.reshape(T, heads, hd)
            k = jnp.repeat(k.reshape(T, kv, hd), heads // kv, axis=1)
            v = jnp.repeat(v.reshape(T, kv, hd), heads // kv, axis=1)
        else:
            q, k, v = q[:, None], k[:, None], v[:, None]
        s = jnp.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
        pos = np.arange(T)
        keep = pos[None, :] <= pos[:, None]
        if window:
            keep &= pos[None, :] > pos[:, None] - window
        o = jnp.einsum("hts,shd->thd", jax.nn.softmax(jnp.where(keep, s, -jnp.inf), -1), v)
        o = o.reshape(T, -1) if heads else o[:, 0]
        return (o * o).sum(), o

    (_, o), g = jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True)(wq, wk, wv)
    return {"o": o, **dict(zip("qkv", g))}


@pytest.mark.executors(("reference", "xla"), reason="the interpreter and codegen run the same "
                       "ops as these two; this is about what the passes make of the reads")
@pytest.mark.parametrize("case", sorted(CASES))
def test_masked_attention_equals_the_causal_reads_and_jax(case, executor):
    prog, arrays = _program(case, True, executor)
    got = prog.run()
    want = _jax(case, *arrays)
    causal = _program(case, False, executor)[0].run()
    for key in ("o", "q", "k", "v"):
        np.testing.assert_allclose(np.asarray(got[key]), np.asarray(want[key]).reshape(
            np.shape(got[key])), rtol=2e-4, atol=2e-4, err_msg=key)
        np.testing.assert_allclose(np.asarray(got[key]), np.asarray(causal[key]).reshape(
            np.shape(got[key])), rtol=2e-4, atol=2e-4, err_msg=key)


def test_masked_attention_batches_the_tokens_and_contracts_its_gradients():
    """No op is left over ``t`` (it is vectorised whole), and no value holds a (T, T, d)
    per-token cotangent: the grouped heads' key and value gradients are batched matmuls."""
    prog, _ = _program("grouped", True, "xla")
    assert not any(op.domain for op in prog.sdg.ops.values()), [
        (op.label, op.domain) for op in prog.sdg.ops.values() if op.domain]
    biggest = max(np.prod(op.type.shape) for op in prog.sdg.ops.values())
    assert biggest <= T * T * 4, biggest  # the scores (T, kv, group, T), not (T, kv, d, T)
    causal, _ = _program("grouped", False, "xla")
    assert any(op.domain for op in causal.sdg.ops.values())  # the reads over 0:t+1 loop


def _known(ids_fed_back: bool) -> bool:
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    with ctx:
        if ids_fed_back:
            ids = tl.placeholder((), "int32", domain=(b, t))
        else:
            ids = tl.from_array(np.zeros((1, 8), np.int32), domain=(b, t))
        return tl.nn.tokens_known(ids + 1, t)


def test_tokens_known_only_for_a_sequence_given_whole():
    """``tl.nn.Llama`` masks attention when the ids are data, not when decoding feeds them back
    (a placeholder over ``t``), where reading every token would be a cycle."""
    assert _known(False) is True
    assert _known(True) is False


def test_a_llama_training_program_has_no_loop_over_tokens():
    m = tl.nn.Llama(vocab=64, embed=32, layers=2, heads=4, kv_heads=2, hidden=48)
    ids = np.random.default_rng(0).integers(0, 64, (1, 17))
    ctx = tl.Context(dims=("i", "b", "n", "t"))
    i, b, n, t = ctx.dims
    with ctx:
        p = tl.optim.parameters(m.init(seed=0), dim=i)
        params = {k: (tl.take(v, n) if k.startswith("layers.") else v) for k, v in p.items()}
        lg = m(params, tl.from_array(ids[:, :16], domain=(b, t)), t, n)
        top = lg.max()
        loss = tl.log(tl.exp(lg - top).sum()) + top - tl.take(
            lg, tl.from_array(ids[:, 1:], domain=(b, t)))
        tl.optim.Adam(lr=1e-2).minimize(loss, p)
    prog = ctx.compile(bounds=dict(zip(ctx.bounds, (3, 1, 2, 16))), outputs={"loss": loss})
    assert not any(t in op.domain for op in prog.sdg.ops.values())
    # every layer's weights taken by the layer's index, batched over the layers: the weights
    # themselves, not a copy (passes.vectorise._identity_takes)
    assert not [op.label for op in prog.sdg.ops.values()
                if op.kind == "take" and op.attrs.get("vdims") == ("n",)
                and len(op.type.shape) == 3]
    curve = prog.run()["loss"].mean(axis=(1, 2))
    assert curve[-1] < curve[0], curve


@pytest.mark.parametrize("k", [0, 1])
def test_a_batched_weight_read_at_every_point_contracts(k):
    """``a @ w`` with matrices and batch axes at each point, one of them read alike at every
    point: its gradient is one batched matmul over the points, equal to ``jax.grad``'s."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((6, 3, 2, 5)).astype(np.float32)   # (t, batch, m, n)
    w = rng.standard_normal((3, 5, 4)).astype(np.float32)      # (batch, n, p)
    if k == 0:  # the weight on the left: (batch, p, m) @ per-point (batch, m, n)
        a, w = rng.standard_normal((6, 3, 5, 2)).astype(np.float32), \
            rng.standard_normal((3, 4, 5)).astype(np.float32)
    ctx = tl.Context(dims=("t",))
    (t,), (bound,) = ctx.dims, ctx.bounds
    with ctx:
        x, y = tl.from_array(a, domain=(t,)), tl.from_array(w, domain=())
        out = (y @ x) if k == 0 else (x @ y)
        (g,) = tl.grad((tl.sin(out)).sum(), [y])
    prog = ctx.compile(bounds={bound: 6}, outputs={"g": g})
    # no weight-sized cotangent per point: (6, *w.shape) values summed afterwards
    assert all(tuple(op.type.shape) != (6, *w.shape) for op in prog.sdg.ops.values())
    f = (lambda w: jnp.sin(jnp.einsum("bpm,tbmn->tbpn", w, a)).sum()) if k == 0 else \
        (lambda w: jnp.sin(jnp.einsum("tbmn,bnp->tbmp", a, w)).sum())
    np.testing.assert_allclose(prog.run()["g"], jax.grad(f)(w), rtol=2e-4, atol=2e-4)
