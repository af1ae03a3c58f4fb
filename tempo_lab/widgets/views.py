"""One ``explore`` entry point that picks the view for a stage object. Every view is a VBox
that also carries the stage's static HTML, for renderers without a live kernel."""
from __future__ import annotations

from .base import stage_view, static_html
from .graph import svg_of


def explore(stage, **options):
    """The interactive view of ``stage`` (an ipywidgets VBox)."""
    from tempo_lab.ir.sdg import SDG
    from tempo_lab.memory.plan import MemoryPlan
    from tempo_lab.passes.manager import PassTrace
    from tempo_lab.program import Program
    from tempo_lab.runtime.profile import Profile
    from tempo_lab.runtime.run import Run
    from tempo_lab.saved import SavedProgram, SavedSchedule
    from tempo_lab.schedule import Schedule

    from . import dashboard, memory_view, pass_view, profile_view, schedule_view, sdg_view

    if isinstance(stage, (Program, SavedProgram)):
        return dashboard.explore_program(stage, **options)
    if isinstance(stage, SDG):
        return sdg_view.explore_sdg(stage, **options)
    if isinstance(stage, PassTrace):
        return pass_view.explore_passes(stage)
    if isinstance(stage, (Schedule, SavedSchedule)):
        return schedule_view.explore_schedule(stage, **options)
    if isinstance(stage, MemoryPlan):
        return memory_view.explore_memory(stage, **options)
    if isinstance(stage, Run):
        return profile_view.explore_run(stage, **options)
    if isinstance(stage, Profile):
        return profile_view.explore_profile(stage)
    return _generic(stage)


def _generic(stage):
    """Stages without a view of their own (Trace, Executable): their sections, plus a graph
    picture when they can draw one."""
    import ipywidgets as W

    from .graph import svg_html

    parts, svg = [], None
    if hasattr(stage, "to_dot"):
        svg = svg_of(stage.to_dot())
        parts.append(W.HTML(svg_html(svg) if svg else
                            "<p><i>graphviz's <code>dot</code> program is not installed: no "
                            "picture (Debian: apt-get install graphviz)</i></p>"))
    parts.append(W.HTML(stage._repr_html_()))
    return stage_view(parts, static_html(stage, svg), "tempo-lab-stage-view")
