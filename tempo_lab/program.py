"""``Program``: a compiled context, tying its stages together (``Run``, its results, is in
``runtime/run.py``)."""
from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from . import progress
from .errors import (
    ArgumentError,
    BoundsError,
    Location,
    OutputError,
    ScheduleError,
    TempoLabError,
    user_api,
    user_location,
)
from .executors import CAPS, auto_backend
from .frontend.build import build_sdg
from .frontend.tensor import RecurrentTensor
from .frontend.validate import validate
from .ir.sdg import SDG, Ragged
from .memory import offload, plan_memory
from .passes import run_passes
from .passes.ragged import lengths_output
from .runtime.executable import BACKENDS
from .runtime.lowered import Lowered
from .runtime.reference import reference_bounds, run_reference
from .runtime.run import ByBound, Run
from .runtime.sharding import Layout, check_config
from .schedule import FALLBACK_OPTION_SETS, OPTION_SETS, IncompleteSchedule, schedule_sdg
from .stage import Stage
from .symbolic import Bound, Dim

EXECUTORS = ("auto", *BACKENDS, "reference")


@dataclass(frozen=True)
class CompileConfig:
    """Compiler switches.

    executor: "auto" (the default) picks "xla" when every loop nest can run inside one XLA
        program, else "codegen" (``prog.executable`` says which and why); "xla" runs the loop
        AST as one jitted program of ``lax`` loops over statically sized stores; "codegen" runs
        a Python function generated from the loop AST, one jitted kernel per statement
        instance; "interpreter" walks the loop AST with the same kernels; "reference" is the
        point-by-point NumPy interpreter.
    block_size: points per block of a growing (block) store.
    xla_split: on the XLA executor, a loop whose range reads grow with its variable (``0:t+1``)
        is split into this many equal spans, each padding those reads to its own largest
        length rather than the run's (so their cost grows with ``t``, in steps); the work so
        padded is traced once per span under a ``lax.switch``. 1 keeps every loop whole.
        More spans: less padding, longer XLA compilation.
    sync_profile: wait for every kernel to finish so ``run.profile`` times are device times.
    tile / tile_block: the tiling pass (``passes/tile.py``) and its points per block (None:
        about 32 blocks at the longest range, 32 to 256 points; on the XLA executor, which
        pads a growing range per span of its loop instead, None leaves ranges untiled).
    device_memory_budget: bytes the stores may hold on the device at once; above it stores
        are freed every iteration where they can be, and stores idle for a while move to host
        memory and back (``memory/offload.py``); a dim whose vectorised values would take more
        than half of it runs in blocks (incrementalisation, ``value_budget``). The XLA
        executor holds every store for the whole run, so a budget runs on "codegen" (or
        "interpreter").
    mesh / shard: several devices (``runtime/sharding.py``): ``shard={"b": "data"}`` splits the
        points of the vectorised dim ``b`` over the devices of the ``jax.sharding.Mesh`` axis
        ``"data"``; XLA partitions the kernels and makes reductions over ``b`` collectives.
    """

    executor: str = "auto"
    validate: bool = True
    block_size: int = 64
    xla_split: int = 8
    sync_profile: bool = False
    # passes, run in this order when their switch is on (see tempo_lab/passes)
    passes: tuple[str, ...] = ("simplify", "fold", "cse", "remat", "stream", "contract", "dce",
                               "tile",
                               "vectorise", "incrementalise", "fuse")
    simplify: bool = True
    fold_constants: bool = True
    cse: bool = True
    dce: bool = True
    remat: bool = True
    stream: bool = False  # the memory objective: sums over a loop dim become running sums in
    # the loop when their summands are ready a bounded number of steps after their point
    # (passes/stream.py); off by default, as one vjp per step is slower than one per range
    contract: bool = True
    tile: bool = True
    vectorise: bool = True
    vectorise_groups: bool = False  # of the innermost recurrent dim, batch the ops off the
    # recurrence (opt-in for now: see passes/vectorise.py)
    incrementalise: bool = True
    fuse: bool = True
    tile_block: int | None = None
    ragged_buckets: int = 4  # a tl.lengths bound's instances, sorted by length, run in this
    # many groups, each up to its own longest (where no op reads across instances; 1: one box)
    vectorise_budget_bytes: int = 256 * 2**20  # largest value a vectorised op may make (else
    # incrementalisation vectorises the dim in blocks that fit)
    check_invariants: bool = False  # check the SDG after every pass (tests turn this on)
    device_memory_budget: int | None = None
    mesh: Any = None
    shard: Any = None

    @property
    def value_budget(self) -> int:
        """The most bytes one vectorised value may take: ``vectorise_budget_bytes``, and under a
        device memory budget at most half of that (a value must fit beside the stores it is
        made from); above it, incrementalisation runs the dim in blocks that fit."""
        if self.device_memory_budget is None:
            return self.vectorise_budget_bytes
        return min(self.vectorise_budget_bytes, self.device_memory_budget // 2)

    def __hash__(self):  # a mesh and a shard dict are not hashable fields
        return hash((self.executor, self.passes, tuple(sorted((self.shard or {}).items()))))

    def __post_init__(self):
        if self.executor not in EXECUTORS:
            raise ArgumentError(f"unknown executor {self.executor!r}; choose one of {EXECUTORS}")
        if not _positive_int(self.ragged_buckets):
            raise ArgumentError(f"ragged_buckets={self.ragged_buckets!r}: give a positive number "
                                "of groups (1: one box up to the longest instance)")
        if self.tile_block is not None and not _positive_int(self.tile_block):
            raise ArgumentError(f"tile_block={self.tile_block!r}: give a positive number of "
                                "points per block, or None for the automatic size (tile=False "
                                "turns tiling off)")
        for name in ("block_size", "xla_split", "vectorise_budget_bytes"):
            if not _positive_int(getattr(self, name)):
                raise ArgumentError(f"{name}={getattr(self, name)!r}: give a positive int")
        budget = self.device_memory_budget
        if budget is not None and not _positive_int(budget):
            raise ArgumentError(f"device_memory_budget={budget!r}: give a positive number of "
                                "bytes, or None for no budget")
        caps = CAPS.get(self.executor)
        if budget is not None and caps is not None and not caps.memory_budget:
            takes = [n for n, c in CAPS.items() if c.memory_budget]
            raise ArgumentError(f"device_memory_budget with executor={self.executor!r}: that "
                                "executor holds every store for the whole run, so it cannot "
                                "move one to the host; use executor="
                                f"{' or '.join(map(repr, takes))} (or 'auto', which picks "
                                f"{auto_backend(False, True)} under a budget)")
        for f in fields(self):
            if f.type == "bool" and not isinstance(getattr(self, f.name), (bool, np.bool_)):
                raise ArgumentError(f"{f.name}={getattr(self, f.name)!r}: give True or False")
        from .passes import REGISTRY

        optional = [n for n, p in REGISTRY.items() if p.switch is not None]
        passes = self.passes
        if isinstance(passes, str) or not isinstance(passes, (tuple, list)):
            raise ArgumentError(f"passes={passes!r}: give a tuple of pass names, from "
                                f"{', '.join(optional)}")
        unknown = [p for p in passes if p not in optional]
        if unknown or len(set(passes)) != len(passes):
            what = f"unknown pass {unknown[0]!r}" if unknown else "a pass named twice"
            raise ArgumentError(f"passes={tuple(passes)!r}: {what}; passes run in the order "
                                f"given, each at most once, from {', '.join(optional)}")
        object.__setattr__(self, "passes", tuple(passes))
        object.__setattr__(self, "shard", check_config(self.mesh, self.shard) or None)


def _checked_init(init):
    """``CompileConfig.__init__`` that names an unknown field at the user's line with the
    closest field names (a dataclass's own is Python's bare ``TypeError``)."""
    import difflib

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        names = [f.name for f in fields(CompileConfig)]
        for key in kwargs:
            if key not in names:
                near = difflib.get_close_matches(key, names, n=3, cutoff=0.5)
                hint = f"did you mean {' or '.join(map(repr, near))}? " if near else ""
                raise ArgumentError(f"CompileConfig has no field {key!r}; {hint}its fields are "
                                    f"{', '.join(names)}")
        if len(args) > len(names):
            raise ArgumentError(f"CompileConfig takes at most {len(names)} fields, got "
                                f"{len(args)} positional arguments; name them")
        init(self, *args, **kwargs)
    return __init__


CompileConfig.__init__ = _checked_init(CompileConfig.__init__)


def _positive_int(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, np.integer)) and v >= 1


