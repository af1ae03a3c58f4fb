"""Process-wide caches stay bounded: by entries, and by bytes where an entry's size is known
(compiled XLA programs, which hold their code resident)."""

import tempo_lab as tl
from tempo_lab.cache import LRU
from tempo_lab.runtime import xla


def test_lru_keeps_to_its_bytes_but_always_the_newest():
    cache = LRU(10, max_bytes=100, weigh=len)
    for k in range(5):
        cache.get(k, lambda: "x" * 30)
    assert len(cache) == 3 and cache.nbytes == 90  # the two oldest went
    cache.get(1, lambda: "y" * 300)  # larger than the whole budget: kept alone
    assert len(cache) == 1 and cache.nbytes == 300
    assert cache.get(1, lambda: "new") == "y" * 300
    held = []  # the entry above the budget goes before the next is made, not after
    cache.get(2, lambda: held.append(len(cache)) or "z")
    assert held == [0] and len(cache) == 1 and cache.nbytes == 1
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0
    counted = LRU(2)
    for k in range(4):
        counted.get(k, lambda k=k: k)
    assert len(counted) == 2 and counted.values() == [2, 3]


def _program(width: int):
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        h = tl.placeholder((width,), domain=(t,), name="h")
        h[0] = tl.ones((width,))
        h[t] = tl.tanh(h[t - 1] * 0.5 + 1.0)
        y = h[0:T].sum(axis=0)
    return ctx.compile(bounds={T: 6}, outputs={"y": y}, config=tl.CompileConfig(executor="xla"))


def test_compiled_xla_programs_are_bounded_by_their_resident_bytes(monkeypatch):
    """Each distinct program adds a compiled program to the process-wide cache; the cache keeps
    at most PROGRAM_BYTES of them (estimated from their HLO text on the CPU), so a session that
    compiles program after program stops growing there."""
    xla._PROGRAMS.clear()
    prog = _program(3)
    prog.run()
    one = xla._PROGRAMS.nbytes
    assert one == xla.program_bytes(prog.executable.prepared._compiled()) > 0
    monkeypatch.setattr(xla._PROGRAMS, "max_bytes", int(2.5 * one))
    for width in range(4, 10):
        run = _program(width).run()
        assert run["y"].shape == (width,)
    assert len(xla._PROGRAMS) <= 3 and xla._PROGRAMS.nbytes <= 2.5 * one * 1.5
    xla._PROGRAMS.clear()
