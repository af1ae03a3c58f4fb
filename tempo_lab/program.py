"""``Program``: a compiled context, tying its stages together (``Run``, its results, is in
``runtime/run.py``)."""
from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from . import progress
from .compile_config import EXECUTORS, CompileConfig
from .errors import ArgumentError, BoundsError, OutputError, TempoLabError, user_api, user_location
from .executors import lowers, resolve
from .frontend.bounds import normalise_bounds
from .frontend.build import build_sdg
from .frontend.context import user_name
from .frontend.tensor import RecurrentTensor
from .frontend.validate import validate
from .gc_pause import full_collections_paused
from .ir.callbacks import calls_python
from .ir.sdg import SDG
from .memory import best_schedule, meet_budget
from .passes import run_passes
from .runtime.executable import make_backend
from .runtime.lowered import Lowered
from .runtime.run import Run, put_back, put_back_recipe
from .runtime.sharding import Layout
from .stage import Stage
from .symbolic import Bound

# EXECUTORS: the names CompileConfig(executor=...) takes, also read as tl.program.EXECUTORS
__all__ = ["EXECUTORS", "Program", "compile_context"]


def _normalise_outputs(outputs, ctx) -> dict[str, RecurrentTensor]:
    if isinstance(outputs, RecurrentTensor):
        outputs = [outputs]
    if isinstance(outputs, Mapping):
        items = list(outputs.items())
    else:
        items = [(rt.node.name if isinstance(rt, RecurrentTensor) and rt.node.name
                  and rt.index is None else f"out{k}", rt) for k, rt in enumerate(outputs)]
    if not items and not ctx._sinks:
        raise TempoLabError("compile needs at least one output or a tl.sink: "
                            "outputs={'y': y} or [y]")
    for name, rt in items:
        if not isinstance(name, str) or not name:
            raise ArgumentError(f"output name {name!r} is not a string; name outputs with "
                                "strings: outputs={'y': y}")
        user_name(name, "compile: an output")
        if not isinstance(rt, RecurrentTensor):
            raise ArgumentError(f"output {name!r} is {type(rt).__name__}, not a recurrent "
                                "tensor")
    if len({n for n, _ in items}) != len(items):
        raise ArgumentError("two outputs have the same name; name each output once")
    return dict(items)


def _used_bounds(sdg: SDG) -> set[str]:
    used = set()
    for op in sdg.ops.values():
        used |= {d.bound.name for d in op.domain}
        used |= {s.name for x in op.type.shape if not isinstance(x, int) for s in x.bounds()}
        if op.kind == "dimval":
            used |= {s.name for s in op.attrs["expr"].symbols() if isinstance(s, Bound)}
    for e in sdg.edges:
        used |= {s.name for x in e.index for s in x.symbols() if isinstance(s, Bound)}
        used |= {s.name for s in e.cond.symbols() if isinstance(s, Bound)}
    return used


class _Stages:
    """Times each compilation stage (``prog.compile_times``) and shows them as a progress bar
    when compiling takes long."""

    STAGES = ("build", "validate", "passes", "schedule", "lower", "compile")

    def __init__(self):
        self.times: dict[str, float] = {}
        self.bar = progress.bar(len(self.STAGES), "compile", "stage")

    @contextlib.contextmanager
    def stage(self, name: str):
        self.bar.set_description_str(f"compile: {name}", refresh=False)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t0
            self.bar.update()


@user_api
def compile_context(ctx, bounds, outputs, config: CompileConfig | None = None) -> Program:
    """``ctx.compile``: the stages made in turn, each from the one before, by the layer that
    owns it (the trace built into an SDG and validated, the SDG optimised by its passes, the
    schedule chosen by its memory plan, offloads placed under a budget, the plan lowered, the
    lowered program compiled for the executor resolved before the passes), each timed."""
    config = config or CompileConfig()
    if not isinstance(config, CompileConfig):
        raise ArgumentError(f"config={config!r}: give a tl.CompileConfig(...)")
    loc = user_location()
    st = _Stages()
    try:
        with full_collections_paused():
            return _compile(ctx, bounds, outputs, config, loc, st)
    finally:
        st.bar.close()


