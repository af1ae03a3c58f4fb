"""The persistent compilation cache (``tl.config.compilation_cache``): a second process running
the same program loads its XLA executable instead of compiling it, and the user's own JAX cache
setting wins over tempo_lab's."""
from __future__ import annotations

import json
import subprocess
import sys

PROGRAM = r"""
import json, sys
import jax
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # cache even a tiny program
if sys.argv[2]:
    jax.config.update("jax_compilation_cache_dir", sys.argv[2])     # the user's own choice
events = []
jax.monitoring.register_event_listener(
    lambda e, **_: events.append(e.rsplit("/", 1)[-1]) if "compilation_cache/" in e else None)
import tempo_lab as tl
tl.config.compilation_cache = sys.argv[1]
tl.config.progress = False
ctx = tl.Context(dims=("t",))
(t,), (T,) = ctx.dims, ctx.bounds
with ctx:
    x = tl.placeholder((4,), "float32", domain=(t,))
    x[0] = tl.ones((4,))
    x[t] = x[t - 1] * 2.0
    y = x[0:t + 1].sum(axis=0)
    if len(sys.argv) > 3:  # a lifted function whose code the command line gives
        exec(f"def scale(v):\n    return v * {sys.argv[3]}")
        y = tl.lift(scale)(y)
prog = ctx.compile(bounds={T: 6}, outputs={"y": y}, config=tl.CompileConfig(executor="xla"))
out = prog.run()["y"]
print(json.dumps({"y": out[-1].tolist(), "events": events,
                  "dir": jax.config.jax_compilation_cache_dir}))
"""


def _run(cache: str, users: str = "", *more: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROGRAM, cache, users, *more],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_compiled_program(tmp_path):
    """The first process compiles (a miss in JAX's cache) and keeps the executable; the second
    loads tempo_lab's serialized executable, without tracing or asking JAX's cache."""
    cache = str(tmp_path / "cache")
    first = _run(cache)
    assert first["dir"] == cache
    assert "cache_misses" in first["events"] and "cache_hits" not in first["events"]
    assert len(list((tmp_path / "cache" / "executables").iterdir())) == 1
    second = _run(cache)
    assert not second["events"], second["events"]
    assert first["y"] == second["y"] == [63.0] * 4


def test_a_program_loaded_from_jaxs_cache_is_not_kept(tmp_path):
    """An executable that JAX loaded from its own cache, serialized again, lacked kernels on
    XLA:CPU (its first run in the next process: "Function ... not found"): a program that JAX's
    cache holds but tempo_lab's does not (another tempo_lab, a cleared directory) is run as
    JAX loaded it and not kept; the next process loads it from JAX's cache again."""
    cache = tmp_path / "cache"
    first = _run(str(cache), "", "2.0")  # fills both, then tempo_lab's is cleared
    for f in (cache / "executables").iterdir():
        f.unlink()
    hit = _run(str(cache), "", "2.0")
    assert "cache_hits" in hit["events"] and not any((cache / "executables").iterdir())
    again = _run(str(cache), "", "2.0")
    assert first["y"] == hit["y"] == again["y"] == [126.0] * 4


def test_a_changed_function_is_not_loaded_from_the_cache(tmp_path):
    """A lifted function is keyed by its code: the same program with another body compiles
    again and computes with the new body."""
    cache = str(tmp_path / "cache")
    assert _run(cache, "", "2.0")["y"] == [126.0] * 4
    again = _run(cache, "", "2.0")
    assert again["y"] == [126.0] * 4 and not again["events"]
    changed = _run(cache, "", "3.0")
    assert changed["y"] == [189.0] * 4 and "cache_misses" in changed["events"]


def test_the_users_own_jax_cache_directory_wins(tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    res = _run(str(ours), str(theirs))
    assert res["dir"] == str(theirs) and "cache_misses" in res["events"]
    assert any(theirs.iterdir()) and not ours.exists()
