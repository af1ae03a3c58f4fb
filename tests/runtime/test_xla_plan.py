"""The XLA executor's decisions as a plan of their own (``runtime/xla_plan.py``): readable,
frozen, and built without JAX code, so that a decision can be checked without tracing."""
import ast
import functools
import pathlib
import sys
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from rt_helpers import DISTINCT

import tempo_lab as tl
from tempo_lab.runtime import xla_plan

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # tests/ is not a package
from budget import examples  # noqa: E402
from randprog import assert_outputs_match, compile_program, program_strategy, run_tempo  # noqa: E402


def _decoder_step():
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        w = tl.from_array(np.eye(4, dtype=np.float32), domain=(), name="w")
        k = tl.from_array(np.ones((16, 4), np.float32), domain=(t,), name="k")
        s = tl.softmax(k[0:t + 1] @ w, axis=0)
        y = tl.sum(s, axis=0)
    return ctx.compile(bounds={T: 16}, outputs={"y": y}, config=tl.CompileConfig(executor="xla"))


def test_the_plan_prints_its_decisions_and_cannot_be_changed():
    prog = _decoder_step()
    plan = prog.executable.prepared.plan
    assert isinstance(plan, xla_plan.XlaPlan)
    assert repr(plan).startswith("XlaPlan(") and "\n" not in repr(plan)
    text = plan.pretty()
    for title in ("static stores", "values kept in registers", "constants baked",
                  "loops unrolled, split into spans or peeled", "padding holds zeros", "source"):
        assert title in text, text
    assert plan.to_dict()["version"] == xla_plan.TO_DICT_VERSION
    assert "<details" in plan._repr_html_()
    with pytest.raises(AttributeError, match="frozen"):
        plan.shapes = {}
    np.testing.assert_allclose(prog.run()["y"], prog.on("reference").run()["y"], rtol=1e-5)


