"""tempo_lab: a notebook workbench for compiled dynamic deep learning over recurrent tensors."""
from . import nn, optim, random, rl
from .compile_config import CompileConfig
from .config import config
from .errors import (
                     ArgumentError,
                     BoundsError,
                     CallbackError,
                     CheckpointError,
                     DefinitionError,
                     DTypeError,
                     ExprError,
                     GradientError,
                     InternalError,
                     MissingExtraError,
                     OutOfMemoryError,
                     OutputError,
                     ScheduleError,
                     ShapeError,
                     ShardingError,
                     TempoLabError,
)
from .frontend.api import (
                     abs,
                     arange,
                     concatenate,
                     cos,
                     eq,
                     exp,
                     expand_dims,
                     from_array,
                     full,
                     lift,
                     log,
                     matmul,
                     max,
                     maximum,
                     mean,
                     min,
                     minimum,
                     ne,
                     ones,
                     placeholder,
                     relu,
                     reshape,
                     sigmoid,
                     sin,
                     sink,
                     softmax,
                     source,
                     sqrt,
                     squeeze,
                     stack,
                     sum,
                     take,
                     tanh,
                     transpose,
                     where,
                     zeros,
)
from .frontend.api import constant_ as constant
from .frontend.autodiff import grad
from .frontend.bounds import lengths, until
from .frontend.context import Context, scope
from .frontend.tensor import RecurrentTensor
from .frontend.trace import Trace
from .ir.sdg import SDG
from .program import Program
from .runtime.run import Run
from .saved import load, save
from .symbolic import Bound, Dim, Slice

__version__ = "0.1.0"

__all__ = [
    "ArgumentError", "BoundsError", "Bound", "CallbackError", "CheckpointError", "InternalError", "MissingExtraError", "OutOfMemoryError", "OutputError", "CompileConfig", "Context", "DTypeError", "DefinitionError", "Dim",
    "ExprError", "GradientError", "Program", "RecurrentTensor", "Run", "SDG", "ScheduleError", "ShapeError", "ShardingError",
    "Slice", "TempoLabError", "Trace", "abs", "arange", "concatenate", "config", "constant",
    "cos", "eq", "exp", "expand_dims", "from_array", "full", "grad", "lengths", "lift", "load", "log", "matmul", "max", "maximum",
    "mean", "min", "minimum", "ne", "nn", "ones", "optim", "placeholder", "random", "relu", "reshape", "rl", "save", "scope", "sigmoid", "sin",
    "sink", "softmax", "source", "sqrt", "squeeze", "stack", "sum", "take", "tanh", "transpose", "until",
    "where", "zeros",
]


def _check_signatures() -> None:
    """Every public function here and in ``nn``, ``optim``, ``random`` and ``rl``, called with
    arguments its signature refuses, raises an ``ArgumentError`` at the caller's line."""
    import inspect
    import sys

    from .errors import checked_signature

    for prefix, module in (("tl", sys.modules[__name__]), ("tl.nn", nn), ("tl.optim", optim),
                           ("tl.random", random), ("tl.rl", rl)):
        names = getattr(module, "__all__", None) or [n for n in vars(module) if n[0] != "_"]
        for name in names:
            fn = getattr(module, name)
            if inspect.isfunction(fn) and fn.__module__.startswith(__name__):
                setattr(module, name, checked_signature(fn, prefix))


_check_signatures()
