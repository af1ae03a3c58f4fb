"""Ragged bounds (tl.lengths): every executor against the reference, and the reference against
the oracle that defines them: each instance is the same program at its own length."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from rt_helpers import ALL, COMPILED, DISTINCT_COMPILED

import tempo_lab as tl

FEATURES = ("forward", "backward", "last", "sum", "mean", "max", "attention", "suffix",
            "batch")
D = 3


def program(data: np.ndarray, features, ragged_lengths=None):
    """A program over (b, t) using ``features``; returns the context, bounds and outputs.
    With ``ragged_lengths`` T is ragged; else T is data's second axis."""
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, T = ctx.bounds
    outs = {}
    with ctx:
        x = tl.from_array(data, domain=(b, t))
        h = tl.placeholder((D,), "float32", domain=(b, t))
        h[b, 0] = tl.tanh(x[b, 0])
        h[b, t] = tl.tanh(x[b, t] + h[b, t - 1] * 0.5)
        g = tl.placeholder((D,), "float32", domain=(b, t))
        g[b, T - 1] = tl.sin(x[b, T - 1])
        g[b, t] = tl.tanh(x[b, t] - g[b, t + 1] * 0.7)
        if "forward" in features:
            outs["h"] = h
        if "backward" in features:
            outs["g"] = g
        if "last" in features:
            outs["last"] = h[b, T - 1] + g[b, 0]
        if "sum" in features:
            outs["sum"] = (h[b, 0:T] * 2.0 + 1.0).sum(axis=0)
        if "mean" in features:
            outs["mean"] = tl.exp(x[b, 0:T]).mean(axis=(0, 1))
        if "max" in features:
            outs["max"] = (g[b, 0:T] - 3.0).max(axis=0)
        if "attention" in features:
            s = tl.softmax(h[b, 0:T] @ h[b, T - 1], axis=0)
            outs["attention"] = s @ g[b, 0:T]
        if "suffix" in features:
            outs["suffix"] = x[b, t:T].sum(axis=0)       # a reverse running sum, per instance
        if "batch" in features:
            outs["batch"] = h[0:B, 0:T].sum(axis=(0, 1))  # all instances' own points
    bounds = {B: data.shape[0],
              T: tl.lengths(ragged_lengths, over=b) if ragged_lengths is not None
              else data.shape[1]}
    return ctx, bounds, outs


def batched_dims(prog) -> set[str]:
    """The dims along which a group of ops was batched out of its loop."""
    return {e.note.split(" at ")[1].split()[0] for r in prog.passes.records
            if r.name == "vectorise" for e in r.events if "looped reader's view" in e.note}


def per_instance(data, lengths, features) -> dict[str, list[np.ndarray]]:
    """Each instance alone at its own length, on the reference: the definition."""
    out: dict[str, list] = {}
    for k, n in enumerate(lengths):
        ctx, bounds, outs = program(data[k:k + 1, :n], features)
        run = ctx.compile(bounds=bounds, outputs=outs,
                          config=tl.CompileConfig(executor="reference")).run()
        for name in outs:
            out.setdefault(name, []).append(run[name] if name == "batch" else run[name][0])
    return out


def check(run, want, lengths, features):
    for name, values in want.items():
        got = run[name]
        if name == "batch":
            np.testing.assert_allclose(got, np.sum(values, axis=0), rtol=1e-4, atol=1e-4)
            continue
        for k, (v, n) in enumerate(zip(values, lengths)):
            have = got[k][:n] if name in ("h", "g", "suffix") else got[k]
            np.testing.assert_allclose(have, v, rtol=1e-4, atol=1e-4, err_msg=f"{name}[{k}]")
        if name in ("h", "g", "suffix"):
            mask = run.mask(name)
            assert mask.shape == got.shape[:2]
            assert (got[~mask] == 0).all()
            assert [m.sum() for m in mask] == list(lengths)


@settings(max_examples=examples(12), deadline=None, derandomize=True, database=None)
@given(lengths=st.lists(st.integers(1, 7), min_size=1, max_size=10),
       features=st.sets(st.sampled_from(FEATURES), min_size=1, max_size=4),
       executor=st.sampled_from(ALL), batched=st.booleans())
