"""The package's layers, checked: every import (at module level or inside a function) goes to
the same layer or one below, except the two façades docs/architecture.md names; and the imports
made when a module loads form no cycle. The layers, bottom first:

    base (errors, cache, config, files, gc_pause, progress, stage, executors) < symbolic < ir < frontend
    < passes < schedule < memory < runtime < program (with compile_config) < nn, optim, rl
    and the other top-level modules < widgets
"""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "tempo_lab"
BASE = {"errors", "cache", "config", "files", "gc_pause", "progress", "stage", "executors"}
LAYERS = ["symbolic", "ir", "frontend", "passes", "schedule", "memory", "runtime", "program"]
ALONGSIDE = {"compile_config": "program"}  # top-level modules in a layer of the list
# (importer, imported): the façades that reach upward, lazily, inside one method each
FACADES = {
    ("tempo_lab.frontend.context", "tempo_lab.program"): "Context.compile runs the pipeline",
    ("tempo_lab.stage", "tempo_lab.widgets"): "a stage's explore() opens its view",
}


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


MODULES = _modules()


def _rank(module: str) -> int:
    part = module.split(".")[1] if "." in module else ""
    part = ALONGSIDE.get(part, part)
    if part in BASE:
        return 0
    if part in LAYERS:
        return 1 + LAYERS.index(part)
    return len(LAYERS) + (2 if part == "widgets" else 1)


def _imports(module: str, at_load: bool) -> set[str]:
    """The package's modules ``module`` imports (``at_load``: only those imported when it
    loads, not inside functions)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]
    nodes = ast.walk(tree) if not at_load else [
        n for top in tree.body for n in ast.walk(top)
        if not isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    ] + [n for top in tree.body if isinstance(top, ast.ClassDef) for n in top.body
         if isinstance(n, (ast.Import, ast.ImportFrom))]
    out = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name.startswith("tempo_lab") and name != module:
                out.add(name)
                break
    return out


def test_every_import_goes_down_the_layers():
    up = sorted((m, t) for m in MODULES for t in _imports(m, at_load=False)
                if _rank(t) > _rank(m) and (m, t) not in FACADES
                and not (t.startswith(m + ".") or m == "tempo_lab"))
    assert not up, "imports that go up the layers (move the shared code down):\n" + "\n".join(
        f"  {m} -> {t}" for m, t in up)


def test_the_facades_are_still_there():
    """A façade that is gone must leave the list, so the list stays the truth."""
    for (m, t), why in FACADES.items():
        assert t in _imports(m, at_load=False), (m, t, why)


def test_no_import_cycle_when_modules_load():
    graph = {m: _imports(m, at_load=True) for m in MODULES}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(t):] + [t]))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
