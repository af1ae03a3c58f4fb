"""The ``tempo-lab`` command: what a user runs from a shell.

    tempo-lab demo [--out out/demo] [--layers 2] [--steps 8]   # python -m tempo_lab.demo
    tempo-lab launch -n 2 script.py [args ...]                  # python -m tempo_lab.launch
    tempo-lab info                                              # versions and JAX's devices
    tempo-lab --version                                         # tempo_lab's version

Each subcommand is the module of the same name; the command only names them.
"""
from __future__ import annotations

import sys

COMMANDS = {
    "demo": ("tempo_lab.demo", "trace, compile and run the README's decoder; write its views"),
    "launch": ("tempo_lab.launch", "run a script as several JAX processes (local or cluster)"),
    "info": (None, "tempo_lab's and its stack's versions, and the devices JAX sees"),
}


def info(argv: list[str]) -> int:
    """``tempo-lab info``: it takes no arguments, and one it does not know is a usage error
    (exit 2), as argparse makes every other command's (it printed the versions and exited 0)."""
    import argparse
    from importlib.metadata import PackageNotFoundError, version

    parser = argparse.ArgumentParser(prog="tempo-lab info", description=COMMANDS["info"][1])
    try:
        parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a bad argument (2, after the usage)
        return int(e.code or 0)

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
    lines += ["", "tempo-lab COMMAND --help shows a command's arguments; tempo-lab --version "
              "the version."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from . import __version__

        print(f"tempo-lab {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"tempo-lab: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    if name == "info":
        return info(rest)
    import importlib

    module = importlib.import_module(COMMANDS[name][0])
    sys.argv = [f"tempo-lab {name}", *rest]
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
