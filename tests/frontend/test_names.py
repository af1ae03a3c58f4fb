"""Names from the source: the user's variables name the ops that hold their values, and the
public functions of tl.nn, tl.rl, tl.optim and tl.random open scopes named after them. Names
are for the views: compiled results and output names do not change."""
import linecache

import numpy as np
import pytest

import tempo_lab as tl
from tempo_lab.frontend.build import build_sdg
from tempo_lab.frontend.names import SourceNames

RNG = np.random.default_rng(0)
W = RNG.normal(size=(8, 8)).astype(np.float32)
X = RNG.normal(size=(5, 8)).astype(np.float32)


def _sdg(ctx, outputs):
    ctx._source.flush()
    return build_sdg(ctx, outputs)


def _named(sdg, name):
    return [op for op in sdg.ops.values() if op.name == name]


def test_assignment_targets_name_the_ops_that_hold_their_values():
    def rms_norm(x):
        return x / tl.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6)

    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        h = tl.from_array(X, domain=(t,))
        x = rms_norm(h)                       # a user function's result: its caller's name
        q = tl.nn.rope((x @ W).reshape(2, 4), t)      # a library call's result
        a, b = x * 2.0, x + 1.0               # tuple targets
        c: tl.RecurrentTensor = a - b         # annotated
        c += a                                # augmented: a new value, named again
        prev = x[t - 1]                       # a view is no op: x keeps its name
        s = tl.nn.silu(prev)
    sdg = _sdg(ctx, {"q": q, "c": c, "s": s})
    kinds = {op.name: op.kind for op in sdg.ops.values() if op.name}
    assert kinds["x"] == "div" and kinds["q"] == "concatenate" and kinds["s"] == "mul"
    assert kinds["a"] == "mul" and kinds["b"] == "add"
    assert [op.kind for op in _named(sdg, "c")] == ["sub", "add"]
    assert len(_named(sdg, "x")) == 1 and not _named(sdg, "prev")


def test_a_loop_names_every_iteration_and_given_names_stay():
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        y = tl.from_array(X, domain=(t,), name="inputs")
        for _ in range(3):
            y = y * 0.9 + 0.1                 # one statement, run three times
        z = tl.placeholder((8,), domain=(t,), name="state")
        z[0] = y
        z[t] = z[t - 1] * 0.5 + y
        w = z                                 # no op made here: z keeps its name
    sdg = _sdg(ctx, {"w": w})
    assert [op.kind for op in _named(sdg, "y")] == ["add"] * 3
    assert len(_named(sdg, "inputs")) == 1 and len(_named(sdg, "state")) == 1
    assert not _named(sdg, "w")


def test_nested_user_functions_and_statements_over_several_lines():
    def block(h, k):
        with tl.scope(f"layer{k}"):
            gate = tl.nn.silu(
                h @ W)
            return h + gate

    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        h = tl.from_array(X, domain=(t,))
        for k in range(2):
            h = block(h, k)
    sdg = _sdg(ctx, {"h": h})
    gates = _named(sdg, "gate")
    assert [op.scope for op in gates] == [("layer0", "silu"), ("layer1", "silu")]
    assert [op.scope for op in _named(sdg, "h") if op.kind == "add"] == [("layer0",),
                                                                        ("layer1",)]


def test_source_in_linecache_as_a_notebook_cell():
    """IPython compiles a cell under a file name of its own and keeps the source in
    linecache; names come from there as from a file."""
    src = ("ctx = tl.Context(dims=('t',))\n(t,) = ctx.dims\nwith ctx:\n"
           "    h = tl.from_array(X, domain=(t,))\n    att = tl.nn.silu(h) * 2.0\n")
    filename = "<ipython-input-7-names>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    try:
        env = {"tl": tl, "X": X}
        exec(compile(src, filename, "exec"), env)
        sdg = _sdg(env["ctx"], {"att": env["att"]})
    finally:
        linecache.cache.pop(filename, None)
    assert [op.kind for op in _named(sdg, "att")] == ["mul"]


def test_library_calls_open_scopes():
    ctx = tl.Context(dims=("i", "t"))
    i, t = ctx.dims
    with ctx:
        p = tl.optim.parameters({"w": W}, dim=i)
        x = tl.random.normal((8,), domain=(i, t), seed=1)
        hidden = tl.nn.RMSNorm(8)({"scale": np.ones(8, np.float32)}, x @ p["w"])
        loss = (hidden ** 2).mean()
        tl.optim.Adam(lr=1e-3).minimize(loss, p)
        perm = tl.random.permutation(t, 4, domain=(i,))
    sdg = _sdg(ctx, {"loss": loss, "perm": perm})
    scopes = {op.scope for op in sdg.ops.values()}
    assert ("rms_norm",) in scopes and ("permutation",) in scopes
    # the optimiser's phases stay as they were; its update's ops are in a scope "adam"
    assert ("gradient",) in scopes and ("update", "adam") in scopes
    assert ("parameters",) in scopes
    assert _named(sdg, "hidden")[0].scope == ("rms_norm",)


def test_user_scopes_hold_library_scopes_and_a_scope_is_not_repeated():
    mha = tl.nn.MultiHeadAttention(8, 2)
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        x = tl.from_array(X, domain=(t,))
        with tl.scope("layer0"):
            y = mha(mha.init(), x, t)
    sdg = _sdg(ctx, {"y": y})
    scopes = {op.scope for op in sdg.ops.values()}
    assert ("layer0", "attention") in scopes          # MultiHeadAttention, then attention()
    assert not any(s.count("attention") > 1 for s in scopes)
    assert _named(sdg, "y")[0].scope == ("layer0", "attention")


def test_ppo_finds_adam_and_clip():
    ctx = tl.Context(dims=tl.rl.PPOConfig.DIMS)
    tr = tl.rl.ppo(ctx, tl.rl.CartPole(), tl.rl.PPOConfig())
    sdg = _sdg(ctx, {"return": tr.episode_return, "loss": tr.loss})
    flat = {s for op in sdg.ops.values() for s in op.scope}
    assert {"adam", "clip", "permutation", "rollout", "gae"} <= flat


def test_names_change_neither_results_nor_output_names(monkeypatch):
    def program():
        ctx = tl.Context(dims=("t",))
        (t,), (T,) = ctx.dims, ctx.bounds
        with ctx:
            h = tl.from_array(X, domain=(t,))
            g = tl.nn.silu(h @ W)
            out = tl.nn.rope(g.reshape(2, 4), t)
            twice = h * 2.0
        return ctx.compile(bounds={T: 5}, outputs=[out, twice])

    prog = program()
    assert any(op.name == "out" for op in prog.passes.initial.ops.values())
    named = prog.run()
    monkeypatch.setattr(SourceNames, "observe", lambda self, node: None)
    plain = program()
    assert not any(op.name == "out" for op in plain.passes.initial.ops.values())
    got = plain.run()
    # out is named in the views only; twice by the assignment, as before
    assert sorted(named.keys()) == sorted(got.keys()) == ["out0", "twice"]
    for k in got.keys():
        np.testing.assert_array_equal(named[k], got[k])


@pytest.mark.parametrize("bad", [None, 3])
def test_scope_still_checks_its_name(bad):
    with pytest.raises(tl.TempoLabError):
        tl.scope(bad)
