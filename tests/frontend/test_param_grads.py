"""Parameter gradients of ordinary ops contracted over the points that read them
(``OpDef.vjp_sum``, frontend/autodiff.py): a weight read by ``x @ w`` or ``w @ x`` at every
token gets one matmul of the stacked activations with the cotangents, an embedding table read
by ``take`` one scatter-add, never a weight-sized value per token. Checked against ``jax.grad``
on random programs (which dims the parameters vary along, a recurrence along ``t``, ragged
lengths, ids outside the table, every executor), and on a Llama fine-tuning step's memory
plan."""
from __future__ import annotations

import itertools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rt_helpers import ALL, data_over

import tempo_lab as tl

DIMS = ("i", "b", "t")
VOCAB = 5
FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf"


def point_loss(w, table, v, x, idx):
    """The scalar loss at one point: an embedding row added to the input, a weight applied
    to the row (``x @ w``) and a weight applied to the result (``v @ y``)."""
    h = x + table[jnp.clip(idx, 0, VOCAB - 1)]
    y = jnp.tanh(h @ w)
    return (jnp.tanh(v @ y) ** 2).sum()


@st.composite
def programs(draw):
    bounds = {d: draw(st.integers(1, 3)) for d in DIMS}
    return {"bounds": bounds, "param": tuple(d for d in DIMS if draw(st.booleans())),
            "recurrent": draw(st.booleans()), "ragged": draw(st.booleans()),
            "executor": draw(st.sampled_from(ALL)), "seed": draw(st.integers(0, 2**16))}


def _build(spec):
    rng = np.random.default_rng(spec["seed"])
    n = [spec["bounds"][d] for d in DIMS]
    X = rng.normal(size=(*n, 3)).astype(np.float32)
    ids = rng.integers(-1, VOCAB + 1, n).astype(np.int32)  # some outside the table: clamped
    pshape = [spec["bounds"][d] for d in spec["param"]]
    init = {"w": rng.normal(size=(*pshape, 3, 2)), "table": rng.normal(size=(*pshape, VOCAB, 3)),
            "v": rng.normal(size=(*pshape, 4, 2))}
    init = {k: a.astype(np.float32) for k, a in init.items()}
    ctx = tl.Context(dims=DIMS)
    dims = dict(zip(DIMS, ctx.dims))
    i, b, t = ctx.dims
    with ctx:
        x, X = data_over(ctx, X, spec["recurrent"])
        pdom = tuple(dims[d] for d in spec["param"])
        ps = {}
        for k, a in init.items():
            ps[k] = tl.placeholder(a.shape[len(pdom):], domain=pdom, name=k)
            ps[k][pdom] = tl.from_array(a, domain=pdom) if pdom else tl.constant(a)
        h = x + tl.take(ps["table"], tl.from_array(ids, domain=ctx.dims))
        y = tl.tanh(h @ ps["w"])
        loss = (tl.tanh(ps["v"] @ y) ** 2).sum()
        grads = tl.grad(loss, [ps["w"], ps["table"], ps["v"]])
    bounds = dict(zip(ctx.bounds, n))
    lengths = None
    if spec["ragged"]:
        lengths = rng.integers(1, n[2] + 1, n[1])
        lengths[0] = n[2]  # the longest is the arrays' length
        bounds[ctx.bounds[2]] = tl.lengths(lengths, over=b)
    return ctx, bounds, grads, _expected(spec, X, ids, init, lengths)


def _expected(spec, X, ids, init, lengths):
    """``jax.grad`` of the loss at every point (of each instance's own length), summed over
    the dims the parameters lack."""
    n = [spec["bounds"][d] for d in DIMS]
    grad = jax.grad(point_loss, argnums=(0, 1, 2))
    want = [np.zeros(a.shape, np.float32) for a in init.values()]
    for point in itertools.product(*map(range, n)):
        if lengths is not None and point[2] >= lengths[point[1]]:
            continue
        at = tuple(p for d, p in zip(DIMS, point) if d in spec["param"])
        gs = grad(*(a[at] for a in init.values()), X[point], ids[point])
        for acc, g in zip(want, gs):
            acc[at] += np.asarray(g)
    return want


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(programs())
def test_gradients_equal_jax_grad(spec):
    ctx, bounds, grads, want = _build(spec)
    prog = ctx.compile(bounds=bounds, outputs={k: g for k, g in zip("wtv", grads)},
                       config=tl.CompileConfig(executor=spec["executor"]))
    res = prog.run()
    for k, w in zip("wtv", want):
        np.testing.assert_allclose(np.asarray(res[k]), w, rtol=2e-4, atol=2e-4, err_msg=k)


def test_the_table_gradient_is_one_scatter_add_and_the_weights_one_matmul():
    spec = {"bounds": dict.fromkeys(DIMS, 2), "param": ("i",), "recurrent": False,
            "ragged": False, "executor": "reference", "seed": 0}
    ctx, bounds, grads, want = _build(spec)
    prog = ctx.compile(bounds=bounds, outputs={"w": grads[0], "t": grads[1], "v": grads[2]})
    kinds = [op.kind for op in prog.sdg.ops.values()]
    assert "scatter_add" in kinds and "embed" not in kinds, kinds


