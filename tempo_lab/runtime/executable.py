"""The ``Executable`` stage and the back-end protocol (the shape of ``jax.stages``:
``lowered.compile(backend) -> Executable``, ``executable.run(bounds) -> Run``).

A back end turns a ``Lowered`` program into something that runs on a ``Host`` (the one place
that owns stores, host values, callbacks and measurements): the loop-AST interpreter, a
generated Python program, or one XLA program. Adding an executor is one module that implements
``Backend`` plus its ``register(...)`` line in ``executors.py`` (the one registry: name,
capabilities, class, options class); ``make_backend`` makes one from its name.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Protocol

from ..errors import TempoLabError
from ..executors import REGISTRY, Choice, lowering, resolve
from ..schedule import Offload
from ..stage import Stage
from .host import Cached, Host
from .lowered import Lowered
from .out_of_memory import as_error, check_fits
from .profile import Profile
from .run import Run


class Prepared(Protocol):
    """A program made ready by a back end (generated source, a traced XLA program, ...)."""

    how: list[str]                       # how it runs, for ``executable.pretty()``
    predicted_peak_bytes: int            # the store bytes its profile should measure
    host_per_run: bool                   # False: a run keeps nothing on its ``Host`` (no
    # stores, callbacks nor progress bar), so one host per thread serves every run that does
    # not record (making a host cost a tenth of a one-op XLA program's run)

    def run(self, host: Host, bounds: Mapping[str, int]
            ) -> tuple[dict[int, object], dict[str, int], Callable[[], Profile]]:
        """Run once: (output store buffers, bounds reached, what makes its profile:
        ``host.profile(...)``)."""

    def store_bytes(self, bounds: Mapping[str, int]) -> dict[int, int]:
        """Each store's bytes at ``bounds`` as this back end holds it (by op)."""

    def sections(self) -> list[tuple[str, list[str]]]: ...

    def to_dict(self) -> dict: ...


class Backend(Protocol):
    name: str

    def prepare(self, lowered: Lowered, sync: bool, split: int) -> Prepared:
        """Compile-time work for ``lowered`` (no bound values beyond ``lowered.bounds``)."""


def make_backend(name: str, options=None) -> Backend:
    """The back end registered as ``name`` (``executors.REGISTRY``), made with ``options`` (an
    instance of its registered options class; None: its defaults)."""
    import importlib

    info = REGISTRY[name]
    mod, cls = info.cls.split(":")
    made = getattr(importlib.import_module(f".{mod}", __package__), cls)
    return made() if options is None else made(options)


def options_class(name: str) -> type | None:
    """The options dataclass the back end registered as ``name`` takes, or None."""
    import importlib

    info = REGISTRY[name]
    if info.options is None:
        return None
    mod, cls = info.options.split(":")
    return getattr(importlib.import_module(f".{mod}", __package__), cls)


def backends() -> dict[str, Backend]:
    """Every back end that runs a lowered program, by name, in the registry's order."""
    return {name: make_backend(name) for name in lowering()}


def _choice_text(lowered: Lowered, chosen: Choice, backend: str, offloads: bool) -> list[str]:
    if not chosen.auto:
        return [f"CompileConfig(executor={backend!r})"]
    reasons = [f"{lowered.stmts[k].op.label} is a tl.{lowered.stmts[k].op.kind} at "
               f"{lowered.stmts[k].op.loc}: it calls Python at every point"
               for k in lowered.sources + lowered.sinks]
    return (["auto chose codegen: under device_memory_budget some stores move to the "
             "host between phases, which the XLA program (every store held for the "
             "whole run) cannot do"] if offloads else
            ["auto chose codegen: a Python callback at every point would serialise "
             "the XLA program"] + reasons if reasons else
            ["auto chose xla: every loop nest runs inside one XLA program (static "
             "store shapes for these bounds, no host callbacks)"])


