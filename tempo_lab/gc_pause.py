"""Full garbage collections paused while a program compiles.

Compiling makes and drops hundreds of thousands of small objects (expressions, isl sets, JAX
tracers and jaxpr equations). CPython's collector answers with full collections, each of which
walks every object the process holds, JAX's own included: compiling the small Llama training
program of ``benchmarks.train`` ran two of them, 0.16 s of its 0.9 s ``ctx.compile`` and
tracing. While a compile runs, only full collections wait (the young generations are still
collected, so cycles that die young are freed); the collector's thresholds come back when the
last compile in the process ends, and the next full collection then runs as it would have.
A collector the user turned off (``gc.disable()``) is left alone.
"""
from __future__ import annotations

import gc
import threading
from contextlib import contextmanager

_lock = threading.Lock()
_active = 0            # compiles in progress (threads may compile at once)
_saved: tuple | None = None  # the thresholds to put back when the last one ends
PAUSED = 2 ** 30       # the oldest generation's threshold meanwhile: never reached


@contextmanager
def full_collections_paused():
    """Within it, the collector runs no full collection (see the module's docstring)."""
    global _active, _saved
    with _lock:
        if _active == 0 and gc.isenabled():
            _saved = gc.get_threshold()
            gc.set_threshold(_saved[0], _saved[1], PAUSED)
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0 and _saved is not None:
                if gc.get_threshold()[2] == PAUSED:  # not set by someone else meanwhile
                    gc.set_threshold(*_saved)
                _saved = None