def _compile(ctx, bounds, outputs, config: CompileConfig, loc, st: _Stages) -> Program:
    """The body of ``compile_context``, with full garbage collections paused."""
    with st.stage("build"):
        bounds, dynamic, ragged = normalise_bounds(ctx, bounds)
        outs = _normalise_outputs(outputs, ctx)
        for rt in outs.values():
            if rt.ctx is not ctx:
                raise TempoLabError("an output belongs to another tl.Context", loc)
        sdg = build_sdg(ctx, outs, untils=dynamic, ragged=ragged)
        missing = sorted(_used_bounds(sdg) - set(bounds))
        if missing:
            raise BoundsError(f"no value for the bound(s) {', '.join(missing)}; pass them "
                              f"in bounds={{{', '.join(f'{m}: ...' for m in missing)}}}", loc)
    if config.validate:
        with st.stage("validate"):
            validate(sdg, bounds)
    # "auto" resolved once, before the passes: they and the compile step read the choice
    executor = resolve(config.executor, calls_python(sdg.ops),
                       config.device_memory_budget is not None)
    with st.stage("passes"):
        ends = {**dynamic, **{n: r for n, r in ragged.items() if r.lengths is None}}
        sdg, passes = run_passes(sdg, config, config.check_invariants, bounds, ends,
                                 executor)
    # the compiled bound values, with the dims a pass added (tiling's blocks): this one
    # dict is held by the Lowered stage and read by the Program and the backends
    bounds = {k: int(v) for k, v in {**bounds, **passes.new_bounds}.items()}
    lowered = executable = None
    if lowers(executor.name):
        lowered = _lowered(sdg, bounds, config, st, loc)
        with st.stage("compile"):
            executable = lowered.compile(executor, config.sync_profile, config.xla_split)
            if lowered.layout is not None:
                lowered.layout.agree(f"{executable.name} {sorted(bounds.items())}\n"
                                     f"{lowered.ast}", loc)
    return Program(ctx.trace, passes, bounds, outs, config, st.times, lowered, executable)


def _lowered(sdg: SDG, bounds: dict[str, int], config: CompileConfig, st: _Stages,
             loc) -> Lowered:
    """The optimised SDG scheduled, its memory planned (under the budget, if any), offloads
    placed to meet the budget, and the result lowered."""
    budget = config.device_memory_budget
    with st.stage("schedule"):
        schedule, memory, st.times["memory"] = best_schedule(sdg, bounds, config.block_size,
                                                             budget)
    st.times["schedule"] -= st.times["memory"]  # its own stage, timed inside
    if budget is not None:
        with st.stage("offload"):
            schedule, memory = meet_budget(schedule, memory, bounds, budget)
    with st.stage("lower"):
        layout = (Layout(sdg, config.mesh, config.shard, bounds, loc) if config.shard
                  else None)
        return Lowered(sdg, schedule, memory, bounds, layout)