def test_random_ragged_programs_match_each_instance_alone(lengths, features, executor,
                                                          batched):
    data = np.random.RandomState(len(lengths)).randn(len(lengths), max(lengths), D) \
        .astype(np.float32)
    ctx, bounds, outs = program(data, features, np.array(lengths))
    run = ctx.compile(bounds=bounds, outputs=outs, config=tl.CompileConfig(
        executor=executor, vectorise_groups=batched)).run()
    check(run, per_instance(data, lengths, features), lengths, features)


@pytest.mark.parametrize("executor,batched", [(e, False) for e in ALL]
                         + [("interpreter", True), ("xla", True)])
def test_every_feature_on_every_executor(executor, batched):
    """``batched``: the steps' parts outside the recurrences run batched over all steps
    (``vectorise_groups``), in every group of instances."""
    lengths = np.array([3, 6, 1, 4, 6])
    data = np.random.RandomState(1).randn(5, 6, D).astype(np.float32)
    ctx, bounds, outs = program(data, FEATURES, lengths)
    prog = ctx.compile(bounds=bounds, outputs=outs, config=tl.CompileConfig(
        executor=executor, vectorise_groups=batched))
    if batched:  # the inputs' sin/tanh parts leave the loop (one box: "batch" reads across b)
        assert batched_dims(prog) == {"t"}
    run = prog.run()
    check(run, per_instance(data, lengths, FEATURES), lengths, FEATURES)
    h = run.instances("h")
    assert [len(v) for v in h] == list(lengths) and h[2].shape == (1, D)


def test_the_bound_as_a_value_is_the_instances_where_b_is_in_its_domain():
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, T = ctx.bounds
    with ctx:
        own = tl.zeros(()) + (T + b)          # over (b,): instance b's length, plus b
        longest = tl.zeros(()) + T            # over no dims: the longest instance's length
    for executor in ALL:
        run = ctx.compile(bounds={B: 3, T: tl.lengths(np.array([2, 5, 3]), over=b)},
                          outputs={"own": own, "longest": longest},
                          config=tl.CompileConfig(executor=executor)).run()
        assert run["own"].tolist() == [2, 6, 5] and run["longest"] == 5, executor


def forward_rnn(data, W0, b, t):
    """The data, the weight and ``h[b, t] = tanh(x W + h[b, t - 1])`` (inside a context)."""
    x = tl.from_array(data, domain=(b, t))
    W = tl.constant(W0)
    h = tl.placeholder((D,), "float32", domain=(b, t))
    h[b, 0] = tl.tanh(x[b, 0] @ W)
    h[b, t] = tl.tanh(x[b, t] @ W + h[b, t - 1])
    return x, W, h


def birnn_loss(ctx, data, W0):
    b, t = ctx.dims
    B, T = ctx.bounds
    with ctx:
        x, W, h = forward_rnn(data, W0, b, t)
        g = tl.placeholder((D,), "float32", domain=(b, t))
        g[b, T - 1] = tl.tanh(x[b, T - 1] @ W)
        g[b, t] = tl.tanh(x[b, t] @ W + g[b, t + 1])
        s = tl.softmax(h[b, 0:T] @ h[b, T - 1], axis=0)
        c = s @ g[b, 0:T]
        loss = (c * c).sum() + (h * h).sum(axis=0).mean() * 0.1   # over (b, t)
    return W, loss


def birnn_loss_jax(W, data, lengths):
    total = 0.0
    for k, n in enumerate(lengths):
        xs = data[k, :n]
        hs, hh = [], 0.0
        for i in range(n):
            hh = jnp.tanh(xs[i] @ W + hh)
            hs.append(hh)
        gs, gg = [None] * n, 0.0
        for i in reversed(range(n)):
            gg = jnp.tanh(xs[i] @ W + gg)
            gs[i] = gg
        H, G = jnp.stack(hs), jnp.stack(gs)
        c = jax.nn.softmax(H @ H[-1]) @ G
        total += n * (c * c).sum() + 0.1 * (H * H).sum(axis=1).mean() * n
    return total


