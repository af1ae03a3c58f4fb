"""``XlaOptions``: the XLA executor's own options, one frozen value that ``XlaPlan`` is built
from: how many spans a loop is split into, and the thresholds of its decisions (which inner loops
are unrolled, which loops have their first step traced apart, which stores start as zeros passed
in, which are kept from one run for the next). Each default is what was measured to pay (the fields' comments say where); a test or a
benchmark that wants another decision builds the executor with other options
(``XlaBackend(XlaOptions(...))``) rather than changing a module's state.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from ..errors import ArgumentError


@dataclass(frozen=True)
class XlaOptions:
    """The XLA executor's options (``XlaPlan``'s decisions read them, nothing else does).

    split: a loop whose range reads grow with its variable is split into this many equal spans
        (``CompileConfig.xla_split``; 1 keeps every loop whole).
    unroll_*: an inner loop of at most ``unroll_steps`` steps may be traced once per step, when
        it reads a point of at least ``unroll_bytes`` of a store, while the program then traces
        at most ``unroll_statements`` copies of its statements (counted as if a loop split into
        spans traced all of its body once per span) (``xla_loops.unrolled_loops``).
    peel_*: a loop body of at most ``peel_small`` statements may have its first step traced
        apart; a larger one only in a loop of at least ``peel_steps`` steps, and when it has at
        most ``peel_statements`` statements or the branches peeling settles are a
        ``1 / peel_share`` of them (``xla_loops.peels``).
    zero_*: a store that starts as zeros is passed in (``XlaPlan.zero_args``) when it is at most
        ``zero_arg_bytes`` and all of them together at most ``zero_args_bytes``, and when copying
        them in costs a call at most ``zero_copy_share`` of its least time: a copy costs
        ``zero_copy_seconds`` a store and its bytes at ``copy_bytes_per_second``, a statement
        executed at least ``statement_seconds`` (as measured on the CPU).
    carry_stores: a store that no read relies on starting as zeros is kept from one run for the
        next, passed in donated (``XlaPlan.carried``): XLA:CPU has no uninitialised buffers, so
        a store made in the program is filled with zeros at every run (a small training step's
        68 MB of parameters, moments and gradients: 21 ms of a 38 ms run), where a donated one
        is written in place. It costs holding the stores between runs.
    carry_poison: the stores a run starts with fresh (the first run's) are filled with NaN (the
        largest value for ints, true for bools) instead of zeros: tests run programs so to
        prove that nothing reads a carried store before writing it.
    switch_carry_bytes: a split loop's work padded per span runs under one ``lax.switch`` only
        when the stores it writes total at most this many bytes: the switch carries them
        whole, and XLA copied them at every step (a training step's attention frames, 67 MB
        a step at 256 tokens: 70x slower than one loop per span).
    """

    split: int = 8
    unroll_steps: int = 32
    unroll_bytes: int = 256
    unroll_statements: int = 1024
    peel_small: int = 32
    peel_steps: int = 16
    peel_statements: int = 128
    peel_share: int = 20
    zero_arg_bytes: int = 1 << 20
    zero_args_bytes: int = 16 << 20
    zero_copy_seconds: float = 1.5e-6
    copy_bytes_per_second: float = 10e9
    statement_seconds: float = 1e-6
    zero_copy_share: float = 0.05
    switch_carry_bytes: int = 1 << 20
    carry_stores: bool = True
    carry_poison: bool = False

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool":
                if not isinstance(value, bool):
                    raise ArgumentError(f"XlaOptions({f.name}={value!r}): give True or False")
                continue
            whole = f.type == "int"
            if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)) \
                    or (value < 1 if whole else value < 0):
                raise ArgumentError(f"XlaOptions({f.name}={value!r}): give a "
                                    f"{'positive int' if whole else 'number of at least 0'}")
