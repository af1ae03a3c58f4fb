"""Auto-batching of per-instance control flow (the ACRoBat capability) at CPU scale.

    python -m benchmarks.autobatch [--quick] [--models birnn berxit] [--batch 64]
        [--seq-len 64] [--hidden 128] [--runs 9] [--phases]
        [--out benchmarks/results/autobatch.json]

Models, each on ``--batch`` instances whose work differs per instance:

- ``birnn``: a bidirectional tanh RNN over sequences with lengths uniform in ``[T/8, T]``; each
  instance's output is a linear read-out of its forward state at its own last step and its
  backward state at step 0. tempo_lab: ``bounds={T: tl.lengths(lengths, over=b)}``.
- ``treelstm``: a binary TreeLSTM over random binary trees; tempo_lab batches it level by level
  (``tl.nn.tree_levels``: a loop over steps, the slots of a step at once).
- ``berxit``: a stack of up to ``--layers`` residual MLP layers with an exit classifier after
  each; an instance leaves at the first layer whose classifier is confident (max softmax >
  ``--threshold``), and its output is that layer's logits. tempo_lab:
  ``bounds={L: tl.until(confident, max=layers)}`` with ``confident`` over ``(b, l)``.

Systems: ``tempo_lab`` (the default CompileConfig and executor); ``jax_padded`` (pad to the
longest instance, mask, one ``jax.jit`` of a ``lax.scan`` over the padded steps, the batch in
one array); ``jax_per_instance`` (one jitted call per instance -- per step for berxit, whose
exit is a host decision -- the DyNet-like baseline, every instance shape compiled before
timing). With ``--bucketed``, birnn is also timed sorted into 4 length buckets in plain JAX
(``jax_bucketed``), to measure what compaction could gain, and treelstm on the same level
layout as tempo_lab's in plain JAX (``jax_levels``). Every system's outputs are checked
against a NumPy per-instance reference before anything is timed; then all are timed in one
process, taking turns (``TIMING``).

Records: ``{"model", "system", "batch", "seq_len" | "layers", "hidden", "ms_per_batch"
(median of --runs rounds), "ms_min", "ms_max", "tempo_lab_ratio" (median over the rounds),
"max_abs_err", "useful_fraction" (real work / padded work: sum of lengths / (batch x longest)),
"compile_s", "loadavg", ...}``; with ``--phases``, tempo_lab's and jax_padded's also hold
``phases_us``, where their calls go (``PHASES_METHOD``).
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

import numpy as np

from benchmarks.decode import environment, loadavg, taking_turns, write_results

DEFAULT_OUT = os.path.join("benchmarks", "results", "autobatch.json")
QUICK_OUT = os.path.join("benchmarks", "results", "autobatch_quick.json")
SYSTEMS = ("tempo_lab", "jax_padded", "jax_per_instance")
TARGETS = {"jax_padded": 1.0, "jax_per_instance": 0.2}  # tempo_lab / system, every model
HALF_PADDED_TARGET = 0.7  # birnn and berxit, against jax_padded
# tempo_lab's programs batch the work of the steps that is off the recurrence (the inputs'
# projections) over all steps: an option of the compiler, recorded with each result
VECTORISE_GROUPS = True


# -- problems ------------------------------------------------------------------------------------
def birnn_problem(batch: int, seq_len: int, hidden: int, seed: int = 0) -> dict:
    rs = np.random.RandomState(seed)
    lengths = rs.randint(max(1, seq_len // 8), seq_len + 1, size=batch)
    lengths[0] = seq_len  # the longest instance has the bound's length
    s = 1.0 / np.sqrt(hidden)
    w = {k: (rs.randn(hidden, hidden) * s).astype(np.float32)
         for k in ("wf", "uf", "wb", "ub")}
    w["out"] = (rs.randn(2 * hidden, hidden) * s).astype(np.float32)
    x = rs.randn(batch, seq_len, hidden).astype(np.float32)
    x[np.arange(seq_len)[None, :] >= lengths[:, None]] = 0.0  # padding is not data
    return {"x": x, "lengths": lengths, "w": w}


def birnn_numpy(p: dict) -> np.ndarray:
    w, out = p["w"], []
    for x, n in zip(p["x"], p["lengths"]):
        hf = np.zeros(w["wf"].shape[1], np.float32)
        for i in range(n):
            hf = np.tanh(x[i] @ w["wf"] + hf @ w["uf"])
        hb = np.zeros_like(hf)
        for i in reversed(range(n)):
            hb = np.tanh(x[i] @ w["wb"] + hb @ w["ub"])
        out.append(np.concatenate([hf, hb]) @ w["out"])
    return np.stack(out)


def birnn_tempo(p: dict, groups: int | None = None):
    """``groups``: ``CompileConfig.ragged_buckets``, the groups of instances by length (None:
    the compiler's choice)."""
    import tempo_lab as tl

    w, (batch, _, hidden) = p["w"], p["x"].shape
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, T = ctx.bounds
    with ctx:
        x = tl.from_array(p["x"], domain=(b, t))
        wf, uf, wb, ub, wo = (tl.constant(w[k]) for k in ("wf", "uf", "wb", "ub", "out"))
        hf = tl.placeholder((hidden,), "float32", domain=(b, t))
        hf[b, 0] = tl.tanh(x[b, 0] @ wf)
        hf[b, t] = tl.tanh(x[b, t] @ wf + hf[b, t - 1] @ uf)
        hb = tl.placeholder((hidden,), "float32", domain=(b, t))
        hb[b, T - 1] = tl.tanh(x[b, T - 1] @ wb)
        hb[b, t] = tl.tanh(x[b, t] @ wb + hb[b, t + 1] @ ub)
        y = tl.concatenate([hf[b, T - 1], hb[b, 0]], axis=0) @ wo
    return ctx.compile(bounds={B: batch, T: tl.lengths(p["lengths"], over=b)},
                       outputs={"y": y}, config=tl.CompileConfig(
                           ragged_buckets=groups, vectorise_groups=VECTORISE_GROUPS))


def birnn_padded(p: dict):
    import jax
    import jax.numpy as jnp

    w = {k: jnp.asarray(v) for k, v in p["w"].items()}
    x, n = jnp.asarray(p["x"]), jnp.asarray(p["lengths"])
    steps = jnp.arange(x.shape[1])

    @jax.jit
    def run(x, n):
        xs = jnp.swapaxes(x, 0, 1)                        # (T, B, H)
        h0 = jnp.zeros((x.shape[0], w["wf"].shape[1]), x.dtype)

        def fwd(h, xt_t):
            xt, t = xt_t
            new = jnp.tanh(xt @ w["wf"] + h @ w["uf"])
            return jnp.where((t < n)[:, None], new, h), None

        def bwd(h, xt_t):
            xt, t = xt_t
            new = jnp.tanh(xt @ w["wb"] + h @ w["ub"])
            return jnp.where((t < n)[:, None], new, 0.0), None

        hf, _ = jax.lax.scan(fwd, h0, (xs, steps))
        hb, _ = jax.lax.scan(bwd, h0, (xs, steps), reverse=True)
        return jnp.concatenate([hf, hb], axis=1) @ w["out"]
    return functools.partial(run, x, n)  # a partial: --phases lowers run on its args


def birnn_bucketed(p: dict, buckets: int = 4):
    """What sorting by length buys (an experiment, not a baseline the targets use): the
    instances sorted, cut into ``buckets`` equal groups, each group one padded scan up to its
    own longest length -- the design a compacting executor would follow."""
    order = np.argsort(-p["lengths"], kind="stable")
    groups = [g for g in np.array_split(order, buckets) if len(g)]
    runs = []
    for g in groups:
        n = int(p["lengths"][g].max())
        runs.append(birnn_padded({"x": p["x"][g, :n], "lengths": p["lengths"][g],
                                  "w": p["w"]}))
    import jax.numpy as jnp
    inverse = jnp.asarray(np.argsort(np.concatenate(groups)))
    return lambda: jnp.concatenate([r() for r in runs])[inverse]


def birnn_per_instance(p: dict):
    import jax
    import jax.numpy as jnp

    w = {k: jnp.asarray(v) for k, v in p["w"].items()}

    @jax.jit
    def one(x):                                            # one instance at its own length
        h0 = jnp.zeros(w["wf"].shape[1], x.dtype)
        hf, _ = jax.lax.scan(lambda h, xt: (jnp.tanh(xt @ w["wf"] + h @ w["uf"]), None), h0, x)
        hb, _ = jax.lax.scan(lambda h, xt: (jnp.tanh(xt @ w["wb"] + h @ w["ub"]), None), h0, x,
                             reverse=True)
        return jnp.concatenate([hf, hb]) @ w["out"]
    xs = [jnp.asarray(x[:n]) for x, n in zip(p["x"], p["lengths"])]
    return lambda: jnp.stack([one(x) for x in xs])


def berxit_problem(batch: int, layers: int, hidden: int, classes: int = 8,
                   threshold: float = 0.5, seed: int = 0) -> dict:
    rs = np.random.RandomState(seed)
    s = 1.0 / np.sqrt(hidden)
    w = {"w1": (rs.randn(layers, hidden, hidden) * s).astype(np.float32),
         "w2": (rs.randn(layers, hidden, hidden) * s).astype(np.float32),
         "head": (rs.randn(hidden, classes) * 4 * s).astype(np.float32)}
    x = rs.randn(batch, hidden).astype(np.float32)
    return {"x": x, "w": w, "threshold": threshold, "layers": layers}


def _berxit_layer(h, w1, w2, xp):
    z = h + xp.maximum(h @ w1, 0) @ w2
    return z / xp.sqrt((z * z).mean(axis=-1, keepdims=True) + 1e-5)


def _softmax_max(z, xp):
    e = xp.exp(z - z.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).max(axis=-1)


def berxit_numpy(p: dict) -> tuple[np.ndarray, np.ndarray]:
    w, out, exits = p["w"], [], []
    for h in p["x"]:
        for k in range(p["layers"]):
            h = _berxit_layer(h, w["w1"][k], w["w2"][k], np)
            logits = h @ w["head"]
            if _softmax_max(logits, np) > p["threshold"] or k == p["layers"] - 1:
                break
        out.append(logits)
        exits.append(k + 1)
    return np.stack(out), np.array(exits)


def berxit_tempo(p: dict):
    import tempo_lab as tl

    w, (batch, hidden) = p["w"], p["x"].shape
    ctx = tl.Context(dims=("b", "l"))
    b, l_ = ctx.dims
    B, L = ctx.bounds
    with ctx:
        x = tl.from_array(p["x"], domain=(b,))
        w1 = tl.from_array(w["w1"], domain=(l_,))
        w2 = tl.from_array(w["w2"], domain=(l_,))
        head = tl.constant(w["head"])
        h = tl.placeholder((hidden,), "float32", domain=(b, l_))
        h[b, 0] = _berxit_layer(x, w1[0], w2[0], tl)
        h[b, l_] = _berxit_layer(h[b, l_ - 1], w1, w2, tl)
        logits = h @ head
        confident = _softmax_max(logits, tl) > p["threshold"]
        y = logits[b, L - 1]
    return ctx.compile(bounds={B: batch, L: tl.until(confident, max=p["layers"])},
                       outputs={"y": y},
                       config=tl.CompileConfig(vectorise_groups=VECTORISE_GROUPS))


def berxit_padded(p: dict):
    import jax
    import jax.numpy as jnp

    w = {k: jnp.asarray(v) for k, v in p["w"].items()}

    @jax.jit
    def run(x):
        def layer(carry, ws):
            h, out, exited = carry
            h = _berxit_layer(h, ws[0], ws[1], jnp)
            logits = h @ w["head"]
            take = ~exited
            out = jnp.where(take[:, None], logits, out)
            exited = exited | (_softmax_max(logits, jnp) > p["threshold"])
            return (h, out, exited), None
        init = (x, jnp.zeros((x.shape[0], w["head"].shape[1]), x.dtype),
                jnp.zeros(x.shape[0], bool))
        (_, out, _), _ = jax.lax.scan(layer, init, (w["w1"], w["w2"]))
        return out
    x = jnp.asarray(p["x"])
    return functools.partial(run, x)


def berxit_per_instance(p: dict):
    import jax
    import jax.numpy as jnp

    w = {k: jnp.asarray(v) for k, v in p["w"].items()}

    @jax.jit
    def step(h, w1, w2):
        h = _berxit_layer(h, w1, w2, jnp)
        logits = h @ w["head"]
        return h, logits, _softmax_max(logits, jnp) > p["threshold"]

    def run():
        out = []
        for h in xs:
            for k in range(p["layers"]):
                h, logits, done = step(h, w["w1"][k], w["w2"][k])
                if bool(done):                             # a host decision per layer
                    break
            out.append(logits)
        return jnp.stack(out)
    xs = [jnp.asarray(x) for x in p["x"]]
    return run


def random_tree(leaves: int, rs) -> np.ndarray:
    """A random binary tree in post-order (children before parents): ``(nodes, 2)`` child
    indices, -1 for a leaf's; the root is the last node."""
    nodes, pool = [(-1, -1)] * leaves, list(range(leaves))
    while len(pool) > 1:
        i, j = sorted(rs.choice(len(pool), 2, replace=False))
        nodes.append((pool[i], pool[j]))
        pool = [q for k, q in enumerate(pool) if k not in (i, j)] + [len(nodes) - 1]
    return np.array(nodes)


def treelstm_problem(batch: int, max_leaves: int, hidden: int, seed: int = 0) -> dict:
    rs = np.random.RandomState(seed)
    leaves = rs.randint(2, max_leaves + 1, size=batch)
    leaves[0] = max_leaves
    trees = [random_tree(int(n), rs) for n in leaves]
    lengths = np.array([len(t) for t in trees])
    n = lengths.max()
    kids = np.zeros((batch, n, 2), np.int32)
    leaf = np.ones((batch, n), bool)
    for k, t in enumerate(trees):
        kids[k, :len(t)] = np.maximum(t, 0)
        leaf[k, :len(t)] = t[:, 0] < 0
    s = 1.0 / np.sqrt(3 * hidden)
    return {"x": rs.randn(batch, n, hidden).astype(np.float32), "kids": kids, "leaf": leaf,
            "lengths": lengths, "w": (rs.randn(3 * hidden, 5 * hidden) * s).astype(np.float32)}


def _treelstm_cell(x, hl, cl, hr, cr, w, xp, concat):
    """A binary (N-ary) TreeLSTM cell: input, two forget, output gates and the update from
    the node's input and both children's hidden states."""
    hidden = hl.shape[-1]
    z = concat([x, hl, hr]) @ w
    i, fl, fr, o = (1 / (1 + xp.exp(-z[..., k * hidden:(k + 1) * hidden])) for k in range(4))
    u = xp.tanh(z[..., 4 * hidden:])
    c = i * u + fl * cl + fr * cr
    return o * xp.tanh(c), c


def treelstm_numpy(p: dict, xp=np, w=None):
    """Each tree's root state, node by node (``xp``: NumPy, or jax.numpy to differentiate
    with respect to ``w``)."""
    out = []
    hidden = p["x"].shape[-1]
    w = p["w"] if w is None else w
    for x, kids, leaf, n in zip(p["x"], p["kids"], p["leaf"], p["lengths"]):
        hs, cs = [], []
        for i in range(n):
            zero = xp.zeros(hidden, np.float32)
            a, b = kids[i]
            hl, cl, hr, cr = (zero,) * 4 if leaf[i] else (hs[a], cs[a], hs[b], cs[b])
            h, c = _treelstm_cell(x[i], hl, cl, hr, cr, w, xp,
                                  lambda v: xp.concatenate(v, axis=-1))
            hs.append(h)
            cs.append(c)
        out.append(hs[-1])
    return xp.stack(out)


def treelstm_tempo(p: dict, executor: str = "auto"):
    """The TreeLSTM batched level by level (``treelstm_levels_program``)."""
    import tempo_lab as tl

    ctx = tl.Context(dims=("b", "s", "k"))
    levels = tree_levels(p)
    _, root = treelstm_levels_program(ctx, p, levels)
    B, S, K = ctx.bounds
    return ctx.compile(bounds={B: len(p["lengths"]), S: levels.steps, K: levels.width},
                       outputs={"y": root}, config=tl.CompileConfig(executor=executor))


def treelstm_postorder_tempo(p: dict, groups: int | None = None, executor: str = "auto"):
    """The TreeLSTM node by node in post-order, trees grouped by size (``treelstm_program``)."""
    import tempo_lab as tl

    ctx = tl.Context(dims=("b", "n"))
    _, root = treelstm_program(ctx, p)
    B, N = ctx.bounds
    return ctx.compile(bounds={B: len(p["lengths"]), N: tl.lengths(p["lengths"],
                                                                   over=ctx.dims[0])},
                       outputs={"y": root},
                       config=tl.CompileConfig(ragged_buckets=groups, executor=executor,
                                               vectorise_groups=VECTORISE_GROUPS))


def tree_levels(p: dict):
    """The problem's trees laid out level by level (``tl.nn.tree_levels``)."""
    import tempo_lab as tl

    return tl.nn.tree_levels(np.where(p["leaf"][..., None], -1, p["kids"]), p["lengths"])


def treelstm_levels_program(ctx, p: dict, levels):
    """The TreeLSTM over ``ctx``'s dims ``(b, s, k)``: a loop over the steps ``s`` of
    ``levels`` (``tl.nn.TreeLevels``), all slots ``k`` of a step at once, each gathering its
    children's states from the steps before; the weight and each tree's root state over
    ``b``."""
    import tempo_lab as tl

    hidden = p["x"].shape[-1]
    b, s, k = ctx.dims
    _, S, K = ctx.bounds
    roots = p["lengths"] - 1                               # the last node in post-order
    tree = np.arange(len(roots))
    with ctx:
        x = tl.from_array(levels.place(p["x"]), domain=(s, k))
        step, slot, has = ([tl.from_array(a[..., j], domain=(s, k)) for j in range(2)]
                           for a in (levels.child_step, levels.child_slot, levels.has_child))
        w = tl.constant(p["w"])
        state = tl.placeholder((2 * hidden,), "float32", domain=(s, k))  # [h, c] per node
        zero = tl.zeros((hidden,))
        node = _tempo_node(w)
        state[0, k] = node(x[0, k], zero, zero, zero, zero)  # the first step holds leaves
        earlier = state[0:s, 0:K]                          # every slot of the steps before
        kids = []
        for j in range(2):
            v = tl.take(earlier, (step[j], slot[j]))
            kids += [tl.where(has[j], v[..., :hidden], zero),
                     tl.where(has[j], v[..., hidden:], zero)]
        state[s, k] = node(x, *kids)
        rs = tl.from_array(levels.step[tree, roots], domain=(b,))
        rk = tl.from_array(levels.slot[tree, roots], domain=(b,))
        root = tl.take(state[0:S, 0:K], (rs, rk))[..., :hidden]
    return w, root


def _tempo_node(w):
    """The TreeLSTM cell in tempo_lab: a node's ``[h, c]`` from its input and children's."""
    import tempo_lab as tl

    def node(x, hl, cl, hr, cr):
        h, c = _treelstm_cell(x, hl, cl, hr, cr, w, tl, lambda v: tl.concatenate(v, axis=-1))
        return tl.concatenate([h, c], axis=0)
    return node


def treelstm_program(ctx, p: dict):
    """The TreeLSTM over ``ctx``'s dims ``(b, n)``: the weight and each tree's root state."""
    import tempo_lab as tl

    hidden = p["x"].shape[-1]
    b, n = ctx.dims
    B, N = ctx.bounds
    with ctx:
        x = tl.from_array(p["x"], domain=(b, n))
        left = tl.from_array(p["kids"][..., 0], domain=(b, n))
        right = tl.from_array(p["kids"][..., 1], domain=(b, n))
        leaf = tl.from_array(p["leaf"], domain=(b, n))
        w = tl.constant(p["w"])
        state = tl.placeholder((2 * hidden,), "float32", domain=(b, n))  # [h, c] per node
        zero = tl.zeros((hidden,))
        node = _tempo_node(w)
        state[b, 0] = node(x[b, 0], zero, zero, zero, zero)
        earlier = state[b, 0:n]                            # the nodes before, in post-order
        sl, sr = tl.take(earlier, left, axis=0), tl.take(earlier, right, axis=0)
        kids = [tl.where(leaf, zero, v) for v in (sl[..., :hidden], sl[..., hidden:],
                                                   sr[..., :hidden], sr[..., hidden:])]
        state[b, n] = node(x, *kids)
        root = state[b, N - 1][..., :hidden]
    return w, root


def _treelstm_scan(x, kids, leaf, w, n_valid):
    """Plain JAX: a scan over the nodes in post-order, a node buffer, gathers for children."""
    import jax
    import jax.numpy as jnp

    nodes, hidden = x.shape[-2], x.shape[-1]

    def step(buf, i):
        a, b = kids[..., i, 0], kids[..., i, 1]
        get = lambda k: jnp.take_along_axis(buf, k[..., None, None], axis=-2)[..., 0, :]  # noqa: E731
        sa, sb = get(a), get(b)
        lf = leaf[..., i, None]
        hl, cl = jnp.where(lf, 0.0, sa[..., :hidden]), jnp.where(lf, 0.0, sa[..., hidden:])
        hr, cr = jnp.where(lf, 0.0, sb[..., :hidden]), jnp.where(lf, 0.0, sb[..., hidden:])
        h, c = _treelstm_cell(x[..., i, :], hl, cl, hr, cr, w, jnp,
                              lambda v: jnp.concatenate(v, axis=-1))
        new = jnp.concatenate([h, c], axis=-1)
        live = (i < n_valid)[..., None]
        buf = buf.at[..., i, :].set(jnp.where(live, new, 0.0))
        return buf, None
    buf0 = jnp.zeros(x.shape[:-2] + (nodes, 2 * hidden), x.dtype)
    buf, _ = jax.lax.scan(step, buf0, jnp.arange(nodes))
    root = jnp.take_along_axis(buf, (n_valid - 1)[..., None, None], axis=-2)[..., 0, :]
    return root[..., :hidden]


def treelstm_padded(p: dict):
    import jax
    import jax.numpy as jnp

    args = [jnp.asarray(p[k]) for k in ("x", "kids", "leaf", "w", "lengths")]
    return functools.partial(jax.jit(_treelstm_scan), *args)


def treelstm_levels_jax(p: dict):
    """``jax_levels``: plain JAX on the same level layout (an experiment beside the baselines,
    as ``jax_bucketed``): a scan over the steps, a gather of each slot's children from the state
    buffer, the cell on every slot at once."""
    import jax
    import jax.numpy as jnp

    lv = tree_levels(p)
    hidden = p["x"].shape[-1]
    x, cs, ck, has = (jnp.asarray(a) for a in (lv.place(p["x"]), lv.child_step,
                                                 lv.child_slot, lv.has_child))
    tree = np.arange(len(p["lengths"]))
    rs, rk = (jnp.asarray(a[tree, p["lengths"] - 1]) for a in (lv.step, lv.slot))
    w = jnp.asarray(p["w"])

    @jax.jit
    def run():
        def step(buf, i):
            kid = buf[cs[i], ck[i]]                        # (width, 2, 2H)
            kid = jnp.where(has[i][..., None], kid, 0.0)
            h, c = _treelstm_cell(x[i], kid[:, 0, :hidden], kid[:, 0, hidden:],
                                  kid[:, 1, :hidden], kid[:, 1, hidden:], w, jnp,
                                  lambda v: jnp.concatenate(v, axis=-1))
            return buf.at[i].set(jnp.concatenate([h, c], axis=-1)), None
        buf0 = jnp.zeros((lv.steps, lv.width, 2 * hidden), x.dtype)
        buf, _ = jax.lax.scan(step, buf0, jnp.arange(lv.steps))
        return buf[rs, rk, :hidden]
    return run


def treelstm_per_instance(p: dict):
    import jax
    import jax.numpy as jnp

    one = jax.jit(_treelstm_scan)                           # one tree at its own size
    trees = [[jnp.asarray(p["x"][k, :n]), jnp.asarray(p["kids"][k, :n]),
              jnp.asarray(p["leaf"][k, :n]), jnp.asarray(p["w"]), jnp.asarray(n)]
             for k, n in enumerate(p["lengths"])]
    return lambda: jnp.stack([one(*t) for t in trees])


MODELS = {
    "birnn": (birnn_problem, birnn_numpy, birnn_tempo, birnn_padded, birnn_per_instance),
    "berxit": (berxit_problem, berxit_numpy, berxit_tempo, berxit_padded, berxit_per_instance),
    "treelstm": (treelstm_problem, treelstm_numpy, treelstm_tempo, treelstm_padded,
                 treelstm_per_instance),
}


# -- measuring -----------------------------------------------------------------------------------
def _wall(fn):
    """``fn``'s call as a measure: the seconds it takes, waiting for its result."""
    import jax

    def measure() -> float:
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        return time.perf_counter() - t0
    return measure


def measure_model(model: str, args) -> list[dict]:
    make, numpy_ref, tempo, padded, per_instance = MODELS[model]
    if model in ("birnn", "treelstm"):
        p = make(args.batch, args.seq_len if model == "birnn" else args.leaves, args.hidden)
        want = numpy_ref(p)
        useful = float(p["lengths"].sum() / (len(p["lengths"]) * p["lengths"].max()))
        size = ({"seq_len": args.seq_len} if model == "birnn" else
                {"max_leaves": args.leaves, "nodes_max": int(p["lengths"].max())})
    else:
        p = make(args.batch, args.layers, args.hidden, threshold=args.threshold)
        want, exits = numpy_ref(p)
        useful = float(exits.sum() / (len(exits) * exits.max()))
        size = {"layers": args.layers, "exit_layers_mean": float(exits.mean())}
    layout = tree_levels(p) if model == "treelstm" else None   # recorded with its systems
    extra = {"birnn": "jax_bucketed", "treelstm": "jax_levels"}
    systems = list(args.systems) + ([extra[model]] if model in extra and args.bucketed else [])
    fns, records = {}, {}
    for system in systems:  # every system built and checked, then all timed taking turns
        t0 = time.perf_counter()
        if system == "tempo_lab":
            prog = tempo(p)
            fn = lambda prog=prog: prog.run()["y"]  # noqa: E731
        elif system == "jax_bucketed":
            fn = birnn_bucketed(p)
        elif system == "jax_levels":
            fn = treelstm_levels_jax(p)
        else:
            fn = (padded if system == "jax_padded" else per_instance)(p)
        got = np.asarray(fn())                              # compiles (every shape), checks
        compile_s = time.perf_counter() - t0
        err = float(np.abs(got - want).max())
        if not np.allclose(got, want, rtol=1e-3, atol=1e-3):
            raise SystemExit(f"{model}/{system}: outputs differ from the NumPy reference by "
                             f"{err:.3g}; reproduce with python -m benchmarks.autobatch "
                             f"--models {model} --systems {system} --quick")
        fns[system] = fn
        records[system] = {"model": model, "system": system, "batch": args.batch,
                           "hidden": args.hidden, **size, "max_abs_err": err,
                           "useful_fraction": useful, "compile_s": compile_s,
                           "runs": args.runs}
        if system == "tempo_lab":
            records[system].update(executor=prog.executor, vectorise_groups=VECTORISE_GROUPS)
        if system in ("tempo_lab", "jax_levels") and layout is not None:
            records[system]["levels"] = {"steps": layout.steps, "width": layout.width,
                                         "slots_used": layout.useful_fraction}
    times = taking_turns({k: _wall(fn) for k, fn in fns.items()}, args.runs)
    for system, rec in records.items():
        ts = times[system]
        rec.update(ms_per_batch=1e3 * statistics.median(ts), ms_min=1e3 * min(ts),
                   ms_max=1e3 * max(ts), loadavg=loadavg(), timing=TIMING)
        if "tempo_lab" in times:  # the rounds' ratios: both systems timed in the same moment
            rec["tempo_lab_ratio"] = statistics.median(
                a / b for a, b in zip(times["tempo_lab"], ts))
        print(f"{model:7s} {system:17s} {rec['ms_per_batch']:9.3f} ms/batch  err "
              f"{rec['max_abs_err']:.1e}  useful {useful:.2f}"
              + (f"  tempo_lab / this {rec['tempo_lab_ratio']:.2f}x"
                 if "tempo_lab_ratio" in rec else ""), flush=True)
    if getattr(args, "phases", False):  # a notebook's own Namespace may not name it
        for system in ("tempo_lab", "jax_padded"):
            if system in fns:
                records[system].update(phases_us=phases(
                    fns[system], prog if system == "tempo_lab" else None, args.runs),
                    phases_method=PHASES_METHOD)
        print_phases(model, records)
    return list(records.values())


TIMING = ("one process, every system warm; --runs rounds of one call each, in the order "
          "A B C then C B A; ms_per_batch = median call; tempo_lab_ratio = median over rounds "
          "of tempo_lab's call / this system's")
PHASES_METHOD = (
    "us per call: call = the median call taking turns with the other systems (ms_per_batch); "
    "alone = the median of --runs calls with no other system's between; program = the "
    "compiled XLA program alone (tempo_lab: executable.program_seconds, in rounds with its "
    "alone calls; padded JAX: its jitted call, which is all of it); host = the median over "
    "those rounds of alone - program, the Python around the program and fetching its results; "
    "kernels / control = the program's split under JAX's profiler (xla_profile: the time "
    "XLA's thunks cover / the rest, loop control and dispatch), scaled to program; loops = "
    "each while loop's profiled time and control, tempo_lab's as its program's source numbers "
    "them, padded JAX's by the while's op_name")


def phases(fn, prog, runs: int) -> dict:
    """Where one batched system's call goes (``--phases``, ``PHASES_METHOD``): ``prog`` is
    tempo_lab's program, or None for plain JAX, whose ``fn`` is a ``functools.partial`` of a
    jitted function and its arguments."""
    import jax

    from tempo_lab.runtime.xla_profile import loop_seconds, seconds_by

    if prog is not None:
        ex = prog.executable
        # the call and its program alone taking turns: their difference is of one moment
        rounds = [(_wall(fn)(), ex.program_seconds(1)) for _ in range(runs)]
        alone, program = (statistics.median(x) for x in zip(*rounds))
        host = statistics.median(a - b for a, b in rounds)
        profiled = ex.op_seconds(runs)
        loops = {f"{k} {v['loop']}": v for k, v in ex.loop_seconds(runs).items()}
    else:
        hlo = fn.func.lower(*fn.args).compile().as_text()
        call = lambda: jax.block_until_ready(fn())  # noqa: E731
        alone = program = statistics.median(_wall(fn)() for _ in range(runs))
        host, profiled = 0.0, seconds_by(call, hlo, lambda path: "kernels", runs)
        loops = loop_seconds(call, hlo, lambda path: path, runs)
    control = profiled["unattributed"] / sum(profiled.values())
    return {"alone": 1e6 * alone, "program": 1e6 * program, "host": 1e6 * host,
            "kernels": 1e6 * program * (1 - control), "control": 1e6 * program * control,
            "loops": {k: {"seconds": 1e6 * v["seconds"], "control": 1e6 * v["control"]}
                      for k, v in loops.items()}}


def print_phases(model: str, records: dict) -> None:
    print(f"{model}: where a call goes, us (--phases; loops as profiled)")
    print(f"  {'system':10s}" + "".join(f"{k:>9s}" for k in ("call", "alone", "program", "host",
                                                            "kernels", "control")))
    for system, rec in records.items():
        if "phases_us" in rec:
            ph = rec["phases_us"]
            print(f"  {system:10s}{1e3 * rec['ms_per_batch']:9.1f}" + "".join(
                f"{ph[k]:9.1f}" for k in ("alone", "program", "host", "kernels", "control")))
            for name, lp in ph["loops"].items():
                print(f"    loop {name}: {lp['seconds']:.1f} us, control {lp['control']:.1f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.autobatch",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="small: batch 16, T = 24, 6 layers, hidden 32, 51 rounds")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--leaves", type=int, default=32, help="treelstm: most leaves per tree")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--threshold", type=float, default=0.5)
    ap.add_argument("--runs", type=int, default=None,
                    help="rounds, each one warm call of every system taking turns; the "
                         "median reported (default 9; --quick: 51)")
    ap.add_argument("--bucketed", action="store_true",
                    help="also time birnn sorted into 4 length buckets in plain JAX "
                         "(jax_bucketed: what a compacting executor could gain) and treelstm "
                         "on tempo_lab's level layout in plain JAX (jax_levels)")
    ap.add_argument("--phases", action="store_true",
                    help="also profile where tempo_lab's and padded JAX's calls go: the XLA "
                         "program's kernels and control, each loop, the host's Python")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.quick:
        args.batch, args.seq_len, args.layers, args.hidden = 16, 24, 6, 32
        args.leaves = 8
    if args.runs is None:  # an explicit --runs holds with --quick too
        args.runs = 51 if args.quick else 9
    import tempo_lab as tl

    tl.config.progress = False
    records = []
    for model in args.models:
        records += measure_model(model, args)
    env = environment()
    for r in records:
        r["environment"] = env
    write_results(records, args.out or (QUICK_OUT if args.quick else DEFAULT_OUT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
