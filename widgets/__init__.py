"""Notebook views of tempo_lab's stage objects (ipywidgets + graphviz). ``stage.explore()``
imports this package lazily; tempo_lab itself never imports it."""
from .views import explore, svg_of

__all__ = ["explore", "svg_of"]
