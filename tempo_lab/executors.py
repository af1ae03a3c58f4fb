"""What each executor can do, and what ``executor="auto"`` picks: the facts the passes and the
pipeline decide by, so that none of them decides by an executor's name. (The executors
themselves are ``runtime/``'s back ends, listed in ``runtime.executable.BACKENDS``.)"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Caps:
    pads_per_span: bool      # pads a growing read to the end of its span: static kernels
    calls_python: bool       # calls Python at a point without serialising a compiled program
    memory_budget: bool      # moves stores to the host between phases (device_memory_budget);
                             # without it, one program holds every store for the whole run
    store_timeline: bool     # its profile has the store bytes after every statement


CAPS = {
    "xla": Caps(pads_per_span=True, calls_python=False, memory_budget=False,
                store_timeline=False),
    "codegen": Caps(pads_per_span=False, calls_python=True, memory_budget=True,
                    store_timeline=True),
    "interpreter": Caps(pads_per_span=False, calls_python=True, memory_budget=True,
                        store_timeline=True),
}


def auto_backend(calls_python: bool, offloads: bool) -> str:
    """What ``executor="auto"`` runs: the executor whose one program holds every loop nest
    ("xla") unless the program calls Python at every point (a ``tl.source`` or ``tl.sink``)
    or moves stores to the host, which such a program cannot do; then "codegen"."""
    fits = [name for name, c in CAPS.items()
            if (c.calls_python or not calls_python) and (c.memory_budget or not offloads)]
    return fits[0]


def timeline_backend() -> str:
    """The executor a measured memory curve runs on: the first whose profile records the
    store bytes after every statement."""
    return next(name for name, c in CAPS.items() if c.store_timeline)
