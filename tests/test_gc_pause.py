"""Full garbage collections wait while a program compiles, and the collector's thresholds come
back afterwards (``tempo_lab/gc_pause.py``)."""

import gc

import numpy as np
import pytest

import tempo_lab as tl
from tempo_lab import gc_pause, program
from tempo_lab.gc_pause import full_collections_paused
from tempo_lab.runtime import xla


@pytest.fixture
def eager_collector():
    """A collector with thresholds of its own, put back afterwards."""
    saved, enabled = gc.get_threshold(), gc.isenabled()
    gc.enable()
    gc.set_threshold(50, 1, 1)
    yield
    gc.set_threshold(*saved)
    if not enabled:
        gc.disable()


def test_a_compile_and_the_xla_trace_run_paused(eager_collector, monkeypatch):
    """The passes (inside ``ctx.compile``) and the XLA executor's tracing (at the first run)
    see the oldest generation's threshold out of reach; afterwards it is back."""
    seen = {}

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            seen[name] = gc.get_threshold()
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(program, "run_passes", spy("passes", program.run_passes))
    monkeypatch.setattr(xla, "make_program", spy("trace", xla.make_program))
    monkeypatch.setattr(tl.config, "compilation_cache", "")  # traced, not loaded
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.from_array(np.arange(7, dtype=np.float32), domain=(t,))
        y = tl.placeholder((), "float32", domain=(t,))
        y[0] = x[0]
        y[t >= 1] = y[t - 1] * 0.5 + tl.tanh(x[t])
    prog = ctx.compile(bounds={T: 7}, outputs={"y": y}, config=tl.CompileConfig(
        executor="xla"))
    assert gc.get_threshold() == (50, 1, 1)
    got = prog.run()["y"]
    assert seen == {"passes": (50, 1, gc_pause.PAUSED), "trace": (50, 1, gc_pause.PAUSED)}
    assert gc.get_threshold() == (50, 1, 1)
    expect = np.zeros(7, np.float32)
    for k in range(7):
        expect[k] = (expect[k - 1] * 0.5 if k else 0) + np.tanh(k)
    np.testing.assert_allclose(got, expect, rtol=1e-6)


def test_nested_pauses_end_with_the_outermost_even_after_an_error(eager_collector):
    with pytest.raises(ValueError):
        with full_collections_paused():
            with full_collections_paused():
                assert gc.get_threshold()[2] > 10 ** 6
            assert gc.get_threshold()[2] > 10 ** 6  # the outer compile still runs
            raise ValueError
    assert gc.get_threshold() == (50, 1, 1)


def test_thresholds_the_user_sets_meanwhile_are_kept(eager_collector):
    with full_collections_paused():
        gc.set_threshold(100, 5, 5)
    assert gc.get_threshold() == (100, 5, 5)


def test_a_collector_turned_off_is_left_alone(eager_collector):
    gc.disable()
    with full_collections_paused():
        assert gc.get_threshold() == (50, 1, 1) and not gc.isenabled()
    assert gc.get_threshold() == (50, 1, 1) and not gc.isenabled()
