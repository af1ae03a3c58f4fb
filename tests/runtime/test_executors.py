"""Every executor (the loop-AST interpreter, generated code, XLA loops) on the semantic programs
of test_execution.py, against NumPy and the reference interpreter; the automatic choice; the
executable stage objects; predicted vs measured store bytes per executor; what recompiles.
"""
from __future__ import annotations

import functools
import json
import re
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import rt_helpers
from hypothesis import given, settings
from hypothesis import strategies as st
from rt_helpers import ALL, COMPILED, DISTINCT

import tempo_lab as tl
from tempo_lab.demo import decoder, make_weights, numpy_decoder
from tempo_lab.runtime import xla_plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ is not a package

from test_execution import (  # noqa: E402
    counter,
    numpy_recurrence,
    op_named,
    recurrence_then_read,
)

# lowered programs, schedules and measured store bytes: the back ends' (the reference has none)
pytestmark = pytest.mark.executors(COMPILED, reason="checks what only the back ends have")
REFERENCE = tl.CompileConfig(executor="reference")


def cfg(executor: str, **kw) -> tl.CompileConfig:
    return tl.CompileConfig(executor=executor, **kw)


close = functools.partial(rt_helpers.close, rtol=1e-4, atol=1e-4, same_shape=False)


def assert_peaks_agree(prog, run, rel=0.10):
    """The executable's predicted peak of store bytes and the profile's measured one agree.
    Interpreter and generated code: the memory plan's timeline (stores grow and are freed as
    the schedule runs); XLA loops: the statically sized stores the XLA program carries."""
    pred, meas = prog.executable.predicted_peak_bytes, run.profile.peak_bytes
    assert pred > 0 and meas > 0, (pred, meas)
    assert abs(pred - meas) <= rel * max(pred, meas), (prog.executor, pred, meas)


# ------------------------------------------------------------------------------------------------
# the memory programs: window vs causal reads
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("read", ["window", "causal"])
def test_window_and_causal_reads(executor, read):
    ctx, T, z = recurrence_then_read(read)
    peaks = []
    for n in (16, 40):
        prog = ctx.compile(bounds={T: n}, outputs={"z": z}, config=cfg(executor))
        assert prog.executor == executor
        run = prog.run()
        x = numpy_recurrence(n)
        close(run["z"], x[-4:].sum(axis=0) if read == "window" else x.sum(axis=0))
        assert_peaks_agree(prog, run)
        peaks.append(run.profile.peak_bytes)
    if read == "window":
        assert peaks[0] == peaks[1]  # a ring of 4 whatever T
    else:
        assert peaks[1] >= peaks[0]


def test_storage_kinds_program_with_every_read_kind(executor):
    a = np.random.default_rng(0).standard_normal((9, 3)).astype(np.float32)
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    (T,) = ctx.bounds
    with ctx:
        x = tl.from_array(a, domain=(t,), name="x")
        q = tl.exp(x) * 2.0
        r = tl.placeholder((3,), "float32", domain=(t,), name="r")
        r[t < 2] = tl.zeros((3,))
        r[t] = q[t - 2] + 1.0
        s = r[t:T].sum(axis=0) + r[tl.min(t + 1, T - 1)] + x[0:t + 1].max(axis=0)
        last = r[T - 1]
    outs = {"r": r, "s": s, "last": last}
    for fuse in (False, True):
        prog = ctx.compile(bounds={T: 9}, outputs=outs, config=cfg(executor, fuse=fuse))
        run = prog.run()
        ref = ctx.compile(bounds={T: 9}, outputs=outs, config=REFERENCE).run()
        for name in outs:
            close(run[name], ref[name], msg=f"{executor} {name} fuse={fuse}")
        assert_peaks_agree(prog, run)


# ------------------------------------------------------------------------------------------------
# the decoders
# ------------------------------------------------------------------------------------------------
LAYERS, EMBED, HEADS, STEPS, BATCH, WINDOW = 2, 16, 2, 12, 2, 4


@pytest.fixture  # seeded and cheap: per test, so these tests are not held to one xdist worker
def weights():
    return make_weights(LAYERS, EMBED, 2 * EMBED)


def _last_layer(weights, tokens):
    """The demo decoder over (n, t); ``y`` is the last layer's output at every step."""
    ctx = tl.Context(dims=("n", "t"))
    _, t = ctx.dims
    N, T = ctx.bounds
    h_out = decoder(ctx, weights, tokens, HEADS)
    with ctx:
        y = h_out[N - 1, t]
    return ctx, N, T, y


def test_causal_decoder(weights, executor):
    tokens = np.random.default_rng(1).standard_normal((STEPS, EMBED)).astype(np.float32)
    ctx, N, T, y = _last_layer(weights, tokens)
    prog = ctx.compile(bounds={N: LAYERS, T: STEPS}, outputs={"y": y}, config=cfg(executor))
    run = prog.run()
    close(run["y"], numpy_decoder(weights, tokens, HEADS), msg=executor)
    assert_peaks_agree(prog, run)


@pytest.mark.executors(("reference", "xla"), reason="tiled for xla too, which pads per span "
                        "when untiled")
def test_causal_decoder_tiled(weights, executor):
    """The decoder's attention over blocks of 5 steps (passes/tile.py): 3 blocks at T = 12."""
    tokens = np.random.default_rng(3).standard_normal((STEPS, EMBED)).astype(np.float32)
    ctx, N, T, y = _last_layer(weights, tokens)
    prog = ctx.compile(bounds={N: LAYERS, T: STEPS}, outputs={"y": y},
                       config=cfg(executor, tile_block=5, check_invariants=True))
    assert prog.bounds["T_TILE"] == 3
    assert "softmax" not in {op.kind for op in prog.sdg.ops.values()}
    close(prog.run()["y"], numpy_decoder(weights, tokens, HEADS), msg=executor)


