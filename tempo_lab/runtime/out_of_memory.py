"""Out of memory is an error, never an abort: a run whose stores cannot fit is refused before it
allocates anything, and a run that still runs out is an ``OutOfMemoryError`` at the user's line.

Before a run, the memory plan's predicted peak of store bytes for the run's bounds is compared
with the memory that is free where the stores live: on a CPU the host's (``MemAvailable`` and
free swap, the address-space and data limits of the process, a cgroup's limit), on an
accelerator what the device's ``memory_stats()`` leaves. The plan counts only the stores, a
lower bound of what the run allocates, so a run is refused only when the stores alone cannot
fit; whatever a run needs beyond them is caught when the runtime reports it (XLA's
``RESOURCE_EXHAUSTED``, NumPy's ``MemoryError``). Either way the message names the program's
largest stores and the bounds that make them large, and the process, this program at smaller
bounds and every other program stay usable.
"""
from __future__ import annotations

import math
import os
import re
import resource
from collections.abc import Mapping

import jax
import numpy as np

from ..errors import OutOfMemoryError
from ..executors import CAPS

# below this a run is not checked: reading what is free costs tens of microseconds, a run
# whose stores take this much costs milliseconds to allocate them
CHECK_FROM = 64 * 2**20
LARGEST = 3  # stores a message names


def check_fits(executable, bounds: Mapping[str, int]) -> bool:
    """Refuse (``OutOfMemoryError``) a run of ``executable`` at ``bounds`` whose predicted
    store peak is above the memory free where its stores live, before it allocates. Returns
    whether runs at these bounds need no check (too small to run out, or not predicted)."""
    need = needed_bytes(executable, bounds)
    if need is None or need < CHECK_FROM:
        return True
    free = free_bytes()
    if free is None or need <= free[0]:
        return False
    lowered = executable.lowered
    raise OutOfMemoryError(
        f"this run needs {_size(need)} for its stores (the memory plan's predicted peak on "
        f"{executable.name} {_bounds(bounds, lowered.memory)}) but {_size(free[0])} is free "
        f"({free[1]}); {largest_stores(executable, bounds)}")


def needed_bytes(executable, bounds: Mapping[str, int]) -> int | None:
    """The store bytes a run at ``bounds`` holds at its peak where its stores live, or None
    where the plan does not say: under a mesh (split over devices), or for an executor that
    allocates as steps reach them when the plan is sized for a ``tl.until``'s ``max``."""
    lowered = executable.lowered
    memory = lowered.memory
    if lowered.layout is not None:
        return None
    static = not CAPS[executable.name].memory_budget  # every store held for the whole run
    if memory.sized_for_max and not static:
        return None
    if static or dict(bounds) == dict(lowered.bounds):
        need = executable.predicted_peak_bytes
    else:
        from ..memory.plan import replan
        memory = replan(memory, lowered.schedule, dict(bounds))
        need = memory.peak_bytes
    if _platform() == "cpu":  # what moves "to the host" stays in the same memory
        need += memory.offloaded_bytes
    # stores the executor holds from its last run, which this run writes in place: counted as
    # used memory already (the XLA executor's kept stores, XlaOptions.carry_stores)
    return max(0, need - getattr(executable.prepared, "held_bytes", 0))


def as_error(e: BaseException, executable, bounds: Mapping[str, int]
             ) -> OutOfMemoryError | None:
    """The ``OutOfMemoryError`` for ``e`` if it is the runtime running out of memory (XLA's
    ``RESOURCE_EXHAUSTED``, a ``MemoryError``), else None."""
    if isinstance(e, OutOfMemoryError) or not _ran_out(e):
        return None
    return OutOfMemoryError(
        f"this run ran out of memory on {executable.name} ({type(e).__name__}: {_said(e)}) "
        f"{_bounds(bounds, executable.lowered.memory)}; {largest_stores(executable, bounds)}")


