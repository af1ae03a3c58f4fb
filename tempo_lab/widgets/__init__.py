"""Notebook views of tempo_lab's stage objects (ipywidgets + plotly + graphviz).

``stage.explore()`` imports this package lazily; tempo_lab itself never imports it. Every
stage type has a view (``explore(stage)``); ``prog.explore()`` is the dashboard. The figures
and HTML the views show are built by pure functions in ``widgets.figures``."""
from .graph import svg_of
from .views import explore

__all__ = ["explore", "svg_of"]