def _bound_name(key, ctx) -> str:
    if isinstance(key, Dim):
        key = key.bound
    if isinstance(key, Bound):
        key = key.name
    names = [b.name for b in ctx.bounds]
    if not isinstance(key, str) or key not in names:
        raise BoundsError(f"{key!r} is not a bound of this context; bounds are "
                          f"{', '.join(names)} (use ctx.bounds or dims)")
    return key


@dataclass(frozen=True)
class Until:
    """A data-dependent bound: the dim ends after the first point where ``done`` holds."""

    done: RecurrentTensor
    max: int
    loc: Location


def until(done: RecurrentTensor, max: int) -> Until:  # noqa: A002 - the documented keyword
    """``bounds={T: tl.until(done, max=N)}``: run ``t`` until ``done[t]`` first holds (at most
    ``N`` steps); outputs have the length actually reached."""
    if not isinstance(done, RecurrentTensor):
        raise BoundsError("tl.until needs a boolean recurrent tensor: tl.until(done, max=N)")
    if not _positive_int(max) or max > MAX_BOUND:
        raise BoundsError(f"tl.until: max must be a positive int up to {MAX_BOUND}, got "
                          f"{max!r}")
    return Until(done, int(max), user_location())


MAX_BOUND = 2**31 - 1  # kernels index with int32


