"""Memory-driven scheduling: shifted fusion, streamed sums (passes/stream.py) and what they do
to a TD(n) learner's memory, each checked against the program without them."""
import functools

import numpy as np
import pytest
from hypothesis import given, settings
from rt_helpers import COMPILED, DISTINCT
from test_contract import _build, programs

import tempo_lab as tl
from tempo_lab.rl.algorithms import ReinforceConfig, reinforce
from tempo_lab.rl.envs import CartPole


def _lookahead_program():
    """``x`` is a recurrence over ``t``; ``y[t]`` reads ``x`` two steps ahead, and the loss
    sums ``y`` over all of ``t``."""
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, T = ctx.bounds
    data = np.random.default_rng(0).normal(size=(3, 40)).astype(np.float32)
    with ctx:
        u = tl.from_array(data, domain=(b, t))
        x = tl.placeholder((), domain=(b, t), name="x")
        x[b, 0] = u
        x[b, t] = 0.9 * x[b, t - 1] + u
        y = tl.placeholder((), domain=(b, t), name="y")
        y[t < T - 2] = x[b, t + 2] - x[b, t]
        y[b, t] = x[b, t]
        total = y[b, 0:T].sum()
    return ctx, {B: 3, T: 40}, {"total": total, "y": y}


def test_a_reader_two_steps_ahead_runs_in_the_producers_loop(executor):
    ctx, bounds, outs = _lookahead_program()
    ref = ctx.compile(bounds=bounds, outputs=outs,
                      config=tl.CompileConfig(executor="reference")).run()
    prog = ctx.compile(bounds=bounds, outputs={"total": outs["total"]},
                       config=tl.CompileConfig(executor=executor, stream=True,
                                               check_invariants=True))
    np.testing.assert_allclose(prog.run()["total"], ref["total"], rtol=1e-5)
    if executor == "reference":  # no passes, no schedule
        return
    assert "0:T" not in prog.schedule.code()  # the sum is a running sum in the loop
    x, y = (next(i for i, op in prog.sdg.ops.items() if op.name == n) for n in "xy")
    assert prog.schedule.lag(y, x, "t") == 2  # y runs two iterations late
    assert prog.memory.storages[x].slots[-1] == 3  # x[t], x[t + 1], x[t + 2]


def _reinforce(n, stream, steps=48, executor="xla", **config):
    cfg = ReinforceConfig(n_step=n, normalize=False, hidden=16, loss_mean="steps")
    ctx = tl.Context(dims=cfg.DIMS)
    tr = reinforce(ctx, CartPole(), cfg)
    return ctx.compile(bounds=cfg.bounds(ctx, 2, 4, steps),
                       outputs={"loss": tr.loss, "ret": tr.episode_return},
                       config=tl.CompileConfig(executor=executor, stream=stream,
                                               check_invariants=True, **config))


@functools.cache
def _reference_td_learner():
    """The unstreamed TD(4) learner on the reference (a minute or more): run once per process."""
    run = _reinforce(4, False, executor="reference").run()
    return {k: np.asarray(run[k]) for k in ("loss", "ret")}


@pytest.mark.executors(DISTINCT, reason="for time: the reference alone runs for a minute")
def test_streamed_td_learner_equals_the_unstreamed_one_and_the_reference(executor):
    prog = _reinforce(4, True, executor=executor)  # the streamed passes' invariants are checked
    if executor == "reference":  # it runs the program as built (no pass): the run would be `want`
        return
    got, want = prog.run(), _reference_td_learner()
    for k in ("loss", "ret"):
        np.testing.assert_allclose(got[k], want[k], rtol=2e-4, atol=1e-5)


def test_td_memory_stays_flat_in_the_steps_and_mc_does_not():
    """TD(4)'s streamed plan hardly grows from 256 to 1024 steps; Monte-Carlo's grows with
    the episode, and at 1024 steps TD(4) needs under half of it."""
    peak = {(n, s): _reinforce(n, True, s).memory.peak_bytes
            for n in (None, 4) for s in (256, 1024)}
    assert peak[(4, 1024)] < 0.5 * peak[(None, 1024)]
    assert peak[(None, 1024)] > 2 * peak[(None, 256)]
    # what still grows: the step index values over t (a few bytes per step)
    assert peak[(4, 1024)] - peak[(4, 256)] < 16 * 768
    measured = {n: _reinforce(n, True, 1024).run().profile.peak_bytes for n in (None, 4)}
    assert measured[4] < 0.5 * measured[None]


def test_streaming_keeps_memory_flat_with_group_vectorisation_and_says_what_it_keeps_looped():
    """With ``vectorise_groups`` the ops off the rollout's recurrence would run batched over
    all of t, reading every step of the loop's values (measured: 1.7 MB at 256 steps, 6.7 at
    1024); a stream pass's running sums keep them in the loop, and ``prog.passes`` says so."""
    peak = {s: _reinforce(4, True, s, vectorise_groups=True) for s in (256, 1024)}
    assert peak[1024].memory.peak_bytes == peak[256].memory.peak_bytes
    notes = [e.note for r in peak[256].passes.records if r.name == "vectorise"
             for e in r.events if e.kind == "note"]
    assert any("stream pass made running sums along t" in n for n in notes), notes
    unstreamed = _reinforce(4, False, 256, vectorise_groups=True)
    assert any("t" in op.attrs.get("vdims", ()) for op in unstreamed.sdg.ops.values())


def test_monte_carlo_gradients_are_not_streamed_and_say_why():
    prog = _reinforce(None, True)
    notes = [e.note for r in prog.passes.records if r.name == "stream" for e in r.events
             if e.kind == "note"]
    assert any("backward recurrence or the whole range" in n for n in notes)


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(programs())
def test_streamed_gradients_equal_jax_grad(spec):
    ctx, bounds, g, want = _build(spec)
    config = tl.CompileConfig(executor=spec["executor"], contract=spec["contract"],
                              stream=True, check_invariants=True)
    prog = ctx.compile(bounds=bounds, outputs={"g": g}, config=config)
    np.testing.assert_allclose(prog.run()["g"], want, rtol=2e-4, atol=2e-4)


def test_loss_mean_is_checked():
    with pytest.raises(tl.TempoLabError, match="loss_mean"):
        ReinforceConfig(loss_mean="episodes")


@pytest.mark.executors(COMPILED, reason="a schedule's property: the reference has none")
def test_a_tl_until_loop_is_never_shifted(executor):
    """A reader one step ahead inside a loop whose end is data-dependent keeps its own loop:
    shifting it would run points past an end that is not known yet."""
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    (T,) = ctx.bounds
    with ctx:
        c = tl.placeholder((), "float32", domain=(t,), name="c")
        c[0] = tl.zeros(())
        c[t] = c[t - 1] + 1.0
        ahead = tl.placeholder((), "float32", domain=(t,), name="ahead")
        ahead[t < T - 1] = c[t + 1] * 2.0
        ahead[t] = c[t]
        total = ahead[0:T].sum(axis=0)
        done = c >= 5.0
    prog = ctx.compile(bounds={T: tl.until(done, max=20)}, outputs={"total": total},
                       config=tl.CompileConfig(executor=executor, stream=True))
    run = prog.run()
    assert run.bounds["T"] == 6
    assert float(run["total"]) == 2 * sum(range(1, 6)) + 5
    a, c_ = (next(i for i, op in prog.sdg.ops.items() if op.name == n) for n in ("ahead", "c"))
    assert prog.schedule.lag(a, c_, "t") == 0