def test_batched_window_decoder(weights, executor):
    tokens = np.random.default_rng(2).standard_normal((BATCH, STEPS, EMBED)).astype(np.float32)
    ctx = tl.Context(dims=("b", "n", "t"))
    b, n, t = ctx.dims
    B, N, T = ctx.bounds
    h_out = decoder(ctx, weights, tokens, HEADS, WINDOW)
    with ctx:
        y = h_out[b, N - 1, t]
    prog = ctx.compile(bounds={B: BATCH, N: LAYERS, T: STEPS}, outputs={"y": y},
                       config=cfg(executor))
    run = prog.run()
    want = np.stack([numpy_decoder(weights, tokens[i], HEADS, WINDOW) for i in range(BATCH)])
    close(run["y"], want, msg=executor)
    assert_peaks_agree(prog, run)


# ------------------------------------------------------------------------------------------------
# data-dependent bounds, dimval, a program reading its own earlier point
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("threshold, reached", [(5.0, 6), (100.0, 20)])
def test_until(executor, threshold, reached):
    ctx, T, c, done, outs = counter(threshold)
    prog = ctx.compile(bounds={T: tl.until(done, max=20)}, outputs=outs, config=cfg(executor))
    run = prog.run()
    assert run.bounds["T"] == reached
    np.testing.assert_array_equal(run["c"], np.arange(reached, dtype=np.float32))
    assert float(run["total"]) == sum(range(reached))
    assert float(run["last"]) == reached - 1


def test_until_with_a_second_dim(executor):
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, T = ctx.bounds
    with ctx:
        c = tl.placeholder((), "float32", domain=(t,), name="c")
        c[0] = tl.zeros(())
        c[t] = c[t - 1] + 1.0
        x = tl.placeholder((), "float32", domain=(b, t), name="x")
        x[b, 0] = tl.zeros(()) + b
        x[b, t] = x[b, t - 1] + c
        done = c >= 3.0
    bounds = {B: 2, T: tl.until(done, max=10)}
    run = ctx.compile(bounds=bounds, outputs={"x": x}, config=cfg(executor)).run()
    assert run.bounds == {"B": 2, "T": 4}
    np.testing.assert_array_equal(run["x"], [[0, 1, 3, 6], [1, 2, 4, 7]])


def test_dim_values_and_a_copy_of_an_earlier_point(executor):
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        x[0] = 1.0
        x[t] = x[t - 1]
        y = (tl.zeros((2,)) + t) * 0.5 + x
    run = ctx.compile(bounds={T: 5}, outputs={"x": x, "y": y}, config=cfg(executor)).run()
    close(run["x"], np.ones(5))
    close(run["y"], np.arange(5)[:, None] * 0.5 + np.ones((5, 2)))