def test_gradient_through_a_ragged_birnn_matches_jax_grad(executor):
    lengths = np.array([3, 5, 2, 4])
    rs = np.random.RandomState(0)
    data = rs.randn(4, 5, D).astype(np.float32)
    W0 = (rs.randn(D, D) * 0.5).astype(np.float32)
    ctx = tl.Context(dims=("b", "t"))
    B, T = ctx.bounds
    W, loss = birnn_loss(ctx, data, W0)
    with ctx:
        gW = tl.grad(loss, W)
    run = ctx.compile(bounds={B: 4, T: tl.lengths(lengths, over=ctx.dims[0])},
                      outputs={"loss": loss, "gW": gW},
                      config=tl.CompileConfig(executor=executor)).run()
    want = jax.grad(birnn_loss_jax)(jnp.asarray(W0), data, lengths)
    np.testing.assert_allclose(run["loss"].sum(), birnn_loss_jax(W0, data, lengths),
                               rtol=1e-4)
    np.testing.assert_allclose(run["gW"], want, rtol=1e-4, atol=1e-5)


def test_long_ragged_instances_compile_in_time_independent_of_length():
    """Lengths up to 10^6: the compile does not grow with the bound, the run is right."""
    lengths = np.array([1_000_000, 250_000, 7])
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, T = ctx.bounds
    with ctx:
        c = tl.placeholder((), "float32", domain=(b, t))
        c[b, 0] = tl.zeros(()) + 1.0
        c[b, t] = c[b, t - 1] * 0.5 + 1.0
        last = c[b, T - 1] + (tl.zeros(()) + (T + b))
    prog = ctx.compile(bounds={B: 3, T: tl.lengths(lengths, over=b)}, outputs={"last": last},
                       config=tl.CompileConfig(executor="xla"))
    assert sum(prog.compile_times.values()) < 30
    got = prog.run()["last"]
    want = [2.0 - 0.5 ** (n - 1) + n + k for k, n in enumerate(lengths)]
    np.testing.assert_allclose(got, want, rtol=1e-6)


# -- errors ----------------------------------------------------------------------------------
def test_bad_lengths_are_clear_errors():
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, T = ctx.bounds
    with ctx:
        x = tl.zeros(()) + t
    for bad, words in [([0, 2], "between 1"), ([[1, 2]], "1-D"), ([1.5, 2.0], "integer"),
                       (x, "tl.until\\(done")]:
        with pytest.raises(tl.BoundsError, match=words) as e:
            tl.lengths(bad if bad is x else np.array(bad), over=b)
        assert "test_ragged.py" in str(e.value)
    with pytest.raises(tl.BoundsError, match="another dim"):
        ctx.compile(bounds={B: 2, T: tl.lengths(np.array([1, 2]), over=t)}, outputs={"x": x})
    with pytest.raises(tl.BoundsError, match="one length per point"):
        ctx.compile(bounds={B: 3, T: tl.lengths(np.array([1, 2]), over=b)}, outputs={"x": x})


def test_a_read_past_an_instance_is_a_bounds_error():
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, T = ctx.bounds
    with ctx:
        x = tl.from_array(np.zeros((2, 6), np.float32), domain=(b, t))
        y = x[b, 3]          # fine for the longest instance, not for the shortest
    with pytest.raises(tl.BoundsError, match="leaves its domain") as e:
        ctx.compile(bounds={B: 2, T: tl.lengths(np.array([2, 6]), over=b)}, outputs={"y": y})
    assert "test_ragged.py" in str(e.value)


def test_unsupported_ragged_constructs_say_what_to_do():
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, T = ctx.bounds
    with ctx:
        x = tl.from_array(np.zeros((2, 4, 2), np.float32), domain=(b, t))
        other = x[tl.max(b - 1, 0), t]
        starts = x[b, T - 2:T].sum(axis=0)
        flat = tl.concatenate([x[b, 0:T], x[b, 0:T]], axis=0).sum(axis=0)
    lengths = tl.lengths(np.array([3, 4]), over=b)
    for y, words in [(other, "another instance"), (starts, "must start without"),
                     (flat, "reduce along the range first")]:
        with pytest.raises(tl.BoundsError, match=words) as e:
            ctx.compile(bounds={B: 2, T: lengths}, outputs={"y": y},
                        config=tl.CompileConfig(executor="interpreter"))
        assert "test_ragged.py" in str(e.value)


