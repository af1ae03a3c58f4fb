"""Which executor runs a compiled program: ``CompileConfig(executor=...)`` or the automatic
choice (XLA loops when every loop nest qualifies, else generated code)."""
from __future__ import annotations

from .codegen import CodegenExecutor
from .executor import Executor


def make_executable(kind: str, sdg, schedule, plan, bounds, sync: bool, split: int = 8):
    """The executable stage for ``kind`` ("auto", "xla", "codegen" or "interpreter")."""
    if kind == "interpreter":
        return Executor(sdg, schedule, plan, sync)
    if kind == "codegen":
        return CodegenExecutor(sdg, schedule, plan, sync)
    from .xla_loops import XlaExecutor, disqualifiers

    reasons = disqualifiers(sdg, schedule, plan, bounds)
    if kind == "xla":
        return XlaExecutor(sdg, schedule, plan, bounds, sync, forced=True,
                           reasons=reasons, split=split)
    if reasons:
        ex = CodegenExecutor(sdg, schedule, plan, sync)
        ex.choice = ["auto chose codegen: not every loop nest can run inside XLA"] + reasons
        return ex
    ex = XlaExecutor(sdg, schedule, plan, bounds, sync, split=split)
    ex.choice = ["auto chose xla: every loop nest runs inside one XLA program "
                 "(static store shapes for these bounds, no host callbacks)"]
    return ex
