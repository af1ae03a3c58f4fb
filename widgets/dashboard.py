"""``prog.explore()``: one tab per stage and one op picker whose choice is highlighted in every
tab at once (SDG, passes, schedule, memory, profile)."""
from __future__ import annotations

import html

from .base import stage_view
from .memory_view import MemoryView
from .pass_view import PassStepper
from .profile_view import ProfileView, recorded_run
from .schedule_view import ScheduleView
from .sdg_view import NONE, SDGExplorer, op_options

TABS = ("Program", "SDG", "Passes", "Schedule", "Memory", "Profile")


class Dashboard:
    """The views of one program and the picker that links them. ``run`` defaults to one
    recorded run of the program (so the profile tab has kernels to show)."""

    def __init__(self, prog, run=None):
        import ipywidgets as W

        kernels = None
        if run is None:
            run, kernels = recorded_run(prog)
        self.prog, self.run = prog, run
        profile = run.profile
        self.picker = W.Dropdown(options=op_options(prog.sdg), value=NONE,
                                 description="select op", layout=W.Layout(width="420px"))
        self.picker.add_class("tempo-lab-op-picker")
        self.sdg = SDGExplorer(prog.sdg, prog.memory, profile, run.bounds, selector=False)
        self.views: dict[str, object] = {"SDG": self.sdg}
        if prog.passes is not None:
            self.views["Passes"] = PassStepper(prog.passes)
        if prog.schedule is not None:
            self.views["Schedule"] = ScheduleView(prog.schedule, prog.bounds)
        if prog.memory is not None:
            self.views["Memory"] = MemoryView(prog.memory, profile)
        self.views["Profile"] = ProfileView(prog, run, kernels)
        overview = W.HTML(prog._repr_html_() + run._repr_html_())
        overview.add_class("tempo-lab-overview")
        pages = {"Program": overview}
        for name in TABS[1:]:
            pages[name] = (self.views[name].widget if name in self.views else
                           W.HTML(f"<i>no {name.lower()} stage for the "
                                  f"{html.escape(prog.config.executor)} executor</i>"))
        self.tabs = W.Tab(children=[pages[n] for n in TABS])
        for k, name in enumerate(TABS):
            self.tabs.set_title(k, name)
        self.tabs.add_class("tempo-lab-tabs")
        self.picker.observe(lambda ch: self.select(ch.new), "value")
        self.widget = W.VBox([self.picker, self.tabs])

    def select(self, op_id: int | None):
        """Highlight ``op_id`` (or nothing, for None / -1) in every view."""
        op_id = NONE if op_id is None else op_id
        if self.picker.value != op_id:
            self.picker.value = op_id   # the observer comes back here with the same id
            return
        for view in self.views.values():
            view.select(op_id)


def explore_program(prog, run=None):
    dash = Dashboard(prog, run)
    static = prog._repr_html_() + dash.run._repr_html_()
    view = stage_view([dash.widget], static, "tempo-lab-dashboard")
    view.dashboard = dash
    return view
