"""DOT to SVG with graphviz's ``dot`` program, under a time limit: one home for the demo's
picture and the notebook views' graphs (which draw with plotly where this gives None).

``dot`` runs as a subprocess with a timeout, which the ``graphviz`` Python binding's ``pipe``
has no way to set: a graph on which dot never finished once hung a whole test run."""
from __future__ import annotations

import shutil
import subprocess

DOT_SECONDS = 60  # the longest one layout may take (dot's global ranking took minutes on PPO)


def svg_of(dot_source: str, timeout: float = DOT_SECONDS) -> str | None:
    """Render DOT to an SVG string (from its ``<svg`` tag), or None when the ``dot`` program is
    not installed, fails on this graph or takes longer than ``timeout`` seconds."""
    try:
        svg = _dot(dot_source, timeout)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    except subprocess.CalledProcessError:
        # dot's default ranking fails on some nested groups (PPO's); its global ranking
        # ("newrank") lays those out, but takes minutes on a few hundred ops, so only then
        try:
            svg = _dot(dot_source.replace("rankdir=TB;", "rankdir=TB; newrank=true;", 1),
                       timeout)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            return None
    return svg[svg.find("<svg"):]


def _dot(dot_source: str, timeout: float) -> str:
    """``dot -Tsvg`` on ``dot_source`` (FileNotFoundError without dot; CalledProcessError
    when it fails; TimeoutExpired, and the process killed, past ``timeout`` seconds)."""
    return subprocess.run(["dot", "-Tsvg"], input=dot_source, capture_output=True, text=True,
                          timeout=timeout, check=True).stdout


def dot_installed() -> bool:
    return shutil.which("dot") is not None
