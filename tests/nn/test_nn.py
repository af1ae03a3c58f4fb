"""``tl.nn`` against plain JAX implementations written here with the same parameters: forward
values of every module on the reference interpreter and the default executor, a gradient through
a transformer block against ``jax.grad``, deterministic init, and errors for wrong sizes."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tempo_lab as tl

CONFIGS = {"reference": tl.CompileConfig(executor="reference"), "default": tl.CompileConfig()}
T, E, H, HID, V = 6, 8, 2, 12, 5


@pytest.fixture(params=list(CONFIGS))
def config(request):
    return CONFIGS[request.param]


def rnd(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).normal(size=shape) * scale).astype(np.float32)


def perturbed(params, seed=1):
    """Parameters moved off their init (norm scales are 1 there) so every entry matters."""
    return {k: (v + rnd(*v.shape, seed=seed + i, scale=0.3)).astype(np.float32)
            for i, (k, v) in enumerate(sorted(params.items()))}


def ctx_t():
    ctx = tl.Context(dims=("t",))
    return ctx, ctx.dims[0], ctx.bounds[0]


def assert_close(res, want, rtol=2e-4, atol=2e-5):
    for name, w in want.items():
        got = res[name]
        assert got.shape == np.shape(w), (name, got.shape, np.shape(w))
        np.testing.assert_allclose(got, np.asarray(w), rtol=rtol, atol=atol, err_msg=name)


# -- plain JAX references -----------------------------------------------------------------------
def j_rms(x, s, eps=1e-6):
    return x / jnp.sqrt((x * x).mean(-1, keepdims=True) + eps) * s


def j_layernorm(x, s, b, eps=1e-5):
    c = x - x.mean(-1, keepdims=True)
    return c / jnp.sqrt((c * c).mean(-1, keepdims=True) + eps) * s + b


def j_swiglu(p, x, pre=""):
    return (jax.nn.silu(x @ p[pre + "w_gate"]) * (x @ p[pre + "w_up"])) @ p[pre + "w_down"]


def j_rope(x, pos, base=10000.0):
    """x: (T, ..., d); pos: (T,) positions."""
    half = x.shape[-1] // 2
    ang = jnp.asarray(pos, jnp.float32)[:, None] * base ** (-jnp.arange(half) / half)
    ang = ang.reshape((x.shape[0],) + (1,) * (x.ndim - 2) + (half,))
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * jnp.cos(ang) - x2 * jnp.sin(ang),
                            x2 * jnp.cos(ang) + x1 * jnp.sin(ang)], -1)


def j_attend(q, k, v, window=None):
    """q, k: (T, heads, d), v: (T, heads, dv) -> (T, heads, dv), causal or windowed."""
    n = q.shape[0]
    i = jnp.arange(n)
    mask = i[None, :] <= i[:, None]
    if window is not None:
        mask &= i[None, :] > i[:, None] - window
    s = jnp.einsum("qhd,khd->hqk", q, k) / jnp.sqrt(q.shape[-1])
    p = jax.nn.softmax(jnp.where(mask[None], s, -jnp.inf), axis=-1)
    return jnp.einsum("hqk,khd->qhd", p, v)


def j_mha(p, x, heads, window=None, rope=False, pre=""):
    """x: (T, embed) for one sequence."""
    n, e = x.shape
    q, k, v = ((x @ p[pre + w]).reshape(n, heads, e // heads) for w in ("wq", "wk", "wv"))
    if rope:
        q, k = j_rope(q, jnp.arange(n)), j_rope(k, jnp.arange(n))
    return j_attend(q, k, v, window).reshape(n, e) @ p[pre + "wo"]


def j_block(p, x, heads, window=None, rope=False):
    h = x + j_mha(p, j_rms(x, p["norm1.scale"]), heads, window, rope, pre="attn.")
    return h + j_swiglu(p, j_rms(h, p["norm2.scale"]), pre="mlp.")


# -- forward values ---------------------------------------------------------------------------------
def test_layers_match_jax(config):
    X, ids = rnd(T, E), np.array([0, 3, 4, 1, 3, 2], np.int32)
    lin, lin0 = tl.nn.Linear(E, 4), tl.nn.Linear(E, 4, bias=False)
    mlp = tl.nn.MLP((E, HID, 3), activation="gelu")
    emb, rms, ln = tl.nn.Embedding(V, E), tl.nn.RMSNorm(E), tl.nn.LayerNorm(E)
    glu = tl.nn.SwiGLU(E, HID)
    P = {name: perturbed(m.init(k), seed=10 * k) for k, (name, m) in enumerate(
        [("lin", lin), ("lin0", lin0), ("mlp", mlp), ("emb", emb), ("rms", rms), ("ln", ln),
         ("glu", glu)])}
    ctx, t, TT = ctx_t()
    with ctx:
        x = tl.from_array(X, domain=(t,))
        tok = tl.from_array(ids, domain=(t,))
        out = {"lin": lin(P["lin"], x), "lin0": lin0(P["lin0"], x), "mlp": mlp(P["mlp"], x),
               "emb": emb(P["emb"], tok), "rms": rms(P["rms"], x), "ln": ln(P["ln"], x),
               "glu": glu(P["glu"], x),
               "rope_t": tl.nn.rope(x.reshape(H, E // H), t),
               "rope_tok": tl.nn.rope(x, tok)}
    res = ctx.compile(bounds={TT: T}, outputs=out, config=config).run()
    p = P["mlp"]
    want = jax.jit(lambda: {
        "lin": X @ P["lin"]["w"] + P["lin"]["b"], "lin0": X @ P["lin0"]["w"],
        "mlp": jax.nn.gelu(X @ p["0.w"] + p["0.b"], approximate=True) @ p["1.w"] + p["1.b"],
        "emb": P["emb"]["w"][ids], "rms": j_rms(X, P["rms"]["scale"]),
        "ln": j_layernorm(X, P["ln"]["scale"], P["ln"]["bias"]), "glu": j_swiglu(P["glu"], X),
        "rope_t": j_rope(X.reshape(T, H, E // H), np.arange(T)), "rope_tok": j_rope(X, ids),
    })()
    assert_close(res, want)


def test_attention_over_batch_and_time_matches_jax(config):
    """Causal and window reads along t with b read at the current point; rope on q and k."""
    nb = 2
    X = rnd(nb, T, E, seed=3)
    causal = tl.nn.MultiHeadAttention(E, H)
    windowed = tl.nn.MultiHeadAttention(E, H, window=3, rope=True)
    Pc, Pw = causal.init(1), windowed.init(2)
    Q, K, Vv = rnd(nb, T, E // H, seed=4), rnd(nb, T, E // H, seed=5), rnd(nb, T, 3, seed=6)
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, TT = ctx.bounds
    with ctx:
        x = tl.from_array(X, domain=(b, t))
        q, k, v = (tl.from_array(a, domain=(b, t)) for a in (Q, K, Vv))
        out = {"causal": causal(Pc, x, t), "window": windowed(Pw, x, t),
               "single": tl.nn.attention(q, k, v, t, window=2)}
    res = ctx.compile(bounds={B: nb, TT: T}, outputs=out, config=config).run()
    want = jax.jit(lambda: {"causal": jnp.stack([j_mha(Pc, X[i], H) for i in range(nb)]),
            "window": jnp.stack([j_mha(Pw, X[i], H, window=3, rope=True) for i in range(nb)]),
            "single": jnp.stack([j_attend(Q[i][:, None], K[i][:, None], Vv[i][:, None], 2)[:, 0]
                                 for i in range(nb)])})()
    assert_close(res, want, rtol=1e-4, atol=1e-5)


def test_transformer_block_matches_jax(config):
    X = rnd(T, E, seed=7)
    blk = tl.nn.TransformerBlock(E, H, HID, window=4, rope=True)
    P = perturbed(blk.init(3))
    ctx, t, TT = ctx_t()
    with ctx:
        y = blk(P, tl.from_array(X, domain=(t,)), t)
    res = ctx.compile(bounds={TT: T}, outputs={"y": y}, config=config).run()
    assert_close(res, jax.jit(lambda: {"y": j_block(P, X, H, window=4, rope=True)})(), rtol=1e-4, atol=1e-5)


# -- gradients --------------------------------------------------------------------------------------
def test_block_gradient_matches_jax_grad():
    """d/d(params, x) of a loss through windowed attention with rope + SwiGLU + RMSNorm, on both
    executors."""
    X = rnd(T, E, seed=8)
    blk = tl.nn.TransformerBlock(E, H, HID, window=3, rope=True)
    P = perturbed(blk.init(4))
    names = sorted(P)
    ctx, t, TT = ctx_t()
    with ctx:
        x = tl.from_array(X, domain=(t,))
        ps = tl.nn.as_tensors(P)
        loss = tl.tanh(blk(ps, x, t)).sum()
        grads = tl.grad(loss, [ps[k] for k in names] + [x])
    outputs = {f"g{i}": g for i, g in enumerate(grads)}

    def f(*args):
        return jnp.tanh(j_block(dict(zip(names, args[:-1])), args[-1], H, 3, True)).sum()
    want = jax.jit(jax.grad(f, argnums=tuple(range(len(names) + 1))))(*[P[k] for k in names], X)
    want = {f"g{i}": w for i, w in enumerate(want)}
    for config in CONFIGS.values():
        res = ctx.compile(bounds={TT: T}, outputs=outputs, config=config).run()
        assert_close(res, want, rtol=1e-3, atol=1e-4)


def test_embedding_layernorm_mlp_gradients_match_jax_grad():
    """The one-hot matmul gives the table's gradient: rows of unused ids stay zero."""
    ids = np.array([0, 3, 3, 1, 0, 2], np.int32)
    emb, ln, mlp = tl.nn.Embedding(V, E), tl.nn.LayerNorm(E), tl.nn.MLP((E, HID, 2), "tanh")
    P = {**{"emb." + k: v for k, v in emb.init(0).items()},
         **{"ln." + k: v for k, v in perturbed(ln.init(0)).items()},
         **{"mlp." + k: v for k, v in mlp.init(1).items()}}
    names = sorted(P)
    ctx, t, TT = ctx_t()
    with ctx:
        ps = tl.nn.as_tensors(P)
        h = emb(tl.nn.params.sub(ps, "emb"), tl.from_array(ids, domain=(t,)))
        y = mlp(tl.nn.params.sub(ps, "mlp"), ln(tl.nn.params.sub(ps, "ln"), h))
        grads = tl.grad((y * y).sum(), [ps[k] for k in names])

    def f(*args):
        p = dict(zip(names, args))
        h = j_layernorm(p["emb.w"][ids], p["ln.scale"], p["ln.bias"])
        y = jnp.tanh(h @ p["mlp.0.w"] + p["mlp.0.b"]) @ p["mlp.1.w"] + p["mlp.1.b"]
        return (y * y).sum()
    want = jax.jit(jax.grad(f, argnums=tuple(range(len(names)))))(*[P[k] for k in names])
    res = ctx.compile(bounds={TT: T}, outputs={f"g{i}": g for i, g in enumerate(grads)},
                      config=CONFIGS["reference"]).run()
    assert_close(res, {f"g{i}": w for i, w in enumerate(want)}, rtol=1e-3, atol=1e-4)
    assert not res[f"g{names.index('emb.w')}"][4].any()