def test_the_plan_module_has_no_jax_code():
    """Decisions read the lowered program and the bounds only; the tracer (``xla.py``) is
    the one module that turns them into ``lax`` code."""
    tree = ast.parse(pathlib.Path(xla_plan.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in imported if m.split(".")[0] == "jax"}, imported
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert not names & {"jax", "jnp", "lax"}, names & {"jax", "jnp", "lax"}


def _two_phases():
    """``a`` over ``t``, summed; then ``b`` over ``t`` from the sum: ``a`` is dead while ``b``
    is made, so the memory plan's peak (with frees) is about half of every store held at once,
    which is what the XLA program holds for the whole run."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        a = tl.placeholder((256,), domain=(t,), name="a")
        a[0] = tl.ones((256,))
        a[t] = a[t - 1] * 0.99 + 0.01
        b = tl.placeholder((256,), domain=(t,), name="b")
        b[0] = a[0:T].sum(axis=0)
        b[t] = b[t - 1] * 0.5 + 1.0
        out = b[0:T].sum()
    return ctx, {T: 100}, {"out": out}


def test_auto_under_a_budget_runs_xla_only_where_its_stores_fit():
    """A budget met by frees alone (no store moves to the host) used to run on XLA, which holds
    every store for the whole run: above the budget, silently."""
    ctx, bounds, outs = _two_phases()
    want = ctx.compile(bounds=bounds, outputs=outs,
                       config=tl.CompileConfig(executor="reference")).run()["out"]
    free = ctx.compile(bounds=bounds, outputs=outs, config=tl.CompileConfig(executor="xla"))
    held = free.executable.prepared.plan.static_bytes
    assert free.memory.peak_bytes < held
    tight = ctx.compile(bounds=bounds, outputs=outs,
                        config=tl.CompileConfig(device_memory_budget=free.memory.peak_bytes))
    assert "offload" not in tight.schedule.code()
    assert tight.executor != "xla" and tl.executors.CAPS[tight.executor].memory_budget
    assert "above device_memory_budget" in " ".join(tight.executable.choice)
    assert tight.run().profile.peak_bytes <= free.memory.peak_bytes
    roomy = ctx.compile(bounds=bounds, outputs=outs,
                        config=tl.CompileConfig(device_memory_budget=held))
    assert roomy.executor == "xla" and "fit device_memory_budget" in " ".join(
        roomy.executable.choice)
    for prog in (tight, roomy):
        np.testing.assert_allclose(prog.run()["out"], want, rtol=1e-5)


def test_a_step_value_written_in_a_branch_the_loop_settles_is_kept_as_a_value():
    """A rollout's shape: the state after step t-1 (``nxt``, made only for t >= 1, under an
    If) is read after that If by the merge that picks the first state at t == 0. Peeled, the
    steps after the first settle both, so ``nxt`` is a traced value, not a store carried
    through the loop (with one, XLA copied the loop's whole state stores at every step)."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    rng = np.random.default_rng(0)
    xs, s0 = rng.normal(size=(64, 4)).astype(np.float32), np.ones(4, np.float32)
    with ctx:
        x = tl.from_array(xs, domain=(t,), name="x")
        start = tl.from_array(s0, domain=(), name="start")
        s = tl.placeholder((4,), "float32", (t,), "s")
        s[0] = start
        s[t] = tl.where(x[t - 1] > 1.0, start, tl.tanh(s[t - 1] + x[t - 1]))
    prog = ctx.compile(bounds={T: 64}, outputs={"s": s}, config=tl.CompileConfig(executor="xla"))
    plan = prog.executable.prepared.plan
    step = [i for i, op in prog.sdg.ops.items() if op.kind in ("where", "fused")]
    assert len(step) == 1 and step[0] in plan.local, plan.pretty()
    assert step[0] not in plan.shapes
    want = [s0]
    for k in range(1, 64):
        want.append(np.where(xs[k - 1] > 1.0, s0, np.tanh(want[-1] + xs[k - 1])))
    np.testing.assert_allclose(prog.run()["s"], np.stack(want), rtol=1e-5, atol=1e-6)
    for executor in (e for e in DISTINCT if e != prog.executor):  # one of each other kind
        np.testing.assert_allclose(prog.on(executor).run()["s"], np.stack(want), rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.parametrize("threshold", [0.0, 2.5, 100.0])
def test_a_tl_until_loop_traces_its_first_step_apart(threshold):
    """An early-exit stack's loop over layers ends at a ``tl.until``: a ``lax.while_loop``. Its
    first layer (``h[0]``) and the reads of the layer before (``h[l - 1]``) were a
    ``lax.cond`` at every step; the first step is now traced alone, under one ``lax.cond``
    (the loop may stop before it), and the others without any. Stopping at the first step,
    later, or never gives the reference's values."""
    ctx = tl.Context(dims=("l",))
    (layer,), (L,) = ctx.dims, ctx.bounds
    rng = np.random.default_rng(0)
    x0 = rng.normal(size=(4,)).astype(np.float32)
    w = (rng.normal(size=(4, 4)) * 0.8).astype(np.float32)
    with ctx:
        x = tl.from_array(x0, domain=(), name="x")
        wl = tl.from_array(w, domain=(), name="w")
        h = tl.placeholder((4,), "float32", (layer,), "h")
        h[0] = tl.tanh(x)
        h[layer] = tl.tanh(h[layer - 1] @ wl) + 1.0
        total = tl.placeholder((), "float32", (layer,), "total")
        total[0] = tl.sum(h[0])
        total[layer] = total[layer - 1] + tl.sum(h[layer])
        done = total >= threshold
    prog = ctx.compile(bounds={L: tl.until(done, max=8)}, outputs={"h": h, "total": total},
                       config=tl.CompileConfig(executor="xla"))
    plan = prog.executable.prepared.plan
    src = plan.source.splitlines()
    loop = src.index("lax.while_loop(i_l in 0..N_L):  # the first step is traced apart; "
                     "below, the others")
    assert not any("lax.cond" in line for line in src[loop:]), plan.source
    assert prog.executable.hlo().count("conditional(") == 2  # the first step, and w's setup
    run, ref = prog.run(), prog.on("reference").run()
    assert run.bounds == ref.bounds
    for k in ("h", "total"):
        np.testing.assert_allclose(run[k], ref[k], rtol=1e-5, atol=1e-6)


def test_a_window_program_compiles_once_for_every_T_from_its_floor():
    """The README's promise, over a sweep: one XLA program for every ``T`` of 8 or more.
    Whether the zero stores are passed in was judged at ``T``'s store extent, so ``T`` of 8
    to 16 had one program and 17 on another (where passing them in started to pay); it is
    judged at the floor of every bound that sizes no store (``XlaPlan.cost_bounds``)."""
    from tempo_lab.runtime import xla

    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.placeholder((13,), "float32", domain=(t,), name="x")  # a shape no other test has
        x[0] = tl.ones((13,))
        x[t] = x[t - 1] * 0.5 + 1.0
        z = x[tl.max(0, t - 3):t + 1].sum(axis=0)[T - 1]
    xla._PROGRAMS.clear()  # the cache keeps 64 programs: counting near the cap misleads
    for n in (8, 9, 16, 17, 33, 1000):
        prog = ctx.compile(bounds={T: n}, outputs={"z": z},
                           config=tl.CompileConfig(executor="xla"))
        want = [1.0]
        for _ in range(n - 1):
            want.append(want[-1] * 0.5 + 1.0)
        np.testing.assert_allclose(prog.run()["z"], np.full(13, sum(want[-4:])), rtol=1e-5)
        assert prog.executable.prepared.plan.cost_bounds() == {"T": 8}
    assert len(xla._PROGRAMS) == 1


def test_a_split_loop_whose_run_writes_big_stores_is_not_switched():
    """The work padded per span runs under one ``lax.switch`` only while the stores it writes
    are small (``XlaOptions.switch_carry_bytes``): the switch carries them whole at every step
    (a training step's attention frames made it 70x slower). Over the limit, one loop per span,
    with the same results."""
    from tempo_lab.runtime.xla import XlaBackend
    from tempo_lab.runtime.xla_options import XlaOptions

    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.from_array(np.random.default_rng(0).normal(size=(256, 8)).astype(np.float32),
                          domain=(t,))
        s = tl.softmax(x[0:t + 1] @ x[t], axis=0)
        y = (s @ x[0:t + 1]) * 2.0
    prog = ctx.compile(bounds={T: 256}, outputs={"y": y},
                       config=tl.CompileConfig(executor="xla"))
    got = {}
    for limit in (1 << 20, 1):
        ex = prog.lowered.compile(XlaBackend(XlaOptions(switch_carry_bytes=limit)))
        switched = [p for p in ex.prepared.plan.switch_plans.values() if p]
        assert bool(switched) == (limit > 1), limit
        got[limit] = ex.run()["y"]
    np.testing.assert_allclose(got[1], got[1 << 20], rtol=1e-6)
    np.testing.assert_allclose(got[1], prog.on("reference").run()["y"], rtol=1e-4, atol=1e-5)


def test_stores_kept_between_runs_are_written_in_place_and_give_the_same_results():
    """Stores that no read relies on starting as zeros are kept from one run for the next and
    passed in donated (``XlaOptions.carry_stores``): XLA writes them in place instead of filling
    them with zeros at every run. A recurrence's store and a batched value's are kept; the
    output is not (its undemanded points must stay zeros). Runs after the first, and a run
    whose first stores are NaN (``carry_poison``), give the first run's results; so does the
    program without carrying, and the reference."""
    from tempo_lab.runtime.xla import XlaBackend
    from tempo_lab.runtime.xla_options import XlaOptions

    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    rng = np.random.default_rng(0)
    with ctx:
        x = tl.from_array(rng.normal(size=(40, 8)).astype(np.float32), domain=(t,), name="x")
        h = tl.placeholder((8,), "float32", domain=(t,), name="h")
        h[0] = tl.tanh(x[0])
        h[t] = tl.tanh(h[t - 1] * 0.5 + x[t])
        att = tl.softmax(x[0:t + 1] @ h[t], axis=0) @ x[0:t + 1]
        y = (att * 2.0).sum()
    prog = ctx.compile(bounds={T: 40}, outputs={"y": y}, config=tl.CompileConfig(executor="xla"))
    want = prog.on("reference").run()["y"]
    plan = prog.executable.prepared.plan
    kept = {plan.sdg.ops[i].label for i in plan.carried}
    assert "h" in kept and set(plan.sdg.outputs.values()).isdisjoint(plan.carried), kept
    assert "stores kept from one run for the next" in prog.executable.pretty()
    for options in (XlaOptions(), XlaOptions(carry_poison=True), XlaOptions(carry_stores=False)):
        ex = prog.lowered.compile(XlaBackend(options))
        assert bool(ex.prepared.plan.carried) == options.carry_stores
        for _ in range(3):
            np.testing.assert_allclose(ex.run()["y"], want, rtol=1e-4, atol=1e-5)
    # the program's compiled module aliases each kept store to what it returns
    assert "input_output_alias" in prog.executable.hlo()


@settings(max_examples=examples(40), deadline=None, derandomize=True, database=None)
@given(program_strategy())
def test_random_programs_read_no_kept_store_before_writing_it(program):
    """Every random program (recurrences, ranges, ragged bounds, ``tl.until``, gradients) on
    the XLA executor with its kept stores starting as NaN (``carry_poison``), run twice: the
    results are the independent evaluation's, so no read relies on a kept store's zeros."""
    from tempo_lab.runtime import xla
    from tempo_lab.runtime.xla_options import XlaOptions

    poisoned = functools.partial(XlaOptions, carry_poison=True)
    with mock.patch.object(xla, "XlaOptions", poisoned):
        calls: dict = {}
        prog = compile_program(program, calls, config=tl.CompileConfig(executor="xla"))
        for _ in range(2):
            assert_outputs_match(program, run_tempo(program, prog, calls),
                                 what="xla, kept stores starting as NaN")


def test_an_optimisers_zero_moments_are_a_broadcast_not_a_store():
    """Adam's moments start from a zero broadcast made once (over no dims). Held as a store,
    it was as large as the parameter for the whole run (1 GB for Llama-3.2-1B's embedding
    table); baked, each read is a broadcast XLA fuses. The results stay the reference's."""
    w0 = np.random.default_rng(0).normal(size=(600, 500)).astype(np.float32)  # > FOLD_BYTES
    ctx = tl.Context(dims=("i",))
    (i,) = ctx.dims
    with ctx:
        p = tl.optim.parameters({"w": w0}, dim=i)
        loss = ((p["w"] - 1.0) ** 2).mean()
        tl.optim.Adam(lr=0.01).minimize(loss, p)
    prog = ctx.compile(bounds={ctx.bounds[0]: 3}, outputs={"loss": loss},
                       config=tl.CompileConfig(executor="xla"))
    plan = prog.executable.prepared.plan
    zeros = [k for k, op in plan.sdg.ops.items() if op.kind == "broadcast_to" and not op.domain]
    assert zeros and set(zeros) <= plan.baked and not set(zeros) & set(plan.shapes), zeros
    np.testing.assert_allclose(prog.run()["loss"], prog.on("reference").run()["loss"],
                               rtol=1e-5)


def test_a_value_made_at_the_first_step_only_is_not_a_traced_value_of_later_steps():
    """PPO with an Adam that reads its moments where it writes them: isl then schedules a
    value of no dims (the sample count as a float, which the mean reward divides by) inside
    the iteration loop under ``i == 0``, read at every step. Taken for a value a ``lax.cond``
    returns, it was zeros from the second iteration on, and the returns inf where the
    reference gives 4 (a silent wrong result); now it stays a store."""
    from tempo_lab.frontend.api import sqrt
    from tempo_lab.rl import CartPole

    def update(self, p, g, states, key, before, step, lr):
        states["m"][key] = self.b1 * states["m"][before] + (1 - self.b1) * g
        states["v"][key] = self.b2 * states["v"][before] + (1 - self.b2) * g * g
        m, v = (s[tuple(s.domain)] for s in (states["m"], states["v"]))
        step = step.astype(p.dtype)
        return p - lr * (m / (1 - self.b1 ** step)) / (sqrt(v / (1 - self.b2 ** step))
                                                       + self.eps)

    cfg = tl.rl.PPOConfig(hidden=4, update_epochs=2, num_minibatches=2)
    ctx = tl.Context(dims=cfg.DIMS)
    with mock.patch.object(tl.optim.Adam, "_update", update):
        tr = tl.rl.ppo(ctx, CartPole(), cfg)
    prog = ctx.compile(bounds=cfg.bounds(ctx, 2, 2, 4),
                       outputs={"return": tr.episode_return, "theta": tr.params["theta"]},
                       config=tl.CompileConfig(executor="xla"))
    got, want = prog.run(), prog.on("reference").run()
    np.testing.assert_allclose(got["return"], want["return"], rtol=1e-5)
    np.testing.assert_allclose(got["theta"], want["theta"], rtol=1e-5, atol=1e-6)