def test_max_over_an_empty_range_is_an_error_on_every_executor(executor):
    """XLA cannot raise inside its program: it records the first empty point and raises the
    same error when the program returns."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.zeros((2,)) + t
        y = x[0:t].max(axis=0)          # empty at t = 0
    with pytest.raises(tl.ShapeError, match=r"empty axis at \{'t': 0\}"):
        ctx.compile(bounds={T: 4}, outputs={"y": y}, config=cfg(executor)).run()


# ------------------------------------------------------------------------------------------------
# sinks and sources: host callbacks (auto keeps them off XLA, where they serialise the program)
# ------------------------------------------------------------------------------------------------
def _sink_program(calls):
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    (T,) = ctx.bounds
    with ctx:
        x = tl.placeholder((3,), "float32", domain=(t,), name="x")
        x[0] = tl.ones((3,))
        x[t] = x[t - 1] * 2.0
        tl.sink(x[tl.max(0, t - 1):t + 1], lambda p, v: calls.append((p["t"], np.array(v))))
    return ctx, T, x


def test_sinks(executor):
    calls = []
    ctx, T, x = _sink_program(calls)
    ctx.compile(bounds={T: 5}, outputs={"last": x[T - 1]}, config=cfg(executor)).run()
    assert [i for i, _ in calls] == list(range(5))
    for i, v in calls:
        want = np.stack([np.full(3, 2.0 ** j, np.float32) for j in range(max(0, i - 1), i + 1)])
        np.testing.assert_array_equal(v, want)


def test_auto_keeps_sinks_and_sources_off_xla_and_says_why():
    calls = []
    ctx, T, x = _sink_program(calls)
    prog = ctx.compile(bounds={T: 5}, outputs={"last": x[T - 1]})
    assert prog.executor == "codegen"
    text = prog.executable.pretty()
    assert "auto chose codegen" in text and "sink" in text, text
    assert prog.executable.to_dict()["choice"][0].startswith("auto chose codegen")
    forced = ctx.compile(bounds={T: 5}, outputs={"last": x[T - 1]}, config=cfg("xla"))
    assert "[host callback]" in forced.executable.source

    ctx2 = tl.Context(dims=("t",))
    (t,), (T2,) = ctx2.dims, ctx2.bounds
    with ctx2:
        s = tl.source(lambda p: np.full(2, p["t"], np.float32), (2,), "float32", domain=(t,))
        y = s * 2.0
    prog2 = ctx2.compile(bounds={T2: 3}, outputs={"y": y})
    assert prog2.executor == "codegen" and "source" in prog2.executable.pretty()
    close(prog2.run()["y"], np.arange(3)[:, None] * np.full((1, 2), 2.0))
    close(prog2.on("xla").run()["y"], np.arange(3)[:, None] * np.full((1, 2), 2.0))


def test_auto_picks_xla_for_a_program_without_host_callbacks():
    ctx, T, z = recurrence_then_read("window")
    prog = ctx.compile(bounds={T: 16}, outputs={"z": z})
    assert prog.executor == "xla" and prog.config.executor == "auto"
    assert "auto chose xla" in prog.executable.pretty()
    assert "executor=xla" in repr(prog)


# ------------------------------------------------------------------------------------------------
# stage objects
# ------------------------------------------------------------------------------------------------
def test_executables_and_profiles_are_stage_objects(executor):
    def make():
        ctx, T, z = recurrence_then_read("causal", (3,))
        prog = ctx.compile(bounds={T: 8}, outputs={"z": z}, config=cfg(executor))
        return prog, prog.run()

    (p1, r1), (p2, r2) = make(), make()
    for a, b in ((p1.executable, p2.executable), (r1.profile, r2.profile)):
        rep = repr(a)
        assert "\n" not in rep and "0x" not in rep and rep == repr(b), rep
        text = a.pretty()
        assert text.splitlines()[0] == rep and re.search(r"^\S[^\n]*:$", text, re.M), text
        assert "0x" not in a._repr_html_()
        d = a.to_dict()
        json.dumps(d)
        assert re.fullmatch(r"tempo_lab\.\w+/\d+", d["schema"])
    assert p1.executable.pretty() == p2.executable.pretty()
    assert r1.profile.calls == r2.profile.calls and sum(r1.profile.calls.values()) > 0
    x_id = op_named(p1, "x")
    assert r1.profile.calls[x_id] == 8  # one instance per t, measured by every executor
    if executor != "interpreter":
        src = p1.executable.source
        assert isinstance(src, str) and ("for i_t in" in src or "fori_loop" in src), src


def test_generated_source_is_python_with_the_loop_structure():
    ctx, T, z = recurrence_then_read("window", (3,))
    prog = ctx.compile(bounds={T: 8}, outputs={"z": z}, config=cfg("codegen"))
    src = prog.executable.source
    compile(src, "<generated>", "exec")
    assert src.startswith("def program(R, N_T):")
    assert "for i_t in range(0, N_T):" in src
    assert "% 4" in src  # the ring of 4: slot arithmetic inlined


# ------------------------------------------------------------------------------------------------
# what recompiles
# ------------------------------------------------------------------------------------------------
def _xla_programs() -> int:
    """XLA compilations of whole programs: one compiled program per cache entry."""
    from tempo_lab.runtime import xla as xla_loops

    return len(xla_loops._PROGRAMS)


def test_xla_another_T_in_the_same_size_class_does_not_recompile():
    from tempo_lab.runtime import xla as xla_loops

    xla_loops._PROGRAMS.clear()  # the cache keeps 64 programs: counting near the cap misleads
    shape = (9,)  # no other test uses it
    ctx, T, z = recurrence_then_read("causal", shape)
    ctx.compile(bounds={T: 20}, outputs={"z": z}, config=cfg("xla")).run()
    before = _xla_programs()
    run = ctx.compile(bounds={T: 30}, outputs={"z": z}, config=cfg("xla")).run()  # 32 either way
    assert _xla_programs() == before
    close(run["z"], numpy_recurrence(30, shape).sum(axis=0))
    ctx.compile(bounds={T: 40}, outputs={"z": z}, config=cfg("xla")).run()  # size class 64
    assert _xla_programs() == before + 1


def test_xla_window_program_compiles_once_for_every_T():
    from tempo_lab.runtime import xla as xla_loops

    xla_loops._PROGRAMS.clear()
    shape = (10,)
    ctx, T, z = recurrence_then_read("window", shape)
    ctx.compile(bounds={T: 20}, outputs={"z": z}, config=cfg("xla")).run()
    before = _xla_programs()
    for n in (21, 33):  # the ring, the output and every read have fixed sizes
        run = ctx.compile(bounds={T: n}, outputs={"z": z}, config=cfg("xla")).run()
        close(run["z"], numpy_recurrence(n, shape)[-4:].sum(axis=0))
    assert _xla_programs() == before


def test_program_on_another_executor_shares_the_compilation():
    ctx, T, z = recurrence_then_read("causal", (3,))
    prog = ctx.compile(bounds={T: 8}, outputs={"z": z}, config=cfg("codegen"))
    want = prog.run()["z"]
    for executor in (*DISTINCT, "auto"):
        other = prog.on(executor)
        assert other.schedule is prog.schedule and other.memory is prog.memory
        close(other.run()["z"], want, msg=executor)


# ------------------------------------------------------------------------------------------------
# the semantic programs under other pass switches, every executor against the reference
# ------------------------------------------------------------------------------------------------
SWITCH_SETS = {  # all on is every test above; the random-program test samples all 64
    "all off": dict(simplify=False, fold_constants=False, cse=False, dce=False,
                    vectorise=False, fuse=False),
    "no vectorise, no fuse": dict(vectorise=False, fuse=False),
    "no simplify, cse, dce": dict(simplify=False, cse=False, dce=False),
}


def _semantic_programs(weights):
    """(name, ctx, bounds, outputs) for the programs above (decoders small)."""
    out = []
    for read in ("window", "causal"):
        ctx, T, z = recurrence_then_read(read, (3,))
        out.append((read, ctx, {T: 9}, {"z": z}))
    ctx, T, c, done, outs = counter(4.0)
    out.append(("until", ctx, {T: tl.until(done, max=12)}, outs))
    tokens = np.random.default_rng(3).standard_normal((2, 6, EMBED)).astype(np.float32)
    ctx = tl.Context(dims=("b", "n", "t"))
    b, n, t = ctx.dims
    B, N, T = ctx.bounds
    h_out = decoder(ctx, weights, tokens, HEADS, 3)
    with ctx:
        y = h_out[b, N - 1, t]
    out.append(("window decoder", ctx, {B: 2, N: LAYERS, T: 6}, {"y": y}))
    return out


@pytest.mark.parametrize("switches", list(SWITCH_SETS))
def test_semantic_programs_under_pass_switches_on_every_executor(weights, switches):
    for name, ctx, bounds, outs in _semantic_programs(weights):
        ref = ctx.compile(bounds=bounds, outputs=outs, config=REFERENCE).run()
        prog = ctx.compile(bounds=bounds, outputs=outs,
                           config=cfg("interpreter", check_invariants=True,
                                      **SWITCH_SETS[switches]))
        for executor in COMPILED:
            run = prog.on(executor).run()
            assert run.bounds == ref.bounds
            for k in outs:
                close(run[k], ref[k], msg=f"{name}, {switches}, {executor}: {k}")


def test_xla_splits_a_loop_whose_reads_grow_and_stays_exact(weights):
    """A causal read under a loop of T = 150 (size class 256), left untiled, with the layers
    a loop (stacked keys: ``XlaOptions(unroll_steps=1)``): 8 spans of 32 steps, each padding
    ``0:t+1`` to its own largest length. Tiled, nothing grows: one loop. The automatic block
    leaves it untiled on this executor unless the loop is not split. With the layers
    unrolled, each layer's keys are a buffer read whole in place: the loop is not split."""
    from tempo_lab.runtime.xla import XlaBackend
    from tempo_lab.runtime.xla_options import XlaOptions

    tokens = np.random.default_rng(4).standard_normal((150, EMBED)).astype(np.float32)
    ctx, N, T, y = _last_layer(weights, tokens)
    want = numpy_decoder(weights, tokens, HEADS)
    prog = ctx.compile(bounds={N: LAYERS, T: 150}, outputs={"y": y}, config=cfg("xla"))
    assert "not split: its growing reads are whole buffers" in prog.executable.source
    close(prog.run()["y"], want, msg="unrolled")
    for split, kw, tiled in ((8, {"tile": False}, False), (1, {"tile": False}, False),
                             (8, {"tile_block": 32}, True), (8, {}, False), (1, {}, True)):
        prog = ctx.compile(bounds={N: LAYERS, T: 150}, outputs={"y": y},
                           config=cfg("xla", xla_split=split, **kw))
        assert ("T_TILE" in prog.bounds) == tiled, (split, kw)
        ex = prog.lowered.compile(XlaBackend(XlaOptions(split=split, unroll_steps=1)))
        assert ("8 spans of 32 steps" in ex.source) == (split == 8 and not tiled), ex.source
        close(ex.run()["y"], want, msg=f"xla_split={split}, {kw}")
    notes = [n for r in ctx.compile(bounds={N: LAYERS, T: 150}, outputs={"y": y},
                                    config=cfg("xla")).passes.records if r.name == "tile"
             for n in (ev.note for ev in r.events if ev.kind == "note")]
    assert notes and all("static size per span" in n for n in notes), notes