@dataclass(frozen=True, eq=False)
class Lengths:
    """A ragged bound: one length per point of an outer dim, given (``lengths``) or where
    ``done`` over ``(over, t)`` first holds (``until``)."""

    array: np.ndarray | None
    over: Dim
    loc: Location
    done: RecurrentTensor | None = None
    max: int = 0


def lengths(array, over: Dim) -> Lengths:
    """``bounds={T: tl.lengths(array, over=b)}``: at each point ``b``, dim ``t`` has
    ``array[b]`` points, so ``x`` over ``(b, t)`` lives on ``{(b, t) : t < T_b}``; ``T - 1`` is
    each instance's own last point and ``x[b, 0:T]`` its own whole range. Outputs come back
    padded with zeros; ``run.mask(name)`` says which entries are real."""
    loc = user_location()
    if not isinstance(over, Dim):
        raise BoundsError(f"tl.lengths(array, over=...): over must be a dim (e.g. b), got "
                          f"{over!r}", loc)
    if isinstance(array, RecurrentTensor):
        raise BoundsError(f"tl.lengths: {array.name} is a recurrent tensor; give the lengths as "
                          "a NumPy array known before the run, or end each instance by data "
                          f"with tl.until(done, max=N) where done is over ({over}, t)", loc)
    a = np.asarray(array)
    if a.ndim != 1 or a.size == 0 or a.dtype.kind not in "iu":
        raise BoundsError(f"tl.lengths: give a non-empty 1-D integer array with one length per "
                          f"point of {over}, got {a.dtype.name} of shape {a.shape}", loc)
    if a.min() < 1 or a.max() > MAX_BOUND:
        raise BoundsError(f"tl.lengths: every length must be between 1 and {MAX_BOUND}, got "
                          f"{a.min()}..{a.max()}; drop the empty instances", loc)
    return Lengths(a.astype(np.int64), over, loc)


def _normalise_bounds(ctx, bounds) -> tuple[dict[str, int], dict[str, RecurrentTensor],
                                            dict[str, Ragged]]:
    if bounds is None:
        bounds = {}
    if not isinstance(bounds, Mapping):
        raise BoundsError(f"bounds={bounds!r}: give a dict from bounds to values, e.g. "
                          f"bounds={{{', '.join(f'{b.name}: 8' for b in ctx.bounds)}}}")
    out, dynamic, ragged = {}, {}, {}
    for k, v in bounds.items():
        name = _bound_name(k, ctx)
        if name in out:
            raise BoundsError(f"the bound {name} is given twice in bounds=; give it once")
        if isinstance(v, Lengths) and v.array is not None:
            ragged[name] = v
            v = int(v.array.max())
        if isinstance(v, Until):
            d = next(d for d in ctx.dims if d.bound.name == name)
            per_instance = len(v.done.domain) == 2 and d in v.done.domain
            if (v.done.domain != (d,) and not per_instance) or v.done.dtype != np.bool_ \
                    or v.done.shape != ():
                raise BoundsError(f"tl.until for {name}: done ({v.done.name}, made at "
                                  f"{v.done.loc}) must be a bool scalar over ({d},), or over "
                                  f"(b, {d}) to end {d} per instance of b; got {v.done.type} "
                                  f"over ({', '.join(map(str, v.done.domain))}); write it at "
                                  f"the point {d}, e.g. done = x[{d}] > 0.5", v.loc)
            if per_instance:
                over = next(x for x in v.done.domain if x != d)
                ragged[name] = Lengths(None, over, v.loc, v.done, v.max)
            else:
                dynamic[name] = v.done
            v = v.max
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise BoundsError(f"the bound {name} must be a positive int or tl.until(done, max=N),"
                              f" got {v!r}")
        if v > MAX_BOUND:
            raise BoundsError(f"the bound {name} = {v} exceeds {MAX_BOUND}, the largest index "
                              "the kernels can address (int32); split the dim in two")
        out[name] = int(v)
    return out, dynamic, _check_ragged(ctx, out, ragged, dynamic)


