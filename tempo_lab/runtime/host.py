"""One run's host side, the same for every executor: store buffers (allocated, grown by whole
blocks, their bytes), host values (constants and arrays on the device, dim values), the user's
``tl.source``/``tl.sink`` functions, the emptiness check of ``max``/``min``, kernels by padded
size, and what the run measures (``Profile``, and its kernel events when recorded).

The loop executors call it directly; the XLA program calls it back from inside XLA
(``jax.experimental.io_callback``), where an exception cannot be raised: a user error there is
kept (``error``) and raised when the program returns.
"""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from .. import progress
from ..ir.callbacks import deliver, source_value
from ..schedule import For, If
from ..symbolic.sizes import size_class
from .kernels import check_nonempty, shared_kernel
from .lowered import Lowered, grown_shape, initial_shape
from .profile import KernelEvent, Profile

ALIGN = 64  # bytes: JAX's CPU client uses a NumPy array this aligned in place, without a copy


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an ``ALIGN``-byte boundary.
    On the CPU, ``jax.device_put`` of such an array is the array itself; of NumPy's own
    arrays (16-byte aligned) it is a copy, so weights made here are held once, not twice."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.empty(n + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + n].view(dt).reshape(shape)


def device_value(value):
    """A host array on the default device, in place where JAX allows it (an aligned array on
    the CPU; see ``aligned_empty``) and copied otherwise."""
    return jax.device_put(np.asarray(value))


def _outermost(node) -> list:
    """The loops of the AST that no other loop encloses."""
    if isinstance(node, For):
        return [node]
    return [x for n in getattr(node, "body", ()) for x in _outermost(n)] + (
        _outermost(node.then) + (_outermost(node.orelse) if node.orelse else [])
        if isinstance(node, If) else [])


class Cached:
    """What a host keeps across runs of one executable: kernels by statement and padded sizes,
    and host arrays already on the device."""

    def __init__(self, lowered: Lowered):
        self.kernels: list[dict] = [{} for _ in lowered.stmts]
        self.device: dict[int, object] = {}
        self.outermost = _outermost(lowered.ast)


def _a32(xs) -> np.ndarray:
    return np.asarray(xs, np.int32)