def test_a_llama_fine_tuning_step_holds_no_weight_sized_value_per_token():
    """At vocab 512, width 64 and 32 tokens, the embedding's gradient per token was a
    (512, 64) value stored for every token (4 MiB here, 250 GiB at 1B widths); contracted,
    the plan's largest store is a weight or its gradient."""
    m = tl.nn.Llama(vocab=512, embed=64, layers=2, heads=2, kv_heads=1, hidden=96)
    w = m.init(seed=0)
    T = 32
    ids = np.random.default_rng(0).integers(0, 512, (2, 1, T + 1))
    ctx = tl.Context(dims=("i", "b", "t", "n"))
    i, b, t, n = ctx.dims
    with ctx:
        p = tl.optim.parameters(w, dim=i)
        params = {k: (tl.take(v, n) if k.startswith("layers.") else v) for k, v in p.items()}
        lg = m(params, tl.from_array(ids[:, :, :T], domain=(i, b, t)), t, n)
        mx = lg.max()
        loss = tl.log(tl.exp(lg - mx).sum()) + mx - tl.take(
            lg, tl.from_array(ids[:, :, 1:], domain=(i, b, t)))
        tl.optim.Adam(lr=1e-3).minimize(loss, p)
    prog = ctx.compile(bounds=dict(zip(ctx.bounds, (2, 1, T, 2))), outputs={"loss": loss})
    table = 512 * 64 * 4
    stores = prog.memory.store_bytes(dict(zip(ctx.bounds, (2, 1, T, 2))))
    assert max(stores.values()) <= 2 * table, sorted(stores.values())[-5:]
    assert np.isfinite(prog.run()["loss"]).all()


def _tiny_fine_tuning(dims: tuple[str, str, str, str]):
    """A 2-layer Llama of width 32 fine-tuned with Adam on 8 tokens over ``dims`` (the
    iteration, batch, token and layer dims, in the context's order), the same batch at every
    iteration: the context and the per-token loss."""
    m = tl.nn.Llama(vocab=64, embed=32, layers=2, heads=2, kv_heads=1, hidden=48)
    ids = np.random.default_rng(0).integers(0, 64, (1, 9))
    ctx = tl.Context(dims=dims)
    named = dict(zip(dims, ctx.dims))
    i, b, t, n = (named[k] for k in ("i", "b", "t", "n"))
    with ctx:
        p = tl.optim.parameters(m.init(seed=0), dim=i)
        params = {k: (tl.take(v, n) if k.startswith("layers.") else v) for k, v in p.items()}
        lg = m(params, tl.from_array(ids[:, :8], domain=(b, t)), t, n)
        top = lg.max()
        loss = tl.log(tl.exp(lg - top).sum()) + top - tl.take(
            lg, tl.from_array(ids[:, 1:], domain=(b, t)))
        tl.optim.Adam(lr=1e-2).minimize(loss, p)
    return ctx, loss


def test_weights_over_iterations_and_ids_without_them_train():
    """Token ids over (b, t), the weights over the iteration dim i: the model's values vary
    over i too (it was a DefinitionError whose advice pointed the wrong way)."""
    ctx, loss = _tiny_fine_tuning(("i", "b", "t", "n"))
    i, b, t, _ = ctx.dims
    assert tuple(loss.domain) == (i, b, t)
    curve = ctx.compile(bounds=dict(zip(ctx.bounds, (4, 1, 8, 2))),
                        outputs={"loss": loss}).run()["loss"].mean(axis=(1, 2))
    assert curve[-1] < 0.5 * curve[0], curve


@pytest.mark.parametrize("name", ["llama3_tied", "qwen2_bias", "mistral_window", "gpt2_tiny"])
def test_a_checkpoint_fine_tunes_as_docs_training_says(name):
    """docs/training.md's fine-tuning program on each architecture's fixture checkpoint: the
    layer dim outside the token dim, one batch every iteration; its loss falls."""
    model, weights = tl.nn.AutoModel.from_pretrained(FIXTURES / name)
    ids = np.random.default_rng(0).integers(0, model.vocab, (1, 13))
    ctx = tl.Context(dims=("i", "b", "n", "t"))
    i, b, n, t = ctx.dims
    with ctx:
        p = tl.optim.parameters(weights, dim=i)
        params = {k: tl.take(v, n) if k.startswith("layers.") else v for k, v in p.items()}
        logits = model(params, tl.from_array(ids[:, :-1], domain=(b, t)), t, n)
        top = logits.max()
        ce = tl.log(tl.exp(logits - top).sum()) + top - tl.take(
            logits, tl.from_array(ids[:, 1:], domain=(b, t)))
        tl.optim.Adam(lr=1e-2).minimize(ce, p)
    curve = ctx.compile(bounds={"I": 5, "B": 1, "N": model.layers, "T": 12},
                        outputs={"ce": ce}).run()["ce"].mean(axis=(1, 2))
    assert np.isfinite(curve).all() and curve[-1] < 0.8 * curve[0], curve


def test_a_layers_weights_are_taken_where_each_pass_reads_them_not_held_between():
    """Fine-tuning with the layer dim outside the tokens: a layer's weights, taken at the
    layer's index, are read by its forward and its backward pass. One take read by both was
    a store of every layer's weights held from the one to the other (a second copy of them);
    each pass now takes them itself, a value of its step. The losses stay the reference's."""
    ctx, loss = _tiny_fine_tuning(("i", "b", "n", "t"))
    prog = ctx.compile(bounds=dict(zip(ctx.bounds, (3, 1, 2, 8))), outputs={"loss": loss},
                       config=tl.CompileConfig(executor="xla"))
    plan = prog.executable.prepared.plan
    weights = {k for k, op in plan.sdg.ops.items() if (op.name or "").startswith("layers.")
               and op.kind == "merge"}
    held = [plan.sdg.ops[k].label for k in plan.shapes if plan.sdg.ops[k].kind == "take"
            and plan.sdg.in_edges(k)[0].src in weights]
    assert not held, held
    np.testing.assert_allclose(prog.run()["loss"], prog.on("reference").run()["loss"],
                               rtol=1e-4, atol=1e-5)