# -- tl.until per instance ----------------------------------------------------------------------
def early_exit(data, W0, threshold, max_steps):
    """Each instance runs its recurrence until its own state is confident (Berxit-style)."""
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, T = ctx.bounds
    with ctx:
        x, W, h = forward_rnn(data, W0, b, t)
        done = h[b, t].sum() > threshold
        exit_h = h[b, T - 1]
        avg = h[b, 0:T].mean(axis=0)
        loss = (exit_h * exit_h).sum() + avg.sum()
        gW = tl.grad(loss, W)
    return ctx, {B: data.shape[0], T: tl.until(done, max=max_steps)}, \
        {"h": h, "exit_h": exit_h, "avg": avg, "loss": loss, "gW": gW}


def early_exit_jax(W, data, threshold, max_steps):
    """Per instance in plain JAX: the exit step found eagerly, then the loss at it."""
    total, steps = 0.0, []
    for k in range(data.shape[0]):
        hh, hs = 0.0, []
        for i in range(max_steps):
            hh = jnp.tanh(data[k, i] @ W + hh)
            hs.append(hh)
            if float(jax.lax.stop_gradient(hh).sum()) > threshold:
                break
        steps.append(len(hs))
        total = total + (hs[-1] * hs[-1]).sum() + jnp.stack(hs).mean(axis=0).sum()
    return total, steps


@pytest.mark.parametrize("threshold", [0.8, 5.0])  # some instances exit early / none do
def test_until_per_instance_matches_plain_jax(executor, threshold):
    rs = np.random.RandomState(3)
    data = rs.randn(6, 7, D).astype(np.float32)
    W0 = (rs.randn(D, D) * 0.7).astype(np.float32)
    ctx, bounds, outs = early_exit(data, W0, threshold, 7)
    run = ctx.compile(bounds=bounds, outputs=outs,
                      config=tl.CompileConfig(executor=executor)).run()
    (want_loss, steps), want_g = (early_exit_jax(W0, data, threshold, 7),
                                  jax.grad(lambda w: early_exit_jax(w, data, threshold, 7)[0])(
                                      jnp.asarray(W0)))
    assert run.lengths["T"][1].tolist() == steps
    assert run["h"].shape[1] == max(steps)
    assert run.mask("h").sum(axis=1).tolist() == steps
    np.testing.assert_allclose(run["loss"].sum(), want_loss, rtol=1e-4)
    np.testing.assert_allclose(run["gW"], want_g, rtol=1e-4, atol=1e-5)


def test_until_per_instance_needs_a_bool_over_its_dims():
    ctx = tl.Context(dims=("b", "t", "i"))
    b, t, i = ctx.dims
    B, T, I_ = ctx.bounds
    with ctx:
        x = tl.zeros(()) + t + b + i
        done = x > 3
    with pytest.raises(tl.BoundsError, match="over \\(b, t\\) to end t per instance") as e:
        ctx.compile(bounds={B: 2, I_: 2, T: tl.until(done, max=5)}, outputs={"x": x})
    assert "test_ragged.py" in str(e.value)


# -- groups of instances by length ------------------------------------------------------------
SEPARABLE = ("last", "sum", "mean", "max", "attention")


@pytest.mark.executors(COMPILED, reason="grouping by length is a pass; the reference runs "
                        "the program as written")