def _check_ragged(ctx, bounds: dict[str, int], given: dict[str, Lengths],
                  dynamic) -> dict[str, Ragged]:
    """Each ragged bound's outer dim is another, plainly bounded dim, with one length per
    point."""
    out = {}
    for name, v in given.items():
        b = v.over
        if b not in ctx.dims or b.bound.name == name:
            raise BoundsError(f"tl.lengths for {name}: over={b} must be another dim of this "
                              f"context ({', '.join(map(str, ctx.dims))})", v.loc)
        if b.bound.name in given or b.bound.name in dynamic:
            raise BoundsError(f"tl.lengths for {name}: {b}'s bound is ragged or data-"
                              "dependent itself; give over= a dim with an int bound", v.loc)
        want = bounds.get(b.bound.name)
        if v.array is None:  # tl.until per instance: the done tensor, an op once built
            out[name] = Ragged(b.name, None, v.done, v.max)
            continue
        if want is not None and want != len(v.array):
            raise BoundsError(f"tl.lengths for {name}: {len(v.array)} lengths, but {b.bound} = "
                              f"{want}; give one length per point of {b}", v.loc)
        out[name] = Ragged(b.name, v.array)
    return out


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
    config = config or CompileConfig()
    if not isinstance(config, CompileConfig):
        raise ArgumentError(f"config={config!r}: give a tl.CompileConfig(...)")
    loc = user_location()
    st = _Stages()
    try:
        with st.stage("build"):
            bounds, dynamic, ragged = _normalise_bounds(ctx, bounds)
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
        with st.stage("passes"):
            ends = {**dynamic, **{n: r for n, r in ragged.items() if r.lengths is None}}
            sdg, passes = run_passes(sdg, config, config.check_invariants, bounds, ends)
            bounds = {**bounds, **passes.new_bounds}  # the dims a pass added (tiling's blocks)
        schedule = plan = lowered = executable = None
        if config.executor != "reference":
            with st.stage("schedule"):
                schedule, plan = _best_schedule(sdg, bounds, config, st.times)
            st.times["schedule"] -= st.times["memory"]  # its own stage, timed inside
            if config.device_memory_budget is not None:
                with st.stage("offload"):
                    ast, chosen = offload.place(schedule.ast, schedule, plan.storages, bounds,
                                                config.device_memory_budget, plan.peak_bytes)
                    if chosen:
                        schedule = schedule.with_ast(ast)
                        plan = plan_memory(sdg, schedule, bounds, config.block_size)
                    plan.budget = config.device_memory_budget
            with st.stage("lower"):
                layout = (Layout(sdg, config.mesh, config.shard, bounds, loc) if config.shard
                          else None)
                lowered = Lowered(sdg, schedule, plan, bounds, layout)
            with st.stage("compile"):
                executable = lowered.compile(config.executor, config.sync_profile,
                                             config.xla_split)
                if layout is not None:
                    layout.agree(f"{executable.name} {sorted(bounds.items())}\n{lowered.ast}",
                                 loc)
    finally:
        st.bar.close()
    return Program(ctx.trace, sdg, bounds, outs, config, st.times, schedule, plan, lowered,
                   executable, passes)


ISL_RETRY_OPS = 150  # a program this small also tries isl's scheduler when fusion grows a ring