# ------------------------------------------------------------------------------------------------
# user names reach generated code only escaped; compiler-made dims are not told by their names
# ------------------------------------------------------------------------------------------------
@pytest.mark.executors(ALL, reason="names reach the reference's output too")
def test_names_with_quotes_and_newlines(executor):
    calls = []
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.placeholder((2,), "float32", domain=(t,), name='x"\n\'); import os #')
        x[0] = tl.ones((2,))
        x[t] = x[t - 1] * 2.0
        y = tl.from_array(np.ones((5, 2), np.float32), domain=(t,), name="y'''\\") + x
        tl.sink(y, lambda p, v: calls.append(p["t"]))
    name = 'it\'s "y"\n\\'
    run = ctx.compile(bounds={T: 5}, outputs={name: y}, config=cfg(executor)).run()
    close(run[name], 1.0 + 2.0 ** np.arange(5)[:, None] * np.ones(2))
    assert calls == list(range(5))


def test_a_user_dim_named_like_a_compiler_dim(executor):
    """Tiling makes a dim for its blocks; a user dim called ``t_tile`` (or ``b_blk``) is still
    the user's: made dims are marked by role, not by name."""
    ctx = tl.Context(dims=("t_tile", "t"))
    (u, t), (U, T) = ctx.dims, ctx.bounds
    xs = np.random.default_rng(0).standard_normal((3, 12, 4)).astype(np.float32)
    with ctx:
        x = tl.from_array(xs, domain=(u, t))
        y = x[u, 0:t + 1].sum(axis=0)
    prog = ctx.compile(bounds={U: 3, T: 12}, outputs={"y": y},
                       config=cfg(executor, tile_block=4))
    close(prog.run()["y"], np.cumsum(xs, axis=1))
    roles = {d.name: prog.sdg.role(d) for d in prog.sdg.dims}
    assert roles["t_tile"] is None and "blocks" in roles.values(), roles  # tiled, and a new dim


