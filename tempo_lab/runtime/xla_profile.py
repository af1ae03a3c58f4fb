"""Measured time inside one compiled XLA program, per name scope.

A whole program compiled by XLA is one call: wall time says nothing about its parts. JAX's
profiler (``jax.profiler.trace``) records every thunk XLA runs (a fusion, a dot, a loop's
body instructions at every trip) with its duration, named by its HLO instruction; the compiled
HLO text says which traced operation each instruction came from (``metadata={op_name=...}``,
the path of ``jax.named_scope``s it was traced in). Joining the two gives measured seconds per
scope. A fusion of instructions from several scopes is counted under its root's scope (XLA
does not split a fused kernel's time), and time outside thunks (dispatch, the host side of
loops) is reported apart as ``unattributed``. A loop's ``while`` thunk spans its whole run, so
its time less that of the thunks inside it is its loop control (``loop_seconds``).

``XlaInspection`` gives the XLA executor's prepared program (``runtime/xla.py``) these measures
and what XLA says of it (HLO text, memory analysis, jaxpr) as methods, reached as
``executable.op_seconds()`` and the like.
"""
from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import tempfile
import time
from bisect import bisect_left
from collections.abc import Callable

import jax
import numpy as np

from ..errors import ArgumentError, user_location

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*?\s([\w\-]+)\(")
_CONTAINERS = ("while", "conditional", "call")  # their events span their bodies' thunks
_COMP = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLS = re.compile(r"(?:calls|to_apply|body|condition)=%?([\w.\-]+)")
_CALL_EVENTS = ("PjitFunction(", "ThunkExecutor::Execute")  # a call's dispatch and execution
_NAME = re.compile(r'op_name="([^"]*)"')
_OP_SCOPE = re.compile(r"(?:^|/)op(\d+)(?=/|$)")
_LOOP_SCOPE = re.compile(r"(?:^|/)loop(\d+)/while$")


def _loop_of(path: str) -> int | None:
    """The loop a ``while`` instruction's ``op_name`` path was traced for (``xla_trace._Trace.loop``)."""
    m = _LOOP_SCOPE.search(path)
    return int(m.group(1)) if m else None


def _op_of(path: str) -> int | None:
    """The op an HLO instruction's ``op_name`` path was traced for (its innermost op scope)."""
    m = _OP_SCOPE.findall(path)
    return int(m[-1]) if m else None


def instruction_scopes(hlo: str, wanted: Callable[[str], bool] = lambda _: True
                       ) -> dict[str, str]:
    """Each HLO instruction's ``op_name`` path; an instruction without one (a fusion, a
    wrapped call) takes the path of the last named instruction of what it calls (its root),
    and so does one whose own path is not ``wanted`` when something inside it is (a fusion
    XLA rooted at a store's update, named after the update, computes an op's values: its time
    is that op's). Control flow (``while``, ``conditional``, ``call``) is left out: its
    thunks' time is counted in the instructions of its bodies."""
    own, calls, body = _parse(hlo)

    def path(name: str, seen: frozenset = frozenset()) -> str | None:
        if name in own and wanted(own[name]):
            return own[name]
        for callee in calls.get(name, ()):
            for inner in reversed(body.get(callee, ())):
                if inner not in seen and (p := path(inner, seen | {name})) is not None \
                        and wanted(p):
                    return p
        return own.get(name)

    return {name: p for name in calls if (p := path(name)) is not None}


def _parse(hlo: str):
    """Per instruction outside control flow: its own ``op_name`` (``own``) and the
    computations it calls (``calls``); per computation, its instructions (``body``)."""
    own: dict[str, str] = {}
    calls: dict[str, list[str]] = {}
    body: dict[str, list[str]] = collections.defaultdict(list)
    comp = None
    for line in hlo.splitlines():
        m = _INSTR.match(line)
        if m is None:
            c = _COMP.match(line)
            if c and "=" not in line.split("{")[0]:
                comp = c.group(1)
            continue
        name = m.group(1)
        if m.group(2) in _CONTAINERS:
            continue
        if comp is not None:
            body[comp].append(name)
        if (n := _NAME.search(line)) is not None:
            own[name] = n.group(1)
        calls[name] = _CALLS.findall(line)
    return own, calls, body


def kernel_members(hlo: str) -> dict[str, set[str]]:
    """Each instruction that calls computations (a fusion: one kernel): the ``op_name`` paths
    of every instruction inside it, so that an op fused into a kernel counted under another
    op's scope can say where its time went."""
    own, calls, body = _parse(hlo)

    def inside(name: str, seen: frozenset) -> set[str]:
        out = {own[name]} if name in own else set()
        for callee in calls.get(name, ()):
            for inner in body.get(callee, ()):
                if inner not in seen:
                    out |= inside(inner, seen | {inner})
        return out

    return {name: inside(name, frozenset({name})) for name, cs in calls.items() if cs}


def thunk_intervals(call: Callable[[], object], runs: int = 3
                    ) -> tuple[dict[str, list[tuple[float, float]]], float]:
    """Run ``call()`` (which must wait for its results) ``runs`` times under JAX's profiler:
    each HLO instruction name's executions as (start, end) seconds, and the wall seconds the
    traced calls span (dispatch and execution: their union)."""
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            for _ in range(runs):
                call()
        (path,) = glob.glob(os.path.join(d, "**", "perfetto_trace.json.gz"), recursive=True)
        with gzip.open(path) as f:
            events = json.load(f)["traceEvents"]
    per: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    calls = []
    for ev in events:
        if ev.get("ph") != "X" or "dur" not in ev or ev["name"].startswith("end: "):
            continue
        span = (ev["ts"] * 1e-6, (ev["ts"] + ev["dur"]) * 1e-6)
        if ev["name"].startswith(_CALL_EVENTS):
            calls.append(span)
        else:
            per[ev["name"]].append(span)
    return dict(per), _covered(calls)


def _covered(spans) -> float:
    """Seconds covered by the union of ``spans``: thunks that run at once on several
    threads count once, so phases add up to wall time."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def seconds_by(call: Callable[[], object], hlo: str, key: Callable[[str], object],
               runs: int = 3) -> dict:
    """Measured seconds per run of ``call()`` grouped by ``key(op_name path)`` (None: not one
    of the program's instructions): the time the group's thunks cover (overlapping thunks
    count once), plus ``"unattributed"``: the traced calls' wall time no grouped thunk
    covers (loop control, dispatch, waiting)."""
    scopes = instruction_scopes(hlo, lambda p: key(p) is not None)
    per, wall = thunk_intervals(call, runs)
    groups: dict[str, list] = collections.defaultdict(list)
    for name, spans in per.items():
        if name in scopes and (k := key(scopes[name])) is not None:
            groups[k] += spans
    out = {k: _covered(v) / runs for k, v in groups.items()}
    out["unattributed"] = max(0.0, wall - _covered([x for v in groups.values() for x in v])) / runs
    return out


def loop_seconds(call: Callable[[], object], hlo: str, key: Callable[[str], object],
                 runs: int = 3) -> dict:
    """Measured seconds per run of ``call()`` inside each loop, grouped by ``key(op_name path
    of its while instruction)`` (None: not counted): ``{"seconds": its while thunks' time,
    "control": the part of it that neither a thunk nor a loop inside it covers}`` -- the
    loop's own control (the trip count's test, carrying its state, the host side of every
    step), so that the loops' controls add up."""
    whiles, containers = {}, set()
    for line in hlo.splitlines():
        m = _INSTR.match(line)
        if m is None or m.group(2) not in _CONTAINERS:
            continue
        containers.add(m.group(1))
        n = _NAME.search(line)
        if m.group(2) == "while" and n is not None and (k := key(n.group(1))) is not None:
            whiles[m.group(1)] = k
    per, _ = thunk_intervals(call, runs)
    # what covers a loop's time: thunks (None), and the loops inside it (their key)
    covers = sorted((a, b, whiles.get(name)) for name, spans in per.items()
                    if name not in containers or name in whiles for a, b in spans)
    starts = [a for a, _, _ in covers]
    loops: dict = collections.defaultdict(list)
    for name, k in whiles.items():
        loops[k] += per.get(name, [])
    out = {}
    for k, spans in loops.items():
        inside = [(x, min(y, b)) for a, b in spans  # inside a loop's span or apart from it
                  for x, y, j in covers[bisect_left(starts, a):bisect_left(starts, b)]
                  if j != k]
        total = _covered(spans)
        out[k] = {"seconds": total / runs,
                  "control": max(0.0, total - _covered(inside)) / runs}
    return out


class XlaInspection:
    """What the compiled XLA program says of itself and what it measures, as methods of the
    XLA executor's prepared program, which gives ``_compiled()`` (the compiled program),
    ``_program()`` and ``_args()`` (what it traces, and the arguments for the compiled
    bounds), ``_bvec`` and ``_hosts`` (a run's arguments), ``lowered``, ``plan`` and
    ``bounds``; ``_call(fn, bvec, hosts)`` calls it as a run does."""

    def hlo(self) -> str:
        """The compiled XLA program as HLO text (after SPMD partitioning on a mesh: the shapes
        are one device's)."""
        return self._compiled().as_text()

    def memory_analysis(self) -> dict[str, int]:
        """XLA's own account of the compiled program's buffers, in bytes by kind (arguments,
        outputs, temporaries, aliased, generated code); empty where the backend gives none.
        It compiles the program if no run has yet."""
        stats = self._compiled().memory_analysis()
        kinds = ("argument", "output", "temp", "alias", "generated_code")
        return {} if stats is None else {
            k: int(getattr(stats, f"{k}_size_in_bytes")) for k in kinds
            if hasattr(stats, f"{k}_size_in_bytes")}

    def op_seconds(self, runs: int = 3) -> dict:
        """Measured seconds per run of each op's statements inside the compiled program (JAX's
        profiler, see ``xla_profile``), keyed by op id; ``"unattributed"``: the rest of the
        run's wall time (loop control, dispatch)."""
        return seconds_by(self._profiled(runs, "op_seconds"), self.hlo(), _op_of, runs)

    def loop_seconds(self, runs: int = 3) -> dict:
        """Measured seconds per run inside each loop of the compiled program, keyed by its
        number (``XlaPlan.loops``, as the source lists them): ``{"loop": its variable and
        range, "seconds": ..., "control": the part no op's thunk covers}`` (see
        ``xla_profile.loop_seconds``). Where ``op_seconds`` says the rest of a run is
        ``unattributed``, this says which loop's control it is."""
        call = self._profiled(runs, "loop_seconds")
        found = loop_seconds(call, self.hlo(), _loop_of, runs)
        return {k: {"loop": self.plan.loop_label(k), **found[k]} for k in sorted(found)}

    def program_seconds(self, runs: int = 3) -> float:
        """Measured seconds of the compiled program alone, warm: the median of ``runs`` calls
        of it on the last run's arguments, without the profiler (which slows every thunk) and
        without a run's Python or fetching its results. A run's time less this is its host's
        share; ``op_seconds`` splits this into ops."""
        call = self._profiled(runs, "program_seconds")
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    def _profiled(self, runs, what: str):
        """The warm call that ``op_seconds`` and ``loop_seconds`` profile and
        ``program_seconds`` times."""
        if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
            raise ArgumentError(f"{what}(runs={runs!r}): give a positive number of runs",
                                user_location())
        if self.lowered.sources or self.lowered.sinks:
            raise ArgumentError(f"{what} runs the program several times without a run's "
                                "host: it would call the program's tl.sink/tl.source "
                                "callbacks again; profile a copy of the program without them",
                                user_location())
        fn, args = self._compiled(), (self._bvec(self.bounds), self._hosts())  # as a run's
        self._call(fn, *args)  # compiled and warm before anything is measured
        return lambda: self._call(fn, *args)

    def fused_ops(self, timed) -> dict[int, tuple[str, int]]:
        """Ops without time of their own (not in ``timed``, the ops ``op_seconds`` measured)
        because XLA fused them into a kernel whose time is counted under another op (the op of
        its root): op id -> (the kernel's HLO name, the op its time is counted under)."""
        hlo = self.hlo()
        roots = {name: _op_of(path) for name, path in
                 instruction_scopes(hlo, lambda p: _op_of(p) is not None).items()}
        out: dict[int, tuple[str, int]] = {}
        for kernel, paths in sorted(kernel_members(hlo).items()):
            root = roots.get(kernel)
            if root in timed:
                for op in {_op_of(p) for p in paths} - {None, root} - set(timed):
                    out.setdefault(op, (kernel, root))
        return out

    def jaxpr(self) -> str:
        """The traced program as a jaxpr (text)."""
        return str(jax.make_jaxpr(self._program())(*self._args()))