def test_instances_grouped_by_length_match_each_instance_alone(executor):
    lengths = np.random.RandomState(5).randint(1, 9, size=13)
    data = np.random.RandomState(2).randn(13, lengths.max(), D).astype(np.float32)
    ctx, bounds, outs = program(data, SEPARABLE, lengths)
    prog = ctx.compile(bounds=bounds, outputs=outs, config=tl.CompileConfig(
        executor=executor, ragged_buckets=4))
    order = prog.passes.orders["b"]
    assert sorted(order) == list(range(13)) and (np.diff(lengths[order]) <= 0).all()
    groups = [r for r in prog.passes[0].events if r.kind == "dim" and "by length" in r.note]
    assert len(groups) == 4
    run = prog.run()
    check(run, per_instance(data, lengths, SEPARABLE), lengths, SEPARABLE)
    if executor == "xla":  # each group's input starts whole: its copy loop is counted, not run
        assert "no loop" in prog.executable.source
        interp = ctx.compile(bounds=bounds, outputs=outs, config=tl.CompileConfig(
            executor="interpreter", ragged_buckets=4)).run()
        assert run.profile.calls == interp.profile.calls
    batched = ctx.compile(bounds=bounds, outputs=outs, config=tl.CompileConfig(
        executor=executor, vectorise_groups=True, ragged_buckets=4))
    # the input is read by each group's recurrence: it stays out of the group's batch (which
    # the loop would read through a view copied point by point), and nothing else is worth one
    assert not batched_dims(batched)
    if executor == "xla":
        assert "no loop" in batched.executable.source
    check(batched.run(), per_instance(data, lengths, SEPARABLE), lengths, SEPARABLE)
    one_box = ctx.compile(bounds=bounds, outputs=outs,
                          config=tl.CompileConfig(executor=executor, ragged_buckets=1))
    assert not one_box.passes.orders
    check(one_box.run(), per_instance(data, lengths, SEPARABLE), lengths, SEPARABLE)


@pytest.mark.executors(COMPILED, reason="grouping and group vectorisation are passes")
def test_each_length_group_batches_its_input_projection(executor):
    """A ragged RNN whose input projection ``x[b, t] @ w`` lies off the recurrence: each of the
    four length groups batches it over its own steps (the BiRNN benchmark's shape)."""
    lengths = np.random.RandomState(5).randint(1, 9, size=13)
    data = np.random.RandomState(2).randn(13, lengths.max(), D).astype(np.float32)
    w0 = np.random.RandomState(3).randn(D, D).astype(np.float32) * 0.5
    ctx = tl.Context(dims=("b", "t"))
    (b, t), (B, T) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.from_array(data, domain=(b, t))
        w = tl.constant(w0)
        h = tl.placeholder((D,), "float32", domain=(b, t))
        h[b, 0] = tl.tanh(x[b, 0] @ w)
        h[b, t] = tl.tanh(x[b, t] @ w + h[b, t - 1] * 0.5)
        y = h[b, T - 1]
    prog = ctx.compile(bounds={B: 13, T: tl.lengths(lengths, over=b)}, outputs={"y": y},
                       config=tl.CompileConfig(executor=executor, ragged_buckets=4))
    assert len(batched_dims(prog)) == 4
    want = []
    for k, n in enumerate(lengths):
        hk = np.tanh(data[k, 0] @ w0)
        for s in range(1, n):
            hk = np.tanh(data[k, s] @ w0 + hk * 0.5)
        want.append(hk)
    np.testing.assert_allclose(prog.run()["y"], np.stack(want), rtol=1e-5, atol=1e-5)


def test_groups_by_length_are_made_where_the_estimate_says_they_pay():
    """By default (``ragged_buckets=None``) a BiRNN is grouped by length only where its steps'
    arithmetic outweighs the loop steps the groups add: at batch 16, hidden 32 one box (four
    groups ran 1.33x its time), at batch 64, hidden 128 four groups (0.66x). Asked for, four
    groups are made either way; both agree with NumPy."""
    from benchmarks.autobatch import birnn_numpy, birnn_problem, birnn_tempo

    for batch, steps, hidden, grouped in ((16, 24, 32, False), (64, 64, 128, True)):
        p = birnn_problem(batch, steps, hidden)
        auto = birnn_tempo(p)
        assert bool(auto.passes.orders) is grouped, (batch, hidden)
        np.testing.assert_allclose(auto.run()["y"], birnn_numpy(p), rtol=1e-4, atol=1e-4)
    small = birnn_tempo(birnn_problem(16, 24, 32), groups=4)
    assert small.passes.orders