def _best_schedule(sdg: SDG, bounds, config, times):
    """The fusion scheduler's schedule, unless it declines (then isl's, under each option set
    in turn) or its memory plan makes a window reader's ring grow in a program small enough
    for isl to be quick (then the plan with the lowest predicted peak, the first on ties)."""
    best = None
    times["memory"] = 0.0
    for options in OPTION_SETS + FALLBACK_OPTION_SETS:
        if best is not None and (options in FALLBACK_OPTION_SETS or not best[1].grown
                                 or len(sdg.ops) > ISL_RETRY_OPS):
            break
        try:
            schedule = schedule_sdg(sdg, options)
        except IncompleteSchedule:
            continue
        t1 = time.perf_counter()
        plan = plan_memory(sdg, schedule, bounds, config.block_size)
        times["memory"] += time.perf_counter() - t1
        if best is None or plan.peak_bytes < best[1].peak_bytes:
            best = (schedule, plan)
    if best is None:
        raise ScheduleError("no scheduler found a complete schedule for this program (the "
                            "fusion scheduler and isl's under every option set tried); please "
                            "report it with the program", sdg.ops[sdg.roots[0]].loc)
    return best


class Program(Stage):
    """A compiled program: its stages (``trace``, ``sdg``, ``schedule``, ``memory``,
    ``executable``) and ``run()``."""

    def __init__(self, trace, sdg: SDG, bounds: dict[str, int], outputs, config, times,
                 schedule=None, memory=None, lowered=None, executable=None, passes=None):
        self.trace, self.sdg, self.bounds, self.config = trace, sdg, dict(bounds), config
        self.passes = passes  # PassTrace: the SDG as built is passes.initial; sdg is the result
        self.schedule, self.memory, self.lowered = schedule, memory, lowered
        self.executable = executable
        if executable is not None:
            executable.program = self
        self._outputs = dict(outputs)
        self.compile_times: dict[str, float] = dict(times)

    @property
    def ragged(self):
        """The ragged bounds as written (``ir.sdg.Ragged``), before the pass made boxes."""
        return (self.passes.initial if self.passes is not None else self.sdg).ragged

    def __repr__(self) -> str:
        b = ", ".join(f"{k}={v}" for k, v in self.bounds.items())
        return (f"Program(outputs=({', '.join(self._outputs)}), bounds=({b}), "
                f"executor={self.executor})")

    @property
    def executor(self) -> str:
        """The executor that runs this program (auto's choice, see ``executable.pretty()``)."""
        return self.executable.name if self.executable is not None else "reference"

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
        if executor != "reference":
            if self.lowered is None:
                raise TempoLabError("this program was compiled for the reference interpreter "
                                    "and has no schedule; compile it with another executor")
            executable = self.lowered.compile(executor, config.sync_profile, config.xla_split)
        return Program(self.trace, self.sdg, self.bounds, self._outputs, config,
                       self.compile_times, self.schedule, self.memory, self.lowered, executable,
                       self.passes)

    def name_of(self, rt: RecurrentTensor) -> str:
        for name, o in self._outputs.items():
            if o is rt or (o.node is rt.node and o.index == rt.index):
                return name
        raise OutputError(f"{rt.name} is not an output of this program; pass it in outputs= "
                          "when compiling")

    @user_api
    def run(self, record: bool = False) -> Run:
        """Run the program. ``record``: keep every statement instance as a kernel event in
        ``run.profile.events`` (interpreter and generated code)."""
        if not isinstance(record, (bool, np.bool_)):
            raise ArgumentError(f"record={record!r}: give True or False")
        if self.executable is not None:
            run = self.executable.run(self.bounds, record)
            for dim, order in self.passes.orders.items():  # instances back in their order
                back = np.argsort(order)
                for k, v in run._values.items():
                    dims = [d.name for d in self._outputs[k].domain] if k in self._outputs \
                        else []
                    if dim in dims:
                        run._values[k] = np.take(v, back, axis=dims.index(dim))
            if self.ragged:  # the box's points past each instance's end hold no values
                for name, r in self.ragged.items():
                    found = run._values.pop(lengths_output(name), None)
                    run.lengths[name] = (r.over, r.lengths if found is None else
                                         found.astype(np.int64))
                for k, v in run._values.items():
                    m = run.mask(k)
                    run._values[k] = np.where(m.reshape(m.shape + (1,) * (v.ndim - m.ndim)),
                                              v, np.zeros((), v.dtype))
            return run
        t0 = time.perf_counter()  # the SDG as built: no pass stands between it and NumPy
        sdg = self.passes.initial if self.passes is not None else self.sdg
        bounds, sdg = reference_bounds(sdg, self.bounds)
        run = Run(self, run_reference(sdg, bounds), time.perf_counter() - t0, None, bounds)
        run.lengths = ByBound({name: (r.over, r.lengths) for name, r in sdg.ragged.items()})
        return run
