"""Runs of one compiled XLA program in several threads at once: each run's ``tl.sink`` and
``tl.source`` callbacks reach that run's own functions (a callback finds its run by an id the
program gets as an argument, not by which run started last)."""
import threading

import numpy as np

import tempo_lab as tl


def _program(tag: float, seen: list):
    """The same program structure for every ``tag`` (one compiled XLA program serves all);
    only the callbacks differ."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.source(lambda p: np.float32(tag), shape=(), dtype=np.float32, domain=(t,))
        y = x * 2.0
        tl.sink(y, lambda p, v: seen.append(float(v)))
    return ctx.compile(bounds={T: 200}, outputs={"y": y},
                       config=tl.CompileConfig(executor="xla"))


def test_concurrent_runs_call_back_their_own_functions():
    tags = (1.0, 2.0, 3.0, 4.0)
    seen = {tag: [] for tag in tags}
    progs = {tag: _program(tag, seen[tag]) for tag in tags}
    errors = []

    def work(tag):
        try:
            for _ in range(3):
                progs[tag].run()
        except Exception as e:  # reported below, with the thread's tag
            errors.append((tag, e))

    threads = [threading.Thread(target=work, args=(tag,)) for tag in tags]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not errors, errors
    for tag in tags:
        assert seen[tag] == [2.0 * tag] * (3 * 200), (tag, sorted(set(seen[tag])))


def test_threads_running_one_program_without_callbacks_each_get_their_own_run():
    """A program without callbacks keeps nothing of a run on its host, so each thread reuses
    one host for its runs: every run still returns its own arrays and its own profile, with its
    own wall time (a host shared between threads would mix them)."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    x = np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32)
    with ctx:
        y = tl.tanh(tl.from_array(x, domain=(t,), name="x")) * 2.0
    prog = ctx.compile(bounds={T: 64}, outputs={"y": y}, config=tl.CompileConfig(executor="xla"))
    want = np.tanh(x) * 2.0
    runs, errors = [], []

    def work():
        try:
            for _ in range(50):
                runs.append(prog.run())
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not errors, errors
    assert len(runs) == 200
    assert len({id(r["y"]) for r in runs}) == 200  # no run's array is another's
    for r in runs:
        np.testing.assert_allclose(r["y"], want, rtol=1e-6)
        assert r.profile.executor == "xla" and 0 < r.profile.wall_s == r.seconds < 60
    assert len({id(r.profile) for r in runs}) == 200
    recorded = prog.run(record=True)  # a recording run gets a host of its own
    np.testing.assert_allclose(recorded["y"], want, rtol=1e-6)