def test_instances_stay_one_box_when_one_op_reads_across_them():
    lengths = np.arange(1, 11)
    data = np.random.RandomState(2).randn(10, 10, D).astype(np.float32)
    for features in (("last", "batch"), ("last", "forward")):  # across b; an output over (b, t)
        ctx, bounds, outs = program(data, features, lengths)
        prog = ctx.compile(bounds=bounds, outputs=outs)
        assert not prog.passes.orders
        check(prog.run(), per_instance(data, lengths, features), lengths, features)


# -- trees ----------------------------------------------------------------------------------------
@pytest.mark.executors(("reference", "xla"), reason="for time: trees of several levels")
def test_gradient_through_ragged_trees_matches_jax_grad(executor):
    """A binary TreeLSTM over random trees in post-order: each node gathers its children's
    states out of the earlier nodes; node counts are ragged."""
    from benchmarks.autobatch import treelstm_numpy, treelstm_problem, treelstm_program

    p = treelstm_problem(5, 5, 4)
    ctx = tl.Context(dims=("b", "n"))
    B, N = ctx.bounds
    w, root = treelstm_program(ctx, p)
    with ctx:
        loss = (root * root).sum()
        g = tl.grad(loss, w)
    run = ctx.compile(bounds={B: 5, N: tl.lengths(p["lengths"], over=ctx.dims[0])},
                      outputs={"loss": loss, "g": g},
                      config=tl.CompileConfig(executor=executor)).run()

    def loss_jax(W):
        return (treelstm_numpy(p, jnp, W) ** 2).sum()
    np.testing.assert_allclose(run["loss"].sum(), loss_jax(p["w"]), rtol=1e-5)
    np.testing.assert_allclose(run["g"], jax.grad(loss_jax)(jnp.asarray(p["w"])), rtol=1e-4,
                               atol=1e-6)


@pytest.mark.executors(COMPILED, reason="grouping by size is a pass; the reference runs "
                        "the program as written")
def test_trees_grouped_by_size_match_numpy(executor):
    from benchmarks.autobatch import treelstm_numpy, treelstm_postorder_tempo, treelstm_problem

    p = treelstm_problem(10, 6, 8, seed=1)
    prog = treelstm_postorder_tempo(p, groups=4, executor=executor)
    assert prog.passes.orders  # ten trees of different sizes: grouped
    np.testing.assert_allclose(prog.run()["y"], treelstm_numpy(p), rtol=1e-4, atol=1e-5)
    if executor == "xla":  # the gates, used only inside the step's branch
        assert any(line.strip().startswith("z[") and line.endswith("[value]")
                   for line in prog.executable.source.splitlines())