class Host:
    # what generated code and the interpreter call through the host
    clock, a32, sc = staticmethod(time.perf_counter), staticmethod(_a32), staticmethod(size_class)
    bar = None  # the progress bar, made on a long run's first step (``tick``)
    error: BaseException | None = None  # a user's exception raised by a callback, kept
    offloaded_bytes = 0  # the most offloaded store bytes held on the host at once
    wall_s = 0.0  # the run's wall time, taken when it made its profile

    def __init__(self, lowered: Lowered, sync: bool = False, record: bool = False,
                 cached: Cached | None = None, executor: str = "", bounds=None):
        """A host for one run of ``executor`` with ``bounds`` (the run's own dict)."""
        self.lowered, self.sdg, self.sync, self.record = lowered, lowered.sdg, sync, record
        self.cached = cached or Cached(lowered)
        self.kernels = self.cached.kernels
        self.events: list[KernelEvent] = []
        self.t0 = time.perf_counter()
        self.on_host: dict[int, np.ndarray] = {}  # offloaded stores
        self._run, self._steps = (executor, bounds), 0

    # -- progress -----------------------------------------------------------------------------
    def tick(self) -> None:
        """A step of an outermost loop: a progress bar over their iterations is made on the
        first step after ``progress.DELAY_S`` (shown for long runs only): making a tqdm bar
        costs about 100 µs, which was most of a short run's time."""
        if self.bar is not None:
            self.bar.update()
            return
        self._steps += 1
        executor, env = self._run
        if time.perf_counter() - self.t0 >= progress.DELAY_S:
            total = sum(max(0, n.hi.evaluate(env) - n.lo.evaluate(env))
                        for n in self.cached.outermost)
            self.bar = progress.bar(total or None, f"run ({executor})", "step", delay=0.0)
            self.bar.update(self._steps)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.close()

    # -- kernels ------------------------------------------------------------------------------
    def kernel(self, s: int, pads: tuple):
        """Statement ``s``'s kernel for these padded sizes (made and cached on a miss)."""
        st = self.lowered.stmts[s]
        reads, out = st.static(pads)
        fn = self.kernels[s][pads] = shared_kernel(self.sdg, st.op, reads, out,
                                                   st.slots is not None, st.donate, st.levels)
        return fn

    # -- stores -------------------------------------------------------------------------------
    def alloc(self, op: int):
        """A fresh store buffer (on the devices of its sharding), its growing extents, and its
        bytes."""
        s = self.lowered.stores[op]
        return self._store(s, self._placed(op, jnp.zeros(initial_shape(s), s.dtype)))

    def grow(self, op: int, buf, point: tuple):
        """The buffer extended by whole blocks so that ``point`` fits (same result shape)."""
        s = self.lowered.stores[op]
        want = grown_shape(s, buf.shape[:len(s.slots)], point)
        return self._store(s, self._placed(
            op, jnp.pad(buf, [(0, x - y) for x, y in zip(want, buf.shape)])))

    def offload(self, op: int, buf) -> None:
        """Copy a store to host memory (a real copy); the caller drops the device buffer. A
        store split over devices of several processes: each keeps its own devices' shards."""
        if buf.is_fully_addressable:
            self.on_host[op] = np.array(buf)
        else:
            self.on_host[op] = (buf.shape, buf.sharding, [
                (x.device, np.array(x.data)) for x in buf.addressable_shards])
        self.offloaded_bytes = max(self.offloaded_bytes, sum(
            a.nbytes if isinstance(a, np.ndarray) else sum(x.nbytes for _, x in a[2])
            for a in self.on_host.values()))

    def fetch(self, op: int):
        """The offloaded store back on its device(s)."""
        held = self.on_host.pop(op)
        if isinstance(held, np.ndarray):
            return self._placed(op, jax.device_put(held))
        shape, sharding, shards = held
        return jax.make_array_from_single_device_arrays(
            shape, sharding, [jax.device_put(x, d) for d, x in shards])

    def _placed(self, op: int, buf):
        layout = self.lowered.layout
        return buf if layout is None else layout.place(buf, layout.store(op, buf.ndim))

    @staticmethod
    def _store(s, buf):
        return (buf, *[buf.shape[k] for k, w in enumerate(s.slots) if w is None],
                int(buf.size) * buf.dtype.itemsize)

    # -- host values --------------------------------------------------------------------------
    def host_array(self, op: int):
        arr = self.cached.device.get(op)
        if arr is None:
            value, layout = self.lowered.host_array(op), self.lowered.layout
            arr = self.cached.device[op] = (device_value(value) if layout is None else
                                            layout.place(value, layout.host(op, np.ndim(value))))
        return arr

    def host_points(self, op: int) -> tuple:
        """A ``from_array`` op's array on the device as one array per point of its first axis
        (views of the host array: in place where ``device_value`` is)."""
        key = (op, "points")
        arr = self.cached.device.get(key)
        if arr is None:
            value = np.asarray(self.lowered.host_array(op))
            arr = self.cached.device[key] = tuple(device_value(v) for v in value)
        return arr

    def dimval(self, s: int, value):
        return np.asarray(value, self.lowered.stmts[s].op.type.dtype)

    def _at(self, s: int, point) -> dict[str, int]:
        return {d.name: int(v) for d, v in zip(self.lowered.stmts[s].op.domain, point)}

    def source_call(self, s: int, point: tuple):
        """The user's function at ``point``, called in this process (inside a compiled
        program JAX calls it in one process and XLA hands the value to the others)."""
        return source_value(self.lowered.stmts[s].op, self._at(s, point))

    def source(self, s: int, point: tuple):
        """The value at ``point`` as every process of the mesh sees it: called in the leader
        and sent to the others (each calling it could give each a different value)."""
        layout = self.lowered.layout
        if layout is None or not layout.multiprocess:
            return self.source_call(s, point)
        op = self.lowered.stmts[s].op
        return layout.from_leader(lambda: self.source_call(s, point),
                                  np.zeros(op.type.shape, op.type.dtype))

    def sink(self, s: int, point: tuple, y, lens) -> None:
        layout = self.lowered.layout
        if layout is not None and layout.multiprocess and not layout.leader:
            return
        value = np.asarray(y)[tuple(slice(0, int(n)) for n in lens if n is not None)]
        deliver(self.lowered.stmts[s].op, self._at(s, point), value)

    def check(self, s: int, lens, point: tuple) -> None:
        check_nonempty(self.lowered.stmts[s].op, [None if n is None else int(n) for n in lens],
                       tuple(int(v) for v in point))

    # -- calls from inside a compiled program -------------------------------------------------
    def guarded(self, method: str, default=None):
        """``method`` as a callback for a compiled program: after an error (a user's, or a
        ``KeyboardInterrupt`` in a user's function) it does nothing more, the error waits in
        ``error`` and is raised as it is when the program returns (raised inside XLA, it came
        out as an XLA runtime error), and it returns ``default()`` then."""
        fn = getattr(self, method)

        def call(*args):
            if self.error is None:
                try:
                    return fn(*args)
                except BaseException as e:  # noqa: BLE001 - Ctrl-C too: raised after the program
                    self.error = e
            return None if default is None else default()
        return call

    def raise_error(self):
        if self.error is not None:
            err, self.error = self.error, None
            raise err

    # -- measurements -------------------------------------------------------------------------
    def event(self, op: int, point: tuple, start: float, nbytes: int) -> None:
        self.events.append(KernelEvent(op, tuple(int(v) for v in point), start - self.t0,
                                       time.perf_counter() - self.t0, nbytes))

    def profile(self, executor: str, calls, seconds, timeline, measured: str,
                synced: bool | None = None):
        """What the run measured (fresh objects, not changed after): the run's wall time now
        (``wall_s``), and a function that makes its ``Profile`` when ``run.profile`` is first
        read (most runs are never asked; making it cost a tenth of a one-op program's run).
        ``calls``: statement counts by op, or a function that gives them then."""
        wall = self.wall_s = time.perf_counter() - self.t0
        return functools.partial(_profile, self.sdg, executor, calls, seconds, timeline, measured,
                                 self.sync if synced is None else synced, wall, self.events,
                                 self.offloaded_bytes)


def _profile(sdg, executor, calls, seconds, timeline, measured, synced, wall, events, offloaded):
    """A run's ``Profile``, made when it is first read (``Host.profile``)."""
    return Profile(sdg, calls={i: int(n) for i, n in (
                       calls() if callable(calls) else calls).items() if n},
                   seconds=dict(seconds), timeline=list(timeline), wall_s=wall, synced=synced,
                   measured=measured, executor=executor, events=events,
                   offloaded_bytes=offloaded)