def reference_error(e: MemoryError, sdg, bounds: Mapping[str, int]) -> OutOfMemoryError:
    """The ``OutOfMemoryError`` of the reference interpreter, which keeps every value it
    computes (each op at every point of its domain) in NumPy: its largest values by bound."""
    sizes = {}
    for i, op in sdg.ops.items():
        points = math.prod(bounds.get(d.bound.name, 1) for d in op.domain)
        spatial = math.prod(x for x in op.type.shape if isinstance(x, int))
        sizes[i] = points * spatial * np.dtype(op.type.dtype).itemsize
    top = sorted(sizes, key=lambda i: (-sizes[i], i))[:LARGEST]
    parts = []
    for i in top:
        op = sdg.ops[i]
        over = ", ".join(f"{d.name} < {d.bound.name} = {bounds.get(d.bound.name, 1)}"
                         for d in op.domain) or "no dims"
        parts.append(f"{op.label} (made at {op.loc}, over {over}): {_size(sizes[i])}")
    return OutOfMemoryError(
        f"the reference interpreter ran out of memory ({type(e).__name__}: {e}) "
        f"{_bounds(bounds, None)}: it keeps every value it computes, and its largest are "
        f"{'; '.join(parts)}. Give smaller bounds, or run the program on a compiled executor "
        "(tl.CompileConfig(executor=\"codegen\") frees each store after its last read).")


def ready(bufs: dict) -> dict:
    """``bufs`` (store buffers by op) once every kernel that writes them has ended: an error
    one met (XLA's ``RESOURCE_EXHAUSTED``) is raised here, where reading a buffer that holds
    one as NumPy aborts the process."""
    jax.block_until_ready(list(bufs.values()))
    return bufs


# what XLA says when an allocation fails: RESOURCE_EXHAUSTED, or, for a kernel dispatched
# after the failed one with its result as input, INTERNAL: "Error dispatching computation: "
# repeated once per kernel, then "Out of memory allocating N bytes."
_XLA_OUT_OF_MEMORY = re.compile(r"RESOURCE_EXHAUSTED|out of memory", re.IGNORECASE)


def _ran_out(e: BaseException) -> bool:
    if isinstance(e, MemoryError):
        return True
    return isinstance(e, RuntimeError) and bool(_XLA_OUT_OF_MEMORY.search(str(e)))


def _said(e: BaseException) -> str:
    """What ``e`` says about memory, without what XLA wrapped it in (one line, cut short)."""
    text = str(e)
    found = _XLA_OUT_OF_MEMORY.search(text)
    said = text[found.start():] if found and not isinstance(e, MemoryError) else text
    return (said.strip().splitlines() or [type(e).__name__])[0][:300]


def largest_stores(executable, bounds: Mapping[str, int]) -> str:
    """The program's largest stores at ``bounds`` (those of at least a hundredth of the
    largest), with their bytes and the bounds their growing axes run to (what makes them
    large), then how to make the run fit."""
    memory = executable.lowered.memory
    static = not CAPS[executable.name].memory_budget
    sizes = executable.store_bytes(bounds)
    top = [i for i in sorted(sizes, key=lambda i: (-sizes[i], i))[:LARGEST]
           if sizes[i] * 100 >= max(sizes.values())]
    parts, large = [], []
    for i in top:
        op, st = memory.sdg.ops[i], memory.storages[i]
        grows = []
        for k, (d, w) in enumerate(zip(op.domain, st.slots)):
            if w is None:
                n = bounds.get(d.bound.name, 1)
                held = st.allocated(k, n) if static else n
                grows.append(f"{d.name} < {d.bound.name} = {n}" +
                             (f" (allocated for {held})" if held != n else ""))
                large.append(d.bound.name)
        what = (f"{st.dtype.name}{list(st.spatial)} at every point of {', '.join(grows)}"
                if grows else st.describe())
        parts.append(f"{op.label} ({what}, made at {op.loc}): {_size(sizes[i])}")
    said = f"its largest stores: {'; '.join(parts)}" if parts else "it has no stores"
    return f"{said}. {_fixes(executable, list(dict.fromkeys(large)))}"


