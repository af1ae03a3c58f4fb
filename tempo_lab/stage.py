"""What every stage object shares: one rendering (title + labelled sections) feeds ``pretty()``,
``__str__`` and ``_repr_html_``; ``explore()`` imports the notebook UI only when called."""
from __future__ import annotations

import html

from .errors import MissingExtraError

# the packages of the viz extra (pyproject.toml), which the notebook views import
VIZ_PACKAGES = ("plotly", "ipywidgets", "anywidget")


class Stage:
    """Base of Trace, SDG, Program, Run, ...: subclasses give ``__repr__`` and ``_sections``."""

    def _sections(self) -> list[tuple[str, list[str]]]:
        raise NotImplementedError

    def pretty(self) -> str:
        out = [repr(self)]
        for title, lines in self._sections():
            out.append(f"\n{title}:")
            out.extend(f"  {line}" for line in lines)
        return "\n".join(out)

    def __str__(self) -> str:
        return self.pretty()

    def _repr_html_(self) -> str:
        parts = [f'<div class="tempo-lab-stage"><code><b>{html.escape(repr(self))}</b></code>']
        for title, lines in self._sections():
            body = html.escape("\n".join(lines))
            parts.append(f"<details open><summary>{html.escape(title)} ({len(lines)})</summary>"
                         f'<pre style="margin:0 0 0 1em">{body}</pre></details>')
        parts.append("</div>")
        return "".join(parts)

    def explore(self, **options):
        """The interactive view of this stage (needs the ``viz`` extra); ``options`` go to
        the stage's view (e.g. ``run=`` for a Program's dashboard)."""
        try:  # the views import some of the packages only when they are made
            from .widgets import explore

            return explore(self, **options)
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] not in VIZ_PACKAGES:
                raise
            raise MissingExtraError(f"{type(self).__name__}.explore() needs the viz extra's "
                                    f"packages ({', '.join(VIZ_PACKAGES)}), and {e.name} is not "
                                    'installed: pip install "tempo_lab[viz]"') from e