def compile_lowered(lowered: Lowered, backend, sync: bool = False, split: int = 8
                    ) -> Executable:
    """``backend``: a name ("auto" picks "xla" unless the program calls Python at every
    point, then "codegen"), the ``executors.Choice`` a compilation resolved before its passes,
    or a ``Backend`` object."""
    if not isinstance(backend, (str, Choice)):
        return Executable(lowered, backend, backend.prepare(lowered, sync, split), sync, [])
    chosen = backend
    if isinstance(chosen, str):
        if chosen != "auto" and (chosen not in REGISTRY or not REGISTRY[chosen].caps.lowers):
            raise TempoLabError(f"unknown executor {chosen!r}; choose one of "
                                f"{', '.join(['auto', *lowering()])}")
        chosen = resolve(chosen, bool(lowered.sources or lowered.sinks),
                         lowered.memory.budget is not None)
    name, prepared = chosen.name, None
    offloads = chosen.auto and any(isinstance(n, Offload) for n in lowered.ast.walk())
    if offloads and chosen.fallback is not None:  # a store moves to the host: only the
        name = chosen.fallback                     # fallback can do that
    choice = _choice_text(lowered, chosen, name, offloads)
    made = make_backend(name)
    if chosen.fallback is not None and not offloads:  # auto under a budget: does it fit?
        budget = lowered.memory.budget
        prepared = made.prepare(lowered, sync, split)
        held = prepared.predicted_peak_bytes
        if held <= budget:
            choice.append(f"its stores, held for the whole run ({held} B), fit "
                          f"device_memory_budget ({budget} B)")
        else:
            prepared, whole, name = None, name, chosen.fallback
            made = make_backend(name)
            choice = [f"auto chose {name}: {whole} holds every store for the whole run, "
                      f"{held} B, above device_memory_budget ({budget} B); {name} frees "
                      f"stores as the memory plan says (predicted peak "
                      f"{lowered.memory.peak_bytes} B)"]
    if prepared is None:
        prepared = made.prepare(lowered, sync, split)
    return Executable(lowered, made, prepared, sync, choice)


class Executable(Stage):
    """A program ready to run on one back end (``prog.executable``). ``program``: the
    ``Program`` its runs belong to (``run.program``; None for one compiled from a ``Lowered``
    by hand), given when it is made: ``for_program``."""

    def __init__(self, lowered: Lowered, backend: Backend, prepared: Prepared, sync: bool,
                 choice: list[str], program=None, cached: Cached | None = None):
        self.lowered, self.backend, self.prepared = lowered, backend, prepared
        self.sync, self.choice = sync, list(choice)
        self.program = program
        self._cached = Cached(lowered) if cached is None else cached
        self._hosts = threading.local()  # the host of each thread's runs (``host_per_run``)
        # the bounds (the object a Program passes every run) of runs that need no memory check:
        # too small to run out, or run once already (what that run needed the process holds
        # now: pages its allocator freed and keeps do not show as available)
        self._unchecked: Mapping[str, int] | None = None

    def for_program(self, program) -> Executable:
        """This executable (the same prepared program and kernels) with its runs belonging to
        ``program``: a new object, this one unchanged."""
        return Executable(self.lowered, self.backend, self.prepared, self.sync, self.choice,
                          program, self._cached)

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def predicted_peak_bytes(self) -> int:
        """The peak of store bytes this executor's profile should measure."""
        return self.prepared.predicted_peak_bytes

    def __getattr__(self, name):  # what one back end adds (``source``, ``jaxpr()``, ...)
        if name.startswith("_") or name in ("prepared", "lowered", "backend"):
            raise AttributeError(name)
        return getattr(self.prepared, name)

    def run(self, bounds: Mapping[str, int] | None = None, record: bool = False):
        """Run with ``bounds`` (the compiled ones by default); ``record`` keeps every
        statement instance as a kernel event in ``run.profile.events``. Returns the ``Run``."""
        bounds = self.lowered.bounds if bounds is None else bounds  # read, never changed
        if bounds is not self._unchecked and check_fits(self, bounds):
            self._unchecked = bounds
        reuse = not (record or self.prepared.host_per_run)
        host = getattr(self._hosts, "host", None) if reuse else None
        if host is None:
            host = Host(self.lowered, self.sync, record, self._cached, self.backend.name, bounds)
            if reuse:
                self._hosts.host = host
        error = None
        try:
            bufs, reached, profile = self.prepared.run(host, bounds)
            host.raise_error()
            env = {**bounds, **reached} if reached else bounds
            values = self.lowered.outputs(bufs, env)
            self._unchecked = bounds
        except (MemoryError, RuntimeError) as e:
            error = as_error(e, self, bounds)
            if error is None:
                raise
            # without its traceback: the frames it holds hold the run's stores
            error.__cause__ = e.with_traceback(None)
        finally:
            host.stop()
        if error is not None:  # raised here, where nothing holds what the run allocated
            raise error
        return Run(self.program, values, host.wall_s, profile, env)

    # -- stage vocabulary ---------------------------------------------------------------------
    def __repr__(self) -> str:
        return (f"Executable(executor={self.name}, statements={len(self.lowered.stmts)}, "
                f"stores={len(self.lowered.stores)})")

    def _sections(self):
        return [("executor choice", self.choice), ("how it runs", self.prepared.how),
                *self.lowered.devices_section(), *self.prepared.sections()]

    def to_dict(self) -> dict:
        return {"schema": "tempo_lab.executable/1", "executor": self.name,
                "choice": list(self.choice), "statements": len(self.lowered.stmts),
                "stores": len(self.lowered.stores), **self.prepared.to_dict()}