def _fixes(executable, large: list[str]) -> str:
    """How to make a run fit, for this executor and program (``large``: the bounds that make
    the largest stores large)."""
    memory = executable.lowered.memory
    fixes = []
    untils = [b for b in memory.sized_for_max if not CAPS[executable.name].memory_budget]
    if untils:
        fixes.append(f"Give a tl.until max that can be reached ({', '.join(untils)}: "
                     f"{executable.name} allocates its stores for the max at once), or use "
                     "executor=\"codegen\", which allocates blocks as steps reach them")
    large = [b for b in large if b not in untils]
    if large or not untils:
        fixes.append(f"{'Give' if not fixes else 'give'} a smaller "
                     f"{' or '.join(large)}" if large else "Give smaller bounds")
    fixes.append("read fewer points of the largest stores (a window instead of 0:t+1), or "
                 "compile with tl.CompileConfig(device_memory_budget=BYTES) so that the "
                 "codegen executor frees stores early and moves idle ones to the host")
    return "; ".join(fixes) + "."


def free_bytes() -> tuple[int, str] | None:
    """The bytes that can still be allocated where the stores live, and what says so; None
    when nothing does (then nothing is refused)."""
    if _platform() != "cpu":
        stats = _device_stats()
        if stats and stats.get("bytes_limit"):
            return (int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)),
                    f"{jax.local_devices()[0].device_kind}: bytes_limit less bytes_in_use")
        return None
    found = [x for x in (_meminfo(), _rlimit(resource.RLIMIT_AS, "VmSize", "address-space"),
                         _rlimit(resource.RLIMIT_DATA, "VmData", "data"), _cgroup())
             if x is not None]
    return min(found) if found else None


def _platform() -> str:
    return jax.local_devices()[0].platform


def _device_stats() -> dict | None:
    try:
        return jax.local_devices()[0].memory_stats()
    except Exception:  # a back end without statistics
        return None


def _read_kb(path: str, keys: tuple[str, ...]) -> dict[str, int]:
    """``key: value`` lines of a /proc file in kB, as bytes."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in keys:
                    out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return out


def _meminfo() -> tuple[int, str] | None:
    """Linux's estimate of what can be allocated without swapping, with the free swap."""
    got = _read_kb("/proc/meminfo", ("MemAvailable", "SwapFree"))
    if "MemAvailable" not in got:
        return None
    return got["MemAvailable"] + got.get("SwapFree", 0), "MemAvailable and SwapFree"


def _rlimit(which: int, used: str, name: str) -> tuple[int, str] | None:
    """What a resource limit of the process (``ulimit -v``, ``-d``) leaves above its use."""
    soft = resource.getrlimit(which)[0]
    if soft == resource.RLIM_INFINITY:
        return None
    have = _read_kb("/proc/self/status", (used,)).get(used)
    if have is None:
        return None
    return max(0, soft - have), f"the process's {name} limit of {_size(soft)}"


def _cgroup() -> tuple[int, str] | None:
    """What a cgroup v2 memory limit (a container's) leaves: the limit less what the group
    uses, its reclaimable file cache counted as free."""
    root = "/sys/fs/cgroup"
    try:
        with open(os.path.join(root, "memory.max")) as f:
            limit = f.read().strip()
        if limit == "max":
            return None
        with open(os.path.join(root, "memory.current")) as f:
            current = int(f.read())
        cache = 0
        with open(os.path.join(root, "memory.stat")) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "inactive_file":
                    cache = int(value)
    except (OSError, ValueError):
        return None
    return max(0, int(limit) - current + cache), f"the container's limit of {_size(int(limit))}"


def _bounds(bounds: Mapping[str, int], memory) -> str:
    shown = ", ".join(f"{k} = {v}" for k, v in bounds.items())
    if memory is not None and memory.sized_for_max:
        shown += f" (sized for the max of tl.until bound {', '.join(memory.sized_for_max)})"
    return f"at {shown}" if shown else "without bounds"


def _size(n: float) -> str:
    """Bytes for a message, in binary units: ``512 B``, ``16 MiB``, ``38.1 GiB``."""
    for scale, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"