class Program(Stage):
    """A compiled program: its stages (``trace``, ``passes``, ``sdg``, ``schedule``,
    ``memory``, ``lowered``, ``executable``) and ``run()``. Each stage is held once, by the
    stage that made it from the one before: ``sdg`` is ``passes.final``; ``schedule``,
    ``memory`` and ``bounds`` are the ``Lowered``'s (for the reference, which lowers nothing,
    ``schedule`` and ``memory`` are None and the program holds ``bounds``)."""

    def __init__(self, trace, passes, bounds: dict[str, int], outputs, config, times,
                 lowered=None, executable=None):
        self.trace, self.config = trace, config
        self.passes = passes  # PassTrace: the SDG as built is passes.initial; sdg is the result
        self.lowered = lowered
        self._bounds = bounds if lowered is None else None
        self.executable = None if executable is None else executable.for_program(self)
        self._outputs = dict(outputs)
        self.compile_times: dict[str, float] = dict(times)

    @property
    def sdg(self) -> SDG:
        """The SDG the passes made (``passes.final``)."""
        return self.passes.final

    @property
    def schedule(self):
        """The loop nest (``Schedule``), with its frees and offloads."""
        return None if self.lowered is None else self.lowered.schedule

    @property
    def memory(self):
        """The memory plan (``MemoryPlan``)."""
        return None if self.lowered is None else self.lowered.memory

    @property
    def bounds(self) -> dict[str, int]:
        """The compiled bound values, with the dims a pass added."""
        return self._bounds if self.lowered is None else self.lowered.bounds

    @functools.cached_property
    def ragged(self):
        """The ragged bounds as written (``ir.sdg.Ragged``), before the pass made boxes."""
        return self.passes.initial.ragged

    def __repr__(self) -> str:
        b = ", ".join(f"{k}={v}" for k, v in self.bounds.items())
        return (f"Program(outputs=({', '.join(self._outputs)}), bounds=({b}), "
                f"executor={self.executor})")

    @property
    def executor(self) -> str:
        """The executor that runs this program (auto's choice, see ``executable.pretty()``)."""
        return self.executable.name if self.executable is not None else self.config.executor

    def _sections(self):
        outs = []
        for name, i in self.sdg.outputs.items():
            op = self.sdg.ops[i]
            outs.append(f"{name}: {op.type} over ({', '.join(map(str, op.domain))})")
        return [("bounds", [f"{k} = {v}" for k, v in self.bounds.items()]),
                ("outputs", outs),
                ("stages", [repr(x) for x in (self.trace, self.passes, self.sdg, self.schedule,
                                              self.memory) if x is not None])]

    def to_dict(self) -> dict:
        return {"schema": "tempo_lab.program/1", "repr": repr(self), "bounds": self.bounds,
                "executor": self.executor, "outputs": list(self._outputs),
                "trace": self.trace.to_dict(), "sdg": self.sdg.to_dict(),
                **{name: stage.to_dict() for name, stage in (
                    ("passes", self.passes), ("schedule", self.schedule),
                    ("memory", self.memory)) if stage is not None},
                "compile_times": dict(self.compile_times)}

    @user_api
    def on(self, executor: str) -> Program:
        """This compiled program (same SDG, schedule and memory plan) on another executor:
        "xla", "codegen", "interpreter", "auto" or "reference"."""
        config = replace(self.config, executor=executor)
        executable = None
        if lowers(config.executor):
            if self.lowered is None:
                raise TempoLabError("this program was compiled for the reference interpreter "
                                    "and has no schedule; compile it with another executor")
            executable = self.lowered.compile(executor, config.sync_profile, config.xla_split)
        return Program(self.trace, self.passes, self.bounds, self._outputs, config,
                       self.compile_times, self.lowered, executable)

    def name_of(self, rt: RecurrentTensor) -> str:
        for name, o in self._outputs.items():
            if o is rt or (o.node is rt.node and o.index == rt.index):
                return name
        raise OutputError(f"{rt.name} is not an output of this program; pass it in outputs= "
                          "when compiling")

    @functools.cached_property
    def _reordered_or_ragged(self) -> bool:
        """Whether a run's values need more than the executable gives (checked per run)."""
        return bool(self.passes.orders or self.ragged)

    @functools.cached_property
    def _after_run(self) -> tuple[list, list[str]]:
        """What a run's values need beyond the executable's, worked out once (``put_back``)."""
        return put_back_recipe(self.passes.orders, self.ragged, self.sdg.dims,
                               {k: rt.domain for k, rt in self._outputs.items()})

    @user_api
    def run(self, record: bool = False) -> Run:
        """Run the program. ``record``: keep every statement instance as a kernel event in
        ``run.profile.events`` (interpreter and generated code)."""
        if record is not False and not isinstance(record, (bool, np.bool_)):
            raise ArgumentError(f"record={record!r}: give True or False")
        if self.executable is not None:
            run = self.executable.run(None, record)  # at the compiled bounds
            if not self._reordered_or_ragged:
                return run
            return put_back(run, *self._after_run, self.ragged)
        t0 = time.perf_counter()  # the SDG as built: no pass stands between it and NumPy
        values, bounds, sdg = make_backend(self.config.executor).run(self.passes.initial,
                                                                     self.bounds)
        return Run(self, values, time.perf_counter() - t0, None, bounds,
                   {name: (r.over, r.lengths) for name, r in sdg.ragged.items()})
