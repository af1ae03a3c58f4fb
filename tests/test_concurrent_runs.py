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
