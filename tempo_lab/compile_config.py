"""``CompileConfig``: the compiler's switches, checked when made (an unknown field, executor or
pass is a located error that names the closest choices).

Process-wide settings (``tl.config``: progress bars) live in ``config.py``, at the bottom of the
layers, since every layer reads them; this one checks its fields against the executors and the
passes, so it sits with the pipeline that reads it (``program.py``)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from .errors import ArgumentError
from .executors import CAPS, REGISTRY, auto_backend
from .frontend.bounds import positive_int
from .runtime.sharding import check_config

EXECUTORS = ("auto", *REGISTRY)  # every name executor= takes (executors.REGISTRY's, and "auto")


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
    # passes, run in this order when their switch is on (enabled_passes; see tempo_lab/passes)
    passes: tuple[str, ...] = ("simplify", "fold", "cse", "remat", "stream", "contract", "dce",
                               "tile", "prefix",
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
    vectorise_groups: bool = True  # of the innermost recurrent dim, batch the ops off the
    # recurrence over all of it while the recurrence loops (passes/vectorise.py); and the steps
    # before a known prefix ends (a prompt), split off to be batched (passes/prefix.py)
    incrementalise: bool = True
    fuse: bool = True
    tile_block: int | None = None
    ragged_buckets: int | None = None  # a tl.lengths bound's instances, sorted by length, run
    # in this many groups, each up to its own longest (where no op reads across instances; 1:
    # one box; None: 4 where an estimate says the groups' loops cost less than the padding
    # they save, else one box: passes/ragged.py's _grouping_pays)
    vectorise_budget_bytes: int = 256 * 2**20  # largest value a vectorised op may make (else
    # incrementalisation vectorises the dim in blocks that fit)
    check_invariants: bool = False  # check the SDG after every pass (tests turn this on)
    device_memory_budget: int | None = None
    mesh: Any = None
    shard: Any = None

    @property
    def enabled_passes(self) -> tuple[str, ...]:
        """The passes that run, in the order they run: the one place that decides it (the pass
        manager runs these). A pass runs when its name is in ``passes`` and the switch it
        registered (``passes.manager.register``: ``tile``, ``fold_constants``, ...) is on;
        ``CompileConfig(tile=False)`` is the short way to leave one out."""
        from .passes import REGISTRY

        return tuple(p for p in self.passes
                     if REGISTRY[p].switch is None or getattr(self, REGISTRY[p].switch))

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
        if self.ragged_buckets is not None and not positive_int(self.ragged_buckets):
            raise ArgumentError(f"ragged_buckets={self.ragged_buckets!r}: give a positive number "
                                "of groups (1: one box up to the longest instance) or None (as "
                                "many as an estimate says pay)")
        if self.tile_block is not None and not positive_int(self.tile_block):
            raise ArgumentError(f"tile_block={self.tile_block!r}: give a positive number of "
                                "points per block, or None for the automatic size (tile=False "
                                "turns tiling off)")
        for name in ("block_size", "xla_split", "vectorise_budget_bytes"):
            if not positive_int(getattr(self, name)):
                raise ArgumentError(f"{name}={getattr(self, name)!r}: give a positive int")
        budget = self.device_memory_budget
        if budget is not None and not positive_int(budget):
            raise ArgumentError(f"device_memory_budget={budget!r}: give a positive number of "
                                "bytes, or None for no budget")
        caps = CAPS.get(self.executor)  # the reference ignores a budget: it lowers nothing
        if budget is not None and caps is not None and caps.lowers and not caps.memory_budget:
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
