"""The executors: the one registry of back ends (each one's name, what it can do, the class that
implements it and its options class), and what ``executor="auto"`` picks. The passes and the
pipeline decide by these capabilities, never by an executor's name.

A back end is one ``register(...)`` line below, in the order ``auto`` prefers them; its class is
named by where it lives under ``tempo_lab.runtime`` (``"module:Class"``) and imported on first
use (``runtime.executable.backend``), so that this module, at the bottom of the layers, names
what the runtime implements without importing it."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Caps:
    lowers: bool             # runs the lowered loop AST (schedule, memory plan, ``Executable``);
                             # False: runs the SDG as built, after the passes are recorded
    pads_per_span: bool      # pads a growing read to the end of its span: static kernels
    calls_python: bool       # calls Python at a point without serialising a compiled program
    memory_budget: bool      # moves stores to the host between phases (device_memory_budget);
                             # without it, one program holds every store for the whole run
    store_timeline: bool     # its profile has the store bytes after every statement


@dataclass(frozen=True)
class BackendInfo:
    """One registered executor: ``cls`` and ``options`` are ``"module:Class"`` under
    ``tempo_lab.runtime`` (``options``: the frozen dataclass its constructor takes, or None)."""

    name: str
    caps: Caps
    cls: str
    options: str | None = None


REGISTRY: dict[str, BackendInfo] = {}  # name -> BackendInfo, in the order auto prefers them


def register(name: str, caps: Caps, cls: str, options: str | None = None) -> BackendInfo:
    """Add a back end to the registry (its place is the order ``auto`` tries it in)."""
    if name in REGISTRY or name == "auto":
        raise ValueError(f"executor {name!r} is registered already")
    REGISTRY[name] = info = BackendInfo(name, caps, cls, options)
    return info


register("xla", Caps(lowers=True, pads_per_span=True, calls_python=False, memory_budget=False,
                     store_timeline=False),
         "xla:XlaBackend", options="xla_options:XlaOptions")
register("codegen", Caps(lowers=True, pads_per_span=False, calls_python=True, memory_budget=True,
                         store_timeline=True),
         "codegen:CodegenBackend")
register("interpreter", Caps(lowers=True, pads_per_span=False, calls_python=True,
                             memory_budget=True, store_timeline=True),
         "interpreter:InterpreterBackend")
register("reference", Caps(lowers=False, pads_per_span=False, calls_python=True,
                           memory_budget=False, store_timeline=False),
         "reference:ReferenceBackend")

# what each executor can do, by name (a view of REGISTRY)
CAPS: dict[str, Caps] = {name: info.caps for name, info in REGISTRY.items()}


def lowering() -> tuple[str, ...]:
    """The executors that run a lowered program (every one but the reference interpreter)."""
    return tuple(name for name, info in REGISTRY.items() if info.caps.lowers)


def lowers(executor: str) -> bool:
    """Whether ``executor`` (a registered name or "auto") compiles past the passes."""
    return executor == "auto" or REGISTRY[executor].caps.lowers


def auto_backend(calls_python: bool, offloads: bool) -> str:
    """What ``executor="auto"`` runs: the executor whose one program holds every loop nest
    ("xla") unless the program calls Python at every point (a ``tl.source`` or ``tl.sink``)
    or moves stores to the host, which such a program cannot do; then "codegen"."""
    fits = [name for name, c in CAPS.items() if c.lowers
            and (c.calls_python or not calls_python) and (c.memory_budget or not offloads)]
    return fits[0]


@dataclass(frozen=True)
class Choice:
    """An executor resolved once per compilation, before the passes (``resolve``), and read by
    whoever needs it: the passes (``planned``) and ``runtime.executable.compile_lowered``.

    ``name``: the executor compiled first. ``fallback``: under a device memory budget, the
    executor "auto" runs instead when the memory plan moves a store to the host or ``name``'s
    stores, held for the whole run, exceed the budget (None: ``name`` is final)."""

    name: str
    auto: bool = False
    fallback: str | None = None

    @property
    def planned(self) -> str:
        """The executor the passes plan for: under a budget "auto" may still fall back, and
        the fallback is the safe side (tiled reads)."""
        return self.fallback or self.name


def resolve(executor: str, calls_python: bool, budget: bool) -> Choice:
    """``executor`` ("auto" or a registered name) as a ``Choice``: ``calls_python``, whether
    the program has a ``tl.source`` or ``tl.sink``; ``budget``, whether it compiles under a
    device memory budget."""
    if executor != "auto":
        return Choice(executor)
    name = auto_backend(calls_python, False)
    fallback = auto_backend(calls_python, True) if budget else None
    return Choice(name, True, fallback if fallback != name else None)


def timeline_backend() -> str:
    """The executor a measured memory curve runs on: the first whose profile records the
    store bytes after every statement."""
    return next(name for name, c in CAPS.items() if c.store_timeline)