def test_xla_profile_attributes_thunks_to_named_scopes():
    """Each thunk's measured time goes to the jax.named_scope it was traced in (a fusion to
    its root's); control flow is not counted on top of its body; the rest is unattributed."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    from tempo_lab.runtime.xla_profile import instruction_scopes, seconds_by

    @jax.jit
    def f(x, w):
        with jax.named_scope("dense"):
            y = jnp.tanh(x @ w)
        with jax.named_scope("loop"):
            z, _ = lax.scan(lambda c, r: (jnp.tanh(c + r), None), y[0], y)
        return z.sum()

    x, w = jnp.ones((256, 128)), jnp.full((128, 128), 0.01)
    hlo = f.lower(x, w).compile().as_text()
    scopes = instruction_scopes(hlo)
    assert any("/dense/" in p for p in scopes.values())
    loops = re.findall(r"%([\w.\-]+) = [^\n]*? while\(", hlo)
    assert loops and not set(loops) & set(scopes)
    got = seconds_by(lambda: jax.block_until_ready(f(x, w)), hlo,
                     lambda p: next((k for k in ("dense", "loop") if f"/{k}/" in p), None), 2)
    assert set(got) == {"dense", "loop", "unattributed"} and min(got.values()) >= 0
    assert got["dense"] > 0 and got["loop"] > 0


def test_loop_seconds_measures_each_loop_and_its_control():
    """Each loop of the program's source has its measured time and its own control (what no
    thunk and no loop inside it covers): an outer loop holds its inner loop's time, the
    controls are parts of the times, and the loops' times lie within the run's."""
    ctx = tl.Context(dims=("i", "t"))
    (i, t), (n_i, T) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.from_array(np.random.RandomState(0).rand(3, 40, 64).astype(np.float32),
                          domain=(i, t))
        h = tl.placeholder((64,), "float32", domain=(i, t))
        h[i, 0] = x[i, 0]
        h[i, t] = tl.tanh(h[i, t - 1] * 0.5 + x[i, t])
        w = tl.placeholder((64,), "float32", domain=(i,))
        w[0] = h[0, T - 1]
        w[i] = w[i - 1] * 0.9 + h[i, T - 1]
    prog = ctx.compile(bounds={n_i: 3, T: 40}, outputs={"w": w},
                       config=tl.CompileConfig(executor="xla", vectorise=False))
    loops = prog.executable.loop_seconds(runs=3)
    source = prog.executable.source
    assert len(loops) == source.count("lax.fori_loop") + source.count("lax.while_loop") >= 2
    for x in loops.values():
        assert 0 <= x["control"] <= x["seconds"] and " in " in x["loop"]
    outer = max(loops.values(), key=lambda x: x["seconds"])
    assert outer["seconds"] >= sum(x["seconds"] for x in loops.values() if x is not outer)
    assert outer["seconds"] <= prog.run().seconds * 3
    with pytest.raises(tl.ArgumentError, match="positive number of runs") as e:
        prog.executable.loop_seconds(runs=0)
    assert e.value.loc.file == __file__


def test_program_seconds_times_the_compiled_program_without_the_run():
    """The compiled program alone (no profiler, no run's Python): a loop 100 times as long
    takes longer, and bad runs are refused at the user's line."""
    def program(steps):
        ctx = tl.Context(dims=("t",))
        (t,), (T,) = ctx.dims, ctx.bounds
        with ctx:
            x = tl.from_array(np.random.RandomState(0).rand(steps, 256).astype(np.float32),
                              domain=(t,))
            h = tl.placeholder((256,), "float32", domain=(t,))
            h[0] = x[0]
            h[t] = tl.tanh(h[t - 1] * 0.5 + x[t])
        return ctx.compile(bounds={T: steps}, outputs={"h": h},
                           config=tl.CompileConfig(executor="xla"))
    short, long = program(20), program(2000)
    assert 0 < short.executable.program_seconds(runs=5) < long.executable.program_seconds(5)
    with pytest.raises(tl.ArgumentError, match="positive number of runs") as e:
        short.executable.program_seconds(runs=0)
    assert e.value.loc.file == __file__


def test_op_seconds_refuses_bad_runs_and_callbacks_at_the_users_line():
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.exp(tl.from_array(np.ones((4, 2), np.float32), domain=(t,)))
    prog = ctx.compile(bounds={T: 4}, outputs={"x": x}, config=tl.CompileConfig(executor="xla"))
    with pytest.raises(tl.ArgumentError, match="positive number of runs") as e:
        prog.executable.op_seconds(runs=0)
    assert e.value.loc.file == __file__
    with ctx:
        tl.sink(x, lambda p, v: None)
    prog = ctx.compile(bounds={T: 4}, outputs={"x": x}, config=tl.CompileConfig(executor="xla"))
    with pytest.raises(tl.ArgumentError, match="tl.sink/tl.source") as e:
        prog.executable.op_seconds()
    assert e.value.loc.file == __file__


def test_xla_fills_an_input_store_with_the_whole_array_at_the_start():
    """A ``from_array`` input held whole starts as the array (no statement copying it in point
    by point); values and statement counts are the interpreter's and the reference's."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    data = np.random.RandomState(3).randn(13, 4).astype(np.float32)
    with ctx:
        x = tl.from_array(data, domain=(t,))
        h = tl.placeholder((4,), "float32", domain=(t,))
        h[0] = x[0]
        h[t] = tl.tanh(x[t] + h[t - 1]) + x[0:t + 1].sum(axis=0) * 0.1
    outs = {"h": h}
    xla = ctx.compile(bounds={T: 13}, outputs=outs, config=cfg("xla"))
    assert op_named(xla, "x") in xla.executable.prepared.plan.prefilled
    line = next(s for s in xla.executable.source.splitlines() if "from_array" in s)
    assert "filled with the whole array" in line
    got = xla.run()
    interp = ctx.compile(bounds={T: 13}, outputs=outs, config=cfg("interpreter")).run()
    close(got["h"], ctx.compile(bounds={T: 13}, outputs=outs, config=REFERENCE).run()["h"])
    assert got.profile.calls == interp.profile.calls


def test_xla_starts_an_input_of_a_million_points_whole():
    """At T = 10^6 an input read in both directions starts as its array, not copied in point
    by point, and its statements are still counted once per point."""
    n = 10**6
    data = np.random.RandomState(0).rand(n).astype(np.float32)
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.from_array(data, domain=(t,))
        f = tl.placeholder((), "float32", domain=(t,))
        f[0] = x[0]
        f[t] = f[t - 1] * 0.5 + x[t]
        g = tl.placeholder((), "float32", domain=(t,))
        g[T - 1] = x[T - 1]
        g[t] = g[t + 1] * 0.5 + x[t]
        y = f[T - 1] + g[0]
    prog = ctx.compile(bounds={T: n}, outputs={"y": y}, config=cfg("xla"))
    line = next(s for s in prog.executable.source.splitlines() if "from_array" in s)
    assert "filled with the whole array" in line
    run = prog.run()
    f_last = g_first = np.float32(0)
    for v in data[-64:]:  # 0.5^64 is below float32's resolution: older points do not count
        f_last = f_last * np.float32(0.5) + v
    for v in data[63::-1]:
        g_first = g_first * np.float32(0.5) + v
    close(run["y"], f_last + g_first)
    assert run.profile.calls[op_named(prog, "x")] == n



@pytest.mark.parametrize("n", [1, 2, 7])
def test_xla_traces_a_recurrences_first_step_apart_without_a_branch(n):
    """``h[0]`` and ``h[t]`` from ``h[t - 1]``: the loop's first step is traced apart, so
    neither part needs a lax.cond for ``t >= 1`` nor a select for the merge; one step alone
    (n = 1) leaves the rest empty. Values and counts are the interpreter's."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    data = np.random.RandomState(n).randn(n, 3).astype(np.float32)
    with ctx:
        x = tl.from_array(data, domain=(t,))
        h = tl.placeholder((3,), "float32", domain=(t,))
        h[0] = tl.tanh(x[0])
        h[t] = tl.tanh(x[t] + h[t - 1] * 0.5)
        g = tl.placeholder((3,), "float32", domain=(t,))  # backwards: first step t = T - 1
        g[T - 1] = x[T - 1]
        g[t] = g[t + 1] * 0.5 + h[t]
    outs = {"h": h, "g": g}
    prog = ctx.compile(bounds={T: n}, outputs=outs, config=cfg("xla"))
    source = prog.executable.source
    assert source.count("the first step is traced apart") == 2 and "lax.cond(i_" not in source
    # T is at least 1 (at least 2 where n is): each first step is straight code, not a loop of
    # at most one step, and 0.5 is computed without a lax.cond where T >= 2 is known
    hlo = prog.executable.hlo()
    assert hlo.count(" while(") == 2 and hlo.count("conditional(") <= (n < 2)
    got = prog.run()
    want = ctx.compile(bounds={T: n}, outputs=outs, config=REFERENCE).run()
    close(got["h"], want["h"])
    close(got["g"], want["g"])
    interp = ctx.compile(bounds={T: n}, outputs=outs, config=cfg("interpreter")).run()
    assert got.profile.calls == interp.profile.calls


def test_xla_program_traced_for_larger_bounds_is_not_run_for_smaller_ones():
    """The trace assumes each bound is at least its value up to 8 (``XlaPlan.floors``), so a
    program whose stores do not grow with T is still shared by bounds above 8, and compiled
    again for a smaller one, whose branches it would otherwise have settled wrongly."""
    from tempo_lab.runtime import xla as xla_loops

    xla_loops._PROGRAMS.clear()
    ctx, T, z = recurrence_then_read("window", (11,))  # no other test uses the shape
    for n, new in ((20, True), (33, False), (3, True), (2, True), (1, True)):
        before = _xla_programs()
        prog = ctx.compile(bounds={T: n}, outputs={"z": z}, config=cfg("xla"))
        close(prog.run()["z"], numpy_recurrence(n, (11,))[-4:].sum(axis=0))
        assert (_xla_programs() == before + 1) is new, n
        plan = prog.executable.prepared.plan
        assert plan.to_dict()["bounds_at_least"] == {"T": min(n, 8)}
        assert f"T >= {min(n, 8)}" in plan.pretty()


def test_xla_writes_small_constants_into_the_program_and_keys_it_by_their_values():
    """A small constant is a literal of the XLA program (XLA folds it into the kernels), not a
    store; two programs that differ only in its value do not share a compiled program."""
    def run(scale):
        ctx = tl.Context(dims=("t",))
        (t,), (T,) = ctx.dims, ctx.bounds
        with ctx:
            k = tl.constant(np.float32(scale))
            h = tl.placeholder((3,), "float32", domain=(t,))
            h[0] = tl.ones((3,))
            h[t] = 1 / (k + tl.exp(-h[t - 1]))
        prog = ctx.compile(bounds={T: 6}, outputs={"h": h}, config=cfg("xla"))
        assert op_named(prog, "k") in prog.executable.prepared.plan.baked
        assert op_named(prog, "k") not in prog.executable.prepared.plan.shapes
        assert op_named(prog, "k") not in prog.executable.prepared._host_ops  # not an argument
        assert "k = const()  [constant in the program]" in prog.executable.source
        return prog.run()["h"]

    for scale in (1.0, 2.0):
        want = np.ones((6, 3), np.float32)
        for i in range(1, 6):
            want[i] = 1 / (scale + np.exp(-want[i - 1]))
        close(run(scale), want)


@pytest.mark.parametrize("read", ["causal", "window", "tiled"])
def test_xla_holds_a_store_read_by_a_transpose_in_the_order_the_transpose_gives(read):
    """Keys over ``0:t+1`` (a ring for a window, blocks when tiled) read by ``transpose(1, 0,
    2)``, as attention reads them: their store is held heads first, then t, so the read needs
    no copy into the transposed order. The store is also an output (given back in the logical
    order) and so is a ``from_array`` read the same way (filled transposed at the start); the
    values are the reference's."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    rng = np.random.RandomState(4)
    data = rng.randn(40, 3, 5).astype(np.float32)
    start = tl.max(0, t - 3) if read == "window" else 0
    with ctx:
        x = tl.from_array(data, domain=(t,), name="x")
        k = tl.placeholder((3, 5), "float32", domain=(t,), name="k")
        k[t] = tl.tanh(x[t] * 2.0)
        keys = k[start:t + 1].transpose(1, 0, 2)                       # (3, steps, 5)
        q = x[start:t + 1].transpose(1, 0, 2).sum(axis=1)              # (3, 5)
        att = (keys @ q.expand_dims(2)).squeeze(2).sum(axis=1)         # (3,)
    outs = {"att": att, "k": k} if read != "window" else {"att": att}
    config = cfg("xla", tile_block=8) if read == "tiled" else cfg("xla")
    prog = ctx.compile(bounds={T: 40}, outputs=outs, config=config)
    held = prog.executable.prepared.plan.perms
    assert held.get(op_named(prog, "k")) == (1, 0, 2), held
    if read != "tiled":
        assert held.get(op_named(prog, "x")) == (1, 0, 2), held
    assert "axes held in the order [1, 0, 2]" in prog.executable.pretty()
    got = prog.run()
    want = ctx.compile(bounds={T: 40}, outputs=outs, config=REFERENCE).run()
    for name in outs:
        close(got[name], want[name], msg=name)


@pytest.mark.parametrize("layers", [2, 3])
def test_xla_unrolls_the_loop_over_layers_and_holds_each_layers_weights_apart(layers):
    """Inside the loop over steps, the loop over layers reads the weights at ``n``: it is
    traced once per layer, and each layer's weights are buffers of their own (XLA copied a
    slice of the stacked weights out at every step), and so are its keys and values, written
    in the loop: each step reads them whole, in place, their padding known to be zeros (not
    written yet). The program is compiled per number of layers (run
    one after another in one process, none reuses another's); values are the NumPy
    decoder's."""
    w = make_weights(layers, EMBED, 2 * EMBED, seed=layers)
    tokens = np.random.default_rng(layers).standard_normal((STEPS, EMBED)).astype(np.float32)
    ctx, N, T, y = _last_layer(w, tokens)
    prog = ctx.compile(bounds={N: layers, T: STEPS}, outputs={"y": y}, config=cfg("xla"))
    ex = prog.executable.prepared.plan
    assert list(ex.unrolled.values()) == [(0, layers)]
    assert f"for i_n in 0..{layers}:  # unrolled" in ex.source
    weights = {op_named(prog, k) for k in w}
    written = set(ex.unstacked) - weights
    assert weights <= set(ex.unstacked) and len(written) == 2, ex.unstacked  # keys, values
    assert written <= set(ex.perms) and not written & ex.prefilled
    assert {ex.lowered.stmts[k].reads[i].src for k, i in ex.zeroed} >= written, ex.zeroed
    assert "one buffer per point of axis 0" in prog.executable.pretty()
    close(prog.run()["y"], numpy_decoder(w, tokens, HEADS))


def test_xla_masks_a_range_of_a_store_its_loop_wrote_in_an_earlier_outer_step():
    """``x[i, 0:t+1]`` of a store written at ``t`` in a loop that runs again for every
    ``i`` (a ring of one slot over ``i``): beyond ``t`` lie the last ``i``'s values (large
    here), not zeros, so the sum masks them; as the reference."""
    ctx = tl.Context(dims=("i", "t"))
    (i, t), (NI, T) = ctx.dims, ctx.bounds
    with ctx:
        big = tl.from_array(np.array([1.0, 1e6, 3.0], np.float32), domain=(i,), name="big")
        x = tl.placeholder((), "float32", domain=(i, t), name="x")
        x[i, 0] = big[i]
        x[i, t] = x[i, t - 1] * 0.5 + big[i]
        s = tl.placeholder((), "float32", domain=(i, t), name="s")
        s[i, t] = x[i, 0:t + 1].sum()
    for vectorise in (False, True):
        config = cfg("xla", vectorise=vectorise)
        prog = ctx.compile(bounds={NI: 3, T: 20}, outputs={"s": s}, config=config)
        want = ctx.compile(bounds={NI: 3, T: 20}, outputs={"s": s}, config=REFERENCE).run()
        close(prog.run()["s"], want["s"], msg=f"vectorise={vectorise}")


def test_xla_keeps_a_store_read_by_a_loop_variable_stacked():
    """Weights read at ``n`` inside the unrolled loop over layers and at ``t`` (a variable,
    not a constant, in the loop over steps) stay one stacked buffer; the loop is still
    unrolled and the values are the reference's. (64 floats a point: a loop is unrolled for
    reads of at least ``XlaOptions.unroll_bytes``.)"""
    ctx = tl.Context(dims=("t", "n"))
    (t, n), (T, N) = ctx.dims, ctx.bounds
    data = np.random.RandomState(5).randn(6, 64).astype(np.float32)
    with ctx:
        wts = tl.from_array(data, domain=(n,), name="wts")
        h = tl.placeholder((64,), "float32", domain=(t, n), name="h")
        h[0, n] = wts[n]
        h[t, n] = tl.tanh(h[t - 1, n] * wts[n] + wts[tl.min(t, N - 1)])
    outs = {"h": h}
    prog = ctx.compile(bounds={T: 5, N: 6}, outputs=outs, config=cfg("xla"))
    ex = prog.executable.prepared.plan
    assert ex.unrolled and op_named(prog, "wts") not in ex.unstacked
    close(prog.run()["h"], ctx.compile(bounds={T: 5, N: 6}, outputs=outs,
                                       config=REFERENCE).run()["h"])


def test_xla_does_not_unroll_layers_into_every_span_of_a_long_loop(monkeypatch):
    """Twelve layers inside a loop over steps: unrolled, their keys and values are buffers
    read whole, so the loop is not split and the layers' statements are traced once. Were
    those reads copied per span, the loop would be split into eight spans, and unrolling
    would trace the layer's statements 96 times: the loop over layers then stays a loop
    (XLA's compile time grows with the copies). Values are the NumPy decoder's."""
    w = make_weights(12, EMBED, 2 * EMBED, seed=12)
    tokens = np.random.default_rng(12).standard_normal((128, EMBED)).astype(np.float32)
    ctx, N, T, y = _last_layer(w, tokens)
    want = numpy_decoder(w, tokens, HEADS)
    prog = ctx.compile(bounds={N: 12, T: 128}, outputs={"y": y}, config=cfg("xla"))
    ex = prog.executable.prepared.plan
    assert ex.unrolled and "spans of" not in ex.source and "not split" in ex.source
    close(prog.run()["y"], want)
    monkeypatch.setattr(xla_plan.XlaPlan, "_in_place", lambda self, st, r: False)
    prog = ctx.compile(bounds={N: 12, T: 128}, outputs={"y": y}, config=cfg("xla"))
    ex = prog.executable.prepared.plan
    assert "8 spans of 16 steps" in ex.source and not ex.unrolled and not ex.unstacked
    close(prog.run()["y"], want)


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(steps=st.integers(1, 40), reduce=st.sampled_from(["sum", "mean", "max", "attend"]),
       outer=st.booleans(), vectorise=st.booleans())
def test_xla_reads_past_what_its_loop_wrote_as_the_reference(steps, reduce, outer, vectorise):
    """A recurrence read over ``0:t+1`` in the loop that writes it (summed, averaged, maxed,
    or attended over as values): where that loop runs once, the padding past ``t`` is known
    to hold zeros and the sums leave their masks out; inside a loop over ``i`` it holds the
    last ``i``'s values and is masked. Either way, the reference's values."""
    dims = ("i", "t") if outer else ("t",)
    ctx = tl.Context(dims=dims)
    *lead, t = ctx.dims
    data = np.random.default_rng(steps).standard_normal((3, steps, 4)).astype(np.float32) * 3
    with ctx:
        inp = tl.from_array(data if outer else data[0], domain=tuple(ctx.dims), name="inp")
        x = tl.placeholder((4,), "float32", domain=tuple(ctx.dims), name="x")
        x[(*lead, 0)] = inp[(*lead, 0)]
        x[(*lead, t)] = tl.tanh(x[(*lead, t - 1)] * 0.9 + inp[(*lead, t)]) * 5.0
        seen = x[(*lead, slice(0, t + 1))]
        if reduce == "attend":
            scores = (seen @ inp[(*lead, t)].expand_dims(1)).squeeze(1)
            y = (tl.softmax(scores, axis=-1).expand_dims(0) @ seen).squeeze(0)
        else:
            y = getattr(seen, reduce)(axis=0)
    bounds = dict(zip(ctx.bounds, (3, steps) if outer else (steps,)))
    prog = ctx.compile(bounds=bounds, outputs={"y": y}, config=cfg("xla", vectorise=vectorise))
    want = ctx.compile(bounds=bounds, outputs={"y": y}, config=REFERENCE).run()["y"]
    close(prog.run()["y"], want, msg=f"{reduce}, outer={outer}, vectorise={vectorise}")


def test_xla_passes_small_zero_stores_in_instead_of_making_them():
    """In a program with a loop, a store that starts as zeros is an argument made once (XLA
    copies it into place), not a broadcast kernel in the program (each kernel costs XLA's
    compile time and peak memory); a store over the size limit, in a program whose run the
    copies would slow (a few steps: a few statements a call), or in a program without a loop,
    is still made in the program. Runs agree with the interpreter, a second run too (the copy
    leaves the argument zero)."""
    from tempo_lab.runtime.xla_options import XlaOptions

    for rows, steps, passed in ((8, 64, True), (XlaOptions().zero_arg_bytes // (64 * 16) + 1, 64,
                                                False), (8, 6, False)):
        data = np.random.default_rng(0).standard_normal((steps, rows, 4)).astype(np.float32)
        ctx = tl.Context(dims=("t",))
        (t,), (T,) = ctx.dims, ctx.bounds
        with ctx:
            x = tl.from_array(data, domain=(t,), name="x")
            y = tl.placeholder((rows, 4), "float32", domain=(t,), name="y")
            y[0] = x[0]
            y[t] = tl.tanh(y[t - 1] + x[t])
        progs = {e: ctx.compile(bounds={T: steps}, outputs={"y": y}, config=cfg(e))
                 for e in ("xla", "interpreter")}
        want = progs["interpreter"].run()["y"]
        for _ in range(2):
            close(progs["xla"].run()["y"], want)
        xp = progs["xla"].executable.prepared
        assert (op_named(progs["xla"], "y") in xp.plan.zero_args) is passed, (rows, steps)
    ctx, T, c, done, outs = counter(1e9)  # a tl.until loop: its statements are not known
    prog = ctx.compile(bounds={T: tl.until(done, max=4000)}, outputs=outs, config=cfg("xla"))
    np.testing.assert_array_equal(prog.run()["c"], np.arange(4000, dtype=np.float32))
    assert prog.executable.prepared.plan.zero_args == ()
    ctx = tl.Context(dims=("t",))  # no loop: its stores are made in it (no argument to pass)
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        y = tl.tanh(tl.from_array(np.ones((6, 4), np.float32), domain=(t,), name="x"))
    prog = ctx.compile(bounds={T: 6}, outputs={"y": y}, config=cfg("xla"))
    close(prog.run()["y"], np.tanh(np.ones((6, 4))))
    assert prog.executable.prepared.plan.zero_args == ()


def test_xla_returns_counts_only_where_the_program_makes_them():
    """A program without a ``tl.until`` loop: its bounds decide every statement count, so the
    XLA program returns its outputs alone (a counter output cost a buffer and a transfer: a
    third of a one-op run; a counter in every loop, an XLA kernel each) and the host counts
    from the bounds; with a ``tl.until`` loop it returns the counts it made. Either way the
    profile counts what the interpreter counts, and is made once, when first read."""
    data = np.arange(24, dtype=np.float32).reshape(6, 4)
    for looped in (False, True):
        ctx = tl.Context(dims=("t",))
        (t,), (T,) = ctx.dims, ctx.bounds
        with ctx:
            x = tl.from_array(data, domain=(t,), name="x")
            if looped:
                y = tl.placeholder((4,), "float32", domain=(t,), name="y")
                y[0] = x[0]
                y[t] = tl.tanh(y[t - 1] + x[t])
            else:
                y = tl.tanh(x)
        runs = {e: ctx.compile(bounds={T: 6}, outputs={"y": y}, config=cfg(e)).run()
                for e in ("xla", "interpreter")}
        close(runs["xla"]["y"], runs["interpreter"]["y"])
        xp = runs["xla"].program.executable.prepared
        returned = jax.tree.leaves(xp._call(xp._compiled(), *xp._args()[:2]))
        assert len(returned) == 1, returned
        assert runs["xla"].profile.calls == runs["interpreter"].profile.calls
        assert runs["xla"].profile is runs["xla"].profile
        assert isinstance(runs["xla"].profile, tl.runtime.Profile)
    ctx, T, c, done, outs = counter(5.0)
    runs = {e: ctx.compile(bounds={T: tl.until(done, max=20)}, outputs=outs,
                           config=cfg(e)).run() for e in ("xla", "interpreter")}
    xp = runs["xla"].program.executable.prepared
    *_, ints = jax.tree.leaves(xp._call(xp._compiled(), *xp._args()[:2]))
    assert len(ints) == len(xp.plan.ops) + 1  # the counts, then the bound as reached
    assert runs["xla"].profile.calls == runs["interpreter"].profile.calls
    assert runs["xla"].bounds["T"] == runs["interpreter"].bounds["T"] == 6


def test_the_registry_is_the_one_list_of_executors():
    """Each executor is one line of ``executors.REGISTRY``: its class (made by name) says the
    same name, its options class is what its constructor takes, and every list the package
    and the tests keep is derived from it."""
    import dataclasses

    from tempo_lab import executors
    from tempo_lab.runtime.executable import backends, make_backend, options_class

    assert tl.compile_config.EXECUTORS == ("auto", *executors.REGISTRY)
    assert tuple(executors.CAPS) == tuple(executors.REGISTRY) == ALL
    assert tuple(backends()) == COMPILED == executors.lowering()
    for name in executors.REGISTRY:
        made = make_backend(name)
        assert made.name == name
        options = options_class(name)
        if options is not None:
            assert dataclasses.is_dataclass(options)
            assert make_backend(name, options()).options == options()
    assert not executors.CAPS["reference"].lowers
    # auto: resolved once, before the passes, from what the program does
    assert executors.resolve("auto", False, False) == executors.Choice("xla", True)
    assert executors.resolve("auto", True, False) == executors.Choice("codegen", True)
    under = executors.resolve("auto", False, True)
    assert (under.name, under.fallback, under.planned) == ("xla", "codegen", "codegen")
    assert executors.resolve("auto", True, True).fallback is None
    assert executors.resolve("interpreter", True, True) == executors.Choice("interpreter")