def test_parameters_over_an_iteration_dim():
    """Parameters given per iteration (as an optimiser produces them) are used point by point."""
    n = 3
    lin = tl.nn.Linear(E, 2)
    W, Bb = rnd(n, E, 2, seed=1), rnd(n, 2, seed=2)
    X = rnd(4, E, seed=3)
    ctx = tl.Context(dims=("i",))
    (i,), (NI,) = ctx.dims, ctx.bounds
    with ctx:
        y = lin(tl.nn.as_tensors({"w": W, "b": Bb}, domain=(i,)), tl.constant(X))
    res = ctx.compile(bounds={NI: n}, outputs={"y": y}, config=CONFIGS["reference"]).run()
    assert_close(res, {"y": np.einsum("xe,neo->nxo", X, W) + Bb[:, None]})


# -- init -------------------------------------------------------------------------------------------
def test_init_is_deterministic_and_named():
    blk = tl.nn.TransformerBlock(16, 4, 32)
    a, b, c = blk.init(0), blk.init(0), blk.init(1)
    assert sorted(a) == ["attn.wk", "attn.wo", "attn.wq", "attn.wv", "mlp.w_down", "mlp.w_gate",
                         "mlp.w_up", "norm1.scale", "norm2.scale"]
    assert all(np.array_equal(a[k], b[k]) and a[k].dtype == np.float32 for k in a)
    assert not np.array_equal(a["attn.wq"], c["attn.wq"])
    assert not np.array_equal(a["attn.wq"], a["attn.wk"])
    assert sorted(tl.nn.MLP((3, 5, 2)).init(0)) == ["0.b", "0.w", "1.b", "1.w"]
    w = tl.nn.Linear(400, 300).init(0)["w"]
    assert abs(w.std() - 1 / np.sqrt(400)) < 0.002


