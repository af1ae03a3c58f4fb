"""``Program`` (a compiled context) and ``Run`` (its results): the objects tying the stages."""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .errors import BoundsError, TempoLabError, user_location
from .frontend.build import build_sdg
from .frontend.tensor import RecurrentTensor
from .frontend.validate import validate
from .ir.sdg import SDG
from .runtime.reference import run_reference
from .stage import Stage
from .symbolic import Bound, Dim

EXECUTORS = ("reference",)


@dataclass(frozen=True)
class CompileConfig:
    """Compiler switches. ``executor``: which back end ``Program.run`` uses."""

    executor: str = "reference"
    validate: bool = True

    def __post_init__(self):
        if self.executor not in EXECUTORS:
            raise TempoLabError(f"unknown executor {self.executor!r}; choose one of {EXECUTORS}")


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


def _normalise_bounds(ctx, bounds) -> dict[str, int]:
    out = {}
    for k, v in dict(bounds or {}).items():
        name = _bound_name(k, ctx)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise BoundsError(f"the bound {name} must be a positive int, got {v!r}")
        out[name] = int(v)
    return out


def _normalise_outputs(outputs) -> dict[str, RecurrentTensor]:
    if isinstance(outputs, RecurrentTensor):
        outputs = [outputs]
    if isinstance(outputs, Mapping):
        items = list(outputs.items())
    else:
        items = [(rt.node.name if isinstance(rt, RecurrentTensor) and rt.node.name
                  and rt.index is None else f"out{k}", rt) for k, rt in enumerate(outputs)]
    if not items:
        raise TempoLabError("compile needs at least one output: outputs={'y': y} or [y]")
    for name, rt in items:
        if not isinstance(rt, RecurrentTensor):
            raise TempoLabError(f"output {name!r} is {type(rt).__name__}, not a recurrent tensor")
    return dict(items)


def _used_bounds(sdg: SDG) -> set[str]:
    used = set()
    for op in sdg.ops.values():
        used |= {d.bound.name for d in op.domain}
        used |= {s.name for x in op.type.shape if not isinstance(x, int) for s in x.bounds()}
        if op.kind == "dimval":
            used |= {s.name for s in op.attrs["expr"].bounds()}
    for e in sdg.edges:
        used |= {s.name for x in e.index for s in x.symbols() if isinstance(s, Bound)}
        used |= {s.name for s in e.cond.symbols() if isinstance(s, Bound)}
    return used


def compile_context(ctx, bounds, outputs, config: CompileConfig | None = None) -> Program:
    config = config or CompileConfig()
    loc = user_location()
    times = {}
    t0 = time.perf_counter()
    bounds = _normalise_bounds(ctx, bounds)
    outs = _normalise_outputs(outputs)
    for rt in outs.values():
        if rt.ctx is not ctx:
            raise TempoLabError("an output belongs to another tl.Context", loc)
    sdg = build_sdg(ctx, outs)
    missing = sorted(_used_bounds(sdg) - set(bounds))
    if missing:
        raise BoundsError(f"no value for the bound(s) {', '.join(missing)}; pass them in "
                          f"bounds={{{', '.join(f'{m}: ...' for m in missing)}}}", loc)
    times["build"] = time.perf_counter() - t0
    if config.validate:
        t0 = time.perf_counter()
        validate(sdg, bounds)
        times["validate"] = time.perf_counter() - t0
    return Program(ctx.trace, sdg, bounds, outs, config, times)


class Program(Stage):
    """A compiled program: its stages (``trace``, ``sdg``) and ``run()``."""

    def __init__(self, trace, sdg: SDG, bounds: dict[str, int], outputs, config, times):
        self.trace, self.sdg, self.bounds, self.config = trace, sdg, dict(bounds), config
        self._outputs = dict(outputs)
        self.compile_times: dict[str, float] = dict(times)

    def __repr__(self) -> str:
        b = ", ".join(f"{k}={v}" for k, v in self.bounds.items())
        return (f"Program(outputs=({', '.join(self._outputs)}), bounds=({b}), "
                f"executor={self.config.executor})")

    def _sections(self):
        outs = []
        for name, i in self.sdg.outputs.items():
            op = self.sdg.ops[i]
            outs.append(f"{name}: {op.type} over ({', '.join(map(str, op.domain))})")
        return [("bounds", [f"{k} = {v}" for k, v in self.bounds.items()]),
                ("outputs", outs),
                ("stages", [repr(self.trace), repr(self.sdg)])]

    def to_dict(self) -> dict:
        return {"schema": "tempo_lab.program/1", "bounds": self.bounds,
                "executor": self.config.executor, "outputs": list(self._outputs),
                "trace": self.trace.to_dict(), "sdg": self.sdg.to_dict()}

    def name_of(self, rt: RecurrentTensor) -> str:
        for name, o in self._outputs.items():
            if o is rt or (o.node is rt.node and o.index == rt.index):
                return name
        raise KeyError(f"{rt!r} is not an output of this program; pass it in outputs= "
                       "when compiling")

    def run(self) -> Run:
        t0 = time.perf_counter()
        values = run_reference(self.sdg, self.bounds)
        return Run(self, values, time.perf_counter() - t0)


class Run(Stage):
    """Outputs of one execution: ``run["y"]`` or ``run[y]`` is a NumPy array over the output's
    whole domain (domain axes in universe order, then the spatial axes)."""

    def __init__(self, program: Program, values: dict[str, np.ndarray], seconds: float):
        self.program, self._values, self.seconds = program, values, seconds

    def __getitem__(self, key) -> np.ndarray:
        name = self.program.name_of(key) if isinstance(key, RecurrentTensor) else key
        return self._values[name]

    def keys(self):
        return self._values.keys()

    def items(self):
        return self._values.items()

    def __repr__(self) -> str:
        outs = ", ".join(f"{k}: {v.dtype.name}{list(v.shape)}" for k, v in self._values.items())
        return f"Run(outputs=({outs}), executor={self.program.config.executor})"

    def _sections(self):
        return [("outputs", [f"{k}: {v.dtype.name}{list(v.shape)} min={v.min():.4g} "
                             f"max={v.max():.4g} mean={v.mean():.4g}" if v.size else
                             f"{k}: {v.dtype.name}{list(v.shape)} (empty)"
                             for k, v in self._values.items()])]

    def to_dict(self) -> dict:
        return {"schema": "tempo_lab.run/1", "executor": self.program.config.executor,
                "outputs": {k: {"shape": list(v.shape), "dtype": v.dtype.name}
                            for k, v in self._values.items()}}
