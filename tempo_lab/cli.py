"""The ``tempo-lab`` command: what a user runs from a shell.

    tempo-lab demo [--out out/demo] [--layers 2] [--steps 8]   # python -m tempo_lab.demo
    tempo-lab launch -n 2 script.py [args ...]                  # python -m tempo_lab.launch
    tempo-lab info                                              # versions and JAX's devices

Each subcommand is the module of the same name; the command only names them.
"""
from __future__ import annotations

import sys

COMMANDS = {
    "demo": ("tempo_lab.demo", "trace, compile and run the README's decoder; write its views"),
    "launch": ("tempo_lab.launch", "run a script as several JAX processes (local or cluster)"),
    "info": (None, "tempo_lab's and its stack's versions, and the devices JAX sees"),
}


def info() -> int:
    from importlib.metadata import PackageNotFoundError, version

    import jax

    for name in ("tempo_lab", "jax", "jaxlib", "islpy", "numpy", "sympy"):
        try:
            print(f"{name:10} {version(name)}")
        except PackageNotFoundError:
            print(f"{name:10} not installed")
    print(f"{'devices':10} {', '.join(str(d) for d in jax.devices())}")
    return 0


def usage() -> str:
    lines = ["usage: tempo-lab COMMAND [ARGS ...]", "", "commands:"]
    lines += [f"  {name:8} {what}" for name, (_, what) in COMMANDS.items()]
    lines += ["", "tempo-lab COMMAND --help shows a command's arguments."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"tempo-lab: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    if name == "info":
        return info()
    import importlib

    module = importlib.import_module(COMMANDS[name][0])
    sys.argv = [f"tempo-lab {name}", *rest]
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