# -- errors -----------------------------------------------------------------------------------------
def _raises(cls, fn):
    """``fn()`` raises ``cls`` with a message that starts at the caller's line in this file."""
    with pytest.raises(cls) as info:
        fn()
    loc = info.value.loc
    assert os.path.basename(loc.file) == "test_nn.py", str(info.value)
    assert str(info.value).startswith(f"{loc.file}:{loc.line}: "), str(info.value)
    return str(info.value)


def test_wrong_sizes_raise_clear_errors():
    ctx, t, TT = ctx_t()
    lin, attn = tl.nn.Linear(3, 4), tl.nn.MultiHeadAttention(E, H)
    with ctx:
        x = tl.from_array(rnd(T, 5), domain=(t,))
        xe = tl.from_array(rnd(T, E), domain=(t,))
        msg = _raises(tl.ShapeError, lambda: lin(lin.init(0), x))
        assert "size 3" in msg and "(5,)" in msg
        assert "w" in _raises(tl.ShapeError, lambda: lin({"w": np.zeros((5, 4)), "b": 0}, x[t, :3]))
        assert "'b'" in _raises(tl.nn.ParamError, lambda: lin({"w": np.zeros((3, 4))}, x[t, :3]))
        _raises(tl.ShapeError, lambda: tl.nn.RMSNorm(4)({"scale": np.ones(4)}, x))
        _raises(tl.ShapeError, lambda: attn(attn.init(0), x, t))
        _raises(tl.DTypeError, lambda: tl.nn.Embedding(V, E)(tl.nn.Embedding(V, E).init(0), x))
        _raises(tl.ShapeError, lambda: tl.nn.rope(x, t))
        c = tl.constant(rnd(2, 4))
        _raises(tl.ShapeError, lambda: tl.nn.attention(xe.reshape(2, 4), c, c, t))
        _raises(tl.ExprError, lambda: tl.nn.attention(xe, xe, xe, t, window=0))
    with pytest.raises(tl.ShapeError):
        tl.nn.MultiHeadAttention(10, 3)


def test_embedding_gives_zeros_outside_the_vocabulary(executor):
    """One id per point reads a row (tl.take); several per point a one-hot matmul; both give a
    zero vector for an id outside [0, vocab), as NumPy does below."""
    emb = tl.nn.Embedding(V, E)
    P = emb.init(0)
    one, many = np.array([0, 7, -2, 4, 3, 5], np.int32), np.array([[1, -1], [5, 2]] * 3, np.int32)
    ctx, t, TT = ctx_t()
    with ctx:
        out = {"one": emb(P, tl.from_array(one, domain=(t,))),
               "many": emb(P, tl.from_array(many, domain=(t,)))}
    res = ctx.compile(bounds={TT: T}, outputs=out,
                      config=tl.CompileConfig(executor=executor)).run()

    def rows(ids):
        return np.where(((ids >= 0) & (ids < V))[..., None], P["w"][np.clip(ids, 0, V - 1)], 0)

    assert_close(res, {"one": rows(one), "many": rows(many)})
