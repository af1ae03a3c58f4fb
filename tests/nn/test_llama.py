"""``tl.nn.Llama`` (layers as a dim, grouped-query attention, RoPE, SwiGLU, tied head) against
its plain-JAX twin in ``benchmarks.llama``: logits on every executor, greedy and sampled
generation, a gradient against ``jax.grad``, and errors (checkpoints: ``test_checkpoint``)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from rt_helpers import DISTINCT

import tempo_lab as tl
from benchmarks import llama as twin

B, T, P = 2, 7, 3
MODEL = tl.nn.Llama(vocab=23, embed=16, layers=2, heads=4, kv_heads=2, hidden=24)
pytestmark = pytest.mark.executors(DISTINCT, reason="for time: a model of several layers")


def params(model=MODEL, seed=0):
    """Init moved off its unit norm scales so every entry matters."""
    g = np.random.default_rng(seed + 100)
    return {k: (v + 0.2 * g.standard_normal(v.shape)).astype(np.float32)
            for k, v in model.init(seed).items()}


def ids(seed=1, vocab=MODEL.vocab):
    return np.random.default_rng(seed).integers(0, vocab, (B, T)).astype(np.int32)


def context():
    ctx = tl.Context(dims=("b", "n", "t"))
    return (ctx, *ctx.dims, *ctx.bounds)


@pytest.mark.parametrize("window", [None, 3])
def test_logits_match_the_jax_twin(executor, window):
    model = tl.nn.Llama(23, 16, 2, 4, 2, 24, window=window, tied=window is None)
    p, tok = params(model), ids()
    ctx, b, n, t, BB, N, TT = context()
    with ctx:
        logits = model(p, tl.from_array(tok, domain=(b, t)), t, n)
    res = ctx.compile(bounds={BB: B, N: model.layers, TT: T}, outputs={"logits": logits},
                      config=tl.CompileConfig(executor=executor)).run()
    want = np.asarray(jax.jit(lambda: twin.forward(p, tok, model))())
    np.testing.assert_allclose(res["logits"], want, rtol=2e-4, atol=2e-4)


def test_cached_step_of_the_twin_equals_its_whole_sequence_forward():
    """The baselines' cached step is the same function as the check."""
    p, tok = params(), ids()
    pd, caches = twin.device_params(p, MODEL), twin.empty_caches(MODEL, B, T)
    out = []
    for s in range(T):
        lg, caches = twin.step(pd, caches, tok[:, s], s, MODEL)
        out.append(lg)
    np.testing.assert_allclose(np.stack(out, 1), twin.forward(p, tok, MODEL), rtol=1e-4,
                               atol=1e-4)


def _generate(temperature, seed=0, executor="xla"):
    p = params()
    prompts = ids()[:, :P]
    ctx, b, n, t, BB, N, TT = context()
    with ctx:
        out, logits = MODEL.generate(p, tl.from_array(prompts, domain=(b,)), t, n,
                                     temperature=temperature, seed=seed)
    res = ctx.compile(bounds={BB: B, N: MODEL.layers, TT: T},
                      outputs={"ids": out, "logits": logits},
                      config=tl.CompileConfig(executor=executor)).run()
    return p, prompts, res["ids"], res["logits"]


def test_greedy_generation_matches_a_jax_greedy_loop(executor):
    p, prompts, got, _ = _generate(0.0, executor=executor)
    pd, caches = twin.device_params(p, MODEL), twin.empty_caches(MODEL, B, T)
    want, tok = [], prompts[:, 0]
    for s in range(T):
        want.append(np.asarray(tok))
        lg, caches = twin.step(pd, caches, tok, s, MODEL)
        tok = prompts[:, s + 1] if s + 1 < P else jnp.argmax(lg, -1).astype(jnp.int32)
    np.testing.assert_array_equal(got, np.stack(want, 1))


def test_sampled_generation_is_keyed_by_its_seed_and_consistent_with_its_logits():
    p, prompts, a, logits = _generate(1.0, seed=3)
    _, _, a2, _ = _generate(1.0, seed=3)
    _, _, c, _ = _generate(1.0, seed=4)
    _, _, cold, _ = _generate(1e-4, seed=3)
    _, _, greedy, _ = _generate(0.0)
    np.testing.assert_array_equal(a, a2)
    assert (a[:, P:] != c[:, P:]).any(), "another seed should sample other tokens"
    np.testing.assert_array_equal(a[:, :P], prompts)
    np.testing.assert_array_equal(cold, greedy)
    # the logits returned are those of the tokens it fed (teacher forcing on its own output)
    np.testing.assert_allclose(logits, twin.forward(p, a, MODEL), rtol=2e-4, atol=2e-4)