def generate_trees(X, WL, WR, we, max_nodes, xp=np):
    """DRNN-style generation per instance: nodes in breadth-first order, each node expands
    into two children when ``state @ we > 0``; an instance ends when no node is pending.
    Returns each instance's sum of node states and node counts."""
    outs, sizes = [], []
    for x in X:
        states, cum, n = [xp.tanh(x)], [], 0
        while True:
            cum.append((cum[-1] if cum else 0) + int(float(jax.lax.stop_gradient(
                states[n] @ we)) > 0))
            if n == 2 * cum[n] or n + 1 == max_nodes:
                break
            n += 1
            parent = sum(1 for c in cum if c < (n - 1) // 2 + 1)
            states.append(xp.tanh(states[parent] @ (WL if n % 2 == 1 else WR)))
        sizes.append(n + 1)
        outs.append(xp.stack(states).sum(0))
    return xp.stack(outs), sizes


def test_generated_trees_end_per_instance_and_differentiate(executor):
    """Generation with data-dependent branching: node n's parent is found from the running
    count of expanding nodes, the tree ends per instance (tl.until over (b, n)), and the
    gradient through the generated states matches jax.grad."""
    H, max_nodes = 6, 15
    rs = np.random.RandomState(4)
    X = rs.randn(7, H).astype(np.float32)
    WL, WR = ((rs.randn(H, H) * 0.8).astype(np.float32) for _ in range(2))
    we = rs.randn(H).astype(np.float32)
    ctx = tl.Context(dims=("b", "n"))
    b, n = ctx.dims
    B, N = ctx.bounds
    with ctx:
        wl, wr, w_e = tl.constant(WL), tl.constant(WR), tl.constant(we)
        s = tl.placeholder((H,), "float32", domain=(b, n))
        expands = ((s @ w_e) > 0.0).astype("int32")
        cum = tl.placeholder((), "int32", domain=(b, n))   # expanding nodes up to n
        cum[b, 0] = expands[b, 0]
        cum[b, n] = cum[b, n - 1] + expands
        k = (tl.zeros((), "int32") + (n - 1)) // 2        # n is a child of the k-th expanding
        parent = (cum[b, 0:n] < k + 1).astype("int32").sum()
        ps = tl.take(s[b, 0:n], parent, axis=0)
        s[b, 0] = tl.tanh(tl.from_array(X, domain=(b,)))
        s[b, n] = tl.tanh(tl.where(tl.eq(n % 2, 1), ps @ wl, ps @ wr))
        done = tl.eq(tl.zeros((), "int32") + n, cum * 2)    # nothing pending after node n
        total = s[b, 0:N].sum(axis=0)
        gl, gr = tl.grad((total * total).sum(), [wl, wr])
    run = ctx.compile(bounds={B: 7, N: tl.until(done, max=max_nodes)},
                      outputs={"total": total, "gl": gl, "gr": gr},
                      config=tl.CompileConfig(executor=executor)).run()
    want, sizes = generate_trees(X, WL, WR, we, max_nodes)
    assert run.lengths["N"][1].tolist() == sizes and len(set(sizes)) > 2
    np.testing.assert_allclose(run["total"], want, rtol=1e-5, atol=1e-5)

    def loss(WL, WR):
        return (generate_trees(X, WL, WR, we, max_nodes, jnp)[0] ** 2).sum()
    for got, w in zip((run["gl"], run["gr"]), jax.grad(loss, argnums=(0, 1))(WL, WR)):
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-4)


def test_other_dim_names_and_bad_group_counts():
    ctx = tl.Context(dims=("seq", "t_step"))
    s, ts = ctx.dims
    S, TS = ctx.bounds
    with ctx:
        x = tl.zeros(()) + ts + s
    run = ctx.compile(bounds={S: 2, TS: tl.lengths(np.array([1, 3]), over=s)},
                      outputs={"x": x}).run()
    assert run.mask("x").tolist() == [[True, False, False], [True, True, True]]
    assert [v.tolist() for v in run.instances("x")] == [[0], [1, 2, 3]]
    with pytest.raises(tl.ArgumentError, match="ragged_buckets"):
        tl.CompileConfig(ragged_buckets=0)


def test_a_masked_range_through_squeeze_keeps_its_axis():
    """x[b, 0:T] of shape (T, 1, 2): squeezing the size-1 axis moves the range's axis from
    -3 to -2; the mask must follow it to the max that reduces the range."""
    lengths = np.array([2, 4, 1])
    data = np.random.RandomState(0).randn(3, 4, 1, 2).astype(np.float32)
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, T = ctx.bounds
    with ctx:
        x = tl.from_array(data, domain=(b, t))
        y = x[b, 0:T].squeeze(axis=1).max(axis=0)
    want = np.stack([data[k, :n, 0].max(axis=0) for k, n in enumerate(lengths)])
    for executor in ALL:
        run = ctx.compile(bounds={B: 3, T: tl.lengths(lengths, over=b)}, outputs={"y": y},
                          config=tl.CompileConfig(executor=executor)).run()
        np.testing.assert_allclose(run["y"], want, rtol=1e-6, err_msg=executor)


def stacked(data, lengths, weights):
    """A deep stack written out layer by layer (each a recurrence, alternating directions,
    with a residual), pooled over each instance's own steps: hundreds of ops."""
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, T = ctx.bounds
    with ctx:
        h = tl.from_array(data, domain=(b, t))
        for k, W in enumerate(weights):
            with tl.scope(f"layer{k}"):
                w = tl.constant(W)
                s = tl.placeholder((data.shape[-1],), "float32", domain=(b, t))
                if k % 2:
                    s[b, T - 1] = tl.tanh(h[b, T - 1] @ w)
                    s[b, t] = tl.tanh(h @ w + s[b, t + 1] * 0.5)
                else:
                    s[b, 0] = tl.tanh(h[b, 0] @ w)
                    s[b, t] = tl.tanh(h @ w + s[b, t - 1] * 0.5)
                h = s + h
        pooled = h[b, 0:T].mean(axis=0) + h[b, T - 1]
    bound = tl.lengths(lengths, over=b) if lengths is not None else data.shape[1]
    return ctx, {B: data.shape[0], T: bound}, {"pooled": pooled}


def test_a_program_of_hundreds_of_ops_matches_the_reference_and_each_instance_alone():
    rs = np.random.RandomState(0)
    lengths = rs.randint(1, 8, size=10)
    data = rs.randn(10, lengths.max(), 4).astype(np.float32)
    weights = [(rs.randn(4, 4) * 0.5).astype(np.float32) for _ in range(24)]
    ctx, bounds, outs = stacked(data, lengths, weights)
    want = ctx.compile(bounds=bounds, outputs=outs,
                       config=tl.CompileConfig(executor="reference")).run()["pooled"]
    for executor in DISTINCT_COMPILED:
        prog = ctx.compile(bounds=bounds, outputs=outs,
                           config=tl.CompileConfig(executor=executor, ragged_buckets=4))
        assert len(prog.passes.initial.ops) > 200 and len(prog.sdg.ops) > 400  # 4 groups
        assert prog.passes.orders
        np.testing.assert_allclose(prog.run()["pooled"], want, rtol=1e-4, atol=1e-5)
    k = int(np.argmin(lengths))
    one, b1, o1 = stacked(data[k:k + 1, :lengths[k]], None, weights)
    alone = one.compile(bounds=b1, outputs=o1,
                        config=tl.CompileConfig(executor="reference")).run()["pooled"][0]
    np.testing.assert_allclose(want[k], alone, rtol=1e-5, atol=1e-6)


def test_ragged_bounds_survive_save_and_load(tmp_path):
    lengths = np.array([3, 6, 1, 4, 6])
    data = np.random.RandomState(1).randn(5, 6, D).astype(np.float32)
    ctx, bounds, outs = program(data, ("last", "sum"), lengths)
    prog = ctx.compile(bounds=bounds, outputs=outs)
    tl.save(prog, tmp_path / "p.json")
    back = tl.load(tmp_path / "p.json")
    (r,) = back.passes.initial.ragged.values()
    assert r.over == "b" and r.lengths.tolist() == lengths.tolist()
    assert back.passes.initial.pretty() == prog.passes.initial.pretty()


@pytest.mark.executors(COMPILED, reason="group vectorisation is a pass; the reference runs "
                        "the program as written")
def test_an_input_array_read_over_the_ragged_range_with_group_vectorisation(executor):
    """``x[b, 0:T]`` of an input array whose ``t`` extent is the longest length, vectorised
    beside a mask of ``T`` padded to its size class, and a point read at each instance's end:
    the operands of the mask's ``where`` had 7 and 8 points (InternalError before)."""
    lengths = np.array([7, 3, 5])
    data = np.random.default_rng(0).standard_normal((3, 7, 4)).astype(np.float32)
    ctx = tl.Context(dims=("b", "t"))
    (b, t), (B, T) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.from_array(data, domain=(b, t), name="x")
        h = tl.placeholder((4,), domain=(b, t), name="h")
        h[b, 0] = x[b, 0]
        h[b, t] = tl.tanh(h[b, t - 1] * 0.5 + x[b, t])
        y = x[b, 0:T].sum(axis=0) + h[b, T - 1]
    bounds = {B: 3, T: tl.lengths(lengths, over=b)}
    want = np.zeros((3, 4), np.float32)
    for k, n in enumerate(lengths):
        hk = data[k, 0]
        for s in range(1, n):
            hk = np.tanh(hk * 0.5 + data[k, s])
        want[k] = data[k, :n].sum(axis=0) + hk
    run = ctx.compile(bounds=bounds, outputs={"y": y}, config=tl.CompileConfig(
        executor=executor, vectorise_groups=True)).run()
    np.testing.assert_allclose(run["y"], want, rtol=1e-5, atol=1e-5)