def test_gradient_of_a_next_token_loss_matches_jax_grad():
    """d loss / d (layer weights over n, embedding) with loss = -sum log p(next token)."""
    p, tok = params(), ids()
    keys = ("layers.attn.wk", "layers.mlp.w_up", "embed.w")
    ctx, b, n, t, BB, N, TT = context()
    with ctx:
        ps = dict(p)
        ps["layers.attn.wk"] = tl.from_array(p["layers.attn.wk"], domain=(n,), name="wk")
        ps["layers.mlp.w_up"] = tl.from_array(p["layers.mlp.w_up"], domain=(n,), name="w_up")
        ps["embed.w"] = tl.from_array(p["embed.w"], domain=(), name="emb")
        target = tl.from_array(np.roll(tok, -1, axis=1), domain=(b, t))
        logits = MODEL(ps, tl.from_array(tok, domain=(b, t)), t, n)
        top = logits.max(axis=-1)
        logp = logits - top.expand_dims(-1) - tl.log(
            tl.exp(logits - top.expand_dims(-1)).sum(axis=-1)).expand_dims(-1)
        picked = (logp * tl.eq(target.expand_dims(-1), tl.arange(MODEL.vocab))).sum()
        loss = -picked[b, 0:T - 1].sum()[0:B].sum()
        grads = tl.grad(loss, [ps[k] for k in keys])
    outs = {k.replace(".", "_"): (g[0:N] if k.startswith("layers") else g)
            for k, g in zip(keys, grads)}
    res = ctx.compile(bounds={BB: B, N: MODEL.layers, TT: T}, outputs=outs).run()

    def jloss(sub):
        q = {**p, **sub}
        lg = jax.nn.log_softmax(twin.forward(q, tok, MODEL), -1)[:, :-1]
        return -jnp.take_along_axis(lg, tok[:, 1:, None], -1).sum()

    want = jax.grad(jloss)({k: jnp.asarray(p[k]) for k in keys})
    for k in keys:
        np.testing.assert_allclose(res[k.replace(".", "_")], want[k], rtol=2e-3, atol=2e-4,
                                   err_msg=k)


def test_errors_name_the_problem():
    with pytest.raises(tl.ShapeError, match="kv_heads 3"):
        tl.nn.Llama(23, 16, 2, 4, 3, 24)
    ctx, b, n, t, *_ = context()
    p = params()
    with ctx:
        x = tl.from_array(ids(), domain=(b, t))
        with pytest.raises(tl.DTypeError, match="int token id"):
            MODEL(p, x.astype("float32"), t, n)
        with pytest.raises(tl.ShapeError, match="layer dim"):
            MODEL(p, tl.from_array(ids()[:, :2], domain=(b, n)), t, n)
        with pytest.raises(tl.ShapeError, match="stack the 2 layers"):
            MODEL({**p, "layers.attn.wq": p["layers.attn.wq"][0]}, x, t, n)
        with pytest.raises(tl.ShapeError, match="prompt"):
            MODEL.generate(p, x, t, n)
        with pytest.raises(tl.ArgumentError, match="temperature must be a finite number >= 0"):
            tl.nn.sample(MODEL(p, x, t, n), temperature=-1.0)
        with pytest.raises(tl.DTypeError, match="floating logits"):
            tl.nn.sample(x.expand_dims(-1))
        with pytest.raises(tl.ShapeError, match="must not vary over the step dim"):
            MODEL.generate(p, tl.from_array(ids()[:, :, None], domain=(b, t)), t, n)


def test_the_benchmark_check_accepts_a_greedy_decode_and_rejects_another_token():
    p, prompt = params(), ids()[:, :P]
    got = np.asarray(jax.jit(twin.scan_decode(MODEL, T))(jnp.asarray(prompt),
                                                         twin.device_params(p, MODEL)))
    assert twin.check(MODEL, p, prompt, got) == 0.0
    _, _, ours, _ = _generate(0.0)
    np.testing.assert_array_equal(ours, got)
    bad = got.copy()
    bad[0, -1] = (bad[0, -1] + 1) % MODEL.vocab
    assert twin.check(MODEL, p, prompt, bad) > 1e-3
    with pytest.raises(ValueError, match="prompt"):
        twin.check(MODEL, p, prompt[:, ::-1], got)
