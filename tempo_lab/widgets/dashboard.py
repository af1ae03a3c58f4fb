"""``prog.explore()``: one tab per stage and one op picker whose choice is highlighted in every
tab at once (SDG, passes, schedule, memory, profile).

Opening it runs nothing: the compile-time tabs are built when first shown, and the profile tab
has a button that runs the program in the background (with a progress bar) and fills in the
measured data."""
from __future__ import annotations

import html

from .base import close_tree, stage_view
from .memory_view import MemoryView
from .pass_view import PassStepper
from .profile_view import ProfileView, recorded_run
from .schedule_view import ScheduleView
from .sdg_view import NONE, SDGExplorer, op_options, set_picked

TABS = ("Program", "SDG", "Passes", "Schedule", "Memory", "Profile")


class Dashboard:
    """The views of one program and the picker that links them. ``run``: a run whose profile
    the views show; without one, the profile tab offers to make one."""

    def __init__(self, prog, run=None):
        import ipywidgets as W

        self.prog, self.run, self.kernels = prog, run, None
        self.selected = NONE
        self.views: dict[str, object] = {}   # the tabs built so far
        self.picker = W.Dropdown(options=op_options(prog.sdg), value=NONE,
                                 description="select op", layout=W.Layout(width="420px"))
        self.picker.add_class("tempo-lab-op-picker")
        self.constants = W.Checkbox(value=False, description="show constants", indent=False,
                                    layout=W.Layout(width="auto"))
        self.constants.add_class("tempo-lab-constants")
        self.constants.observe(lambda ch: self._constants_changed(ch.new), "value")
        self.overview = W.HTML(self._overview_html())
        self.overview.add_class("tempo-lab-overview")
        self.pages = {name: W.VBox() for name in TABS[1:]}
        self.tabs = W.Tab(children=[self.overview] + [self.pages[n] for n in TABS[1:]])
        for k, name in enumerate(TABS):
            self.tabs.set_title(k, name)
        self.tabs.add_class("tempo-lab-tabs")
        self.tabs.observe(lambda ch: self.open(TABS[ch.new]) if ch.new else None,
                          "selected_index")
        self.picker.observe(lambda ch: self.select(ch.new), "value")
        self.export_path = W.Text(value="dashboard.html", description="file",
                                  layout=W.Layout(width="260px"))
        self.export_button = W.Button(description="export HTML", icon="download")
        self.export_button.add_class("tempo-lab-export")
        self.export_link = W.HTML()
        self.export_button.on_click(lambda _: self.export())
        self.widget = W.VBox([W.HBox([self.picker, self.constants, self.export_path,
                                      self.export_button,
                                      self.export_link]), self.tabs])

    def _overview_html(self) -> str:
        return self.prog._repr_html_() + ("" if self.run is None else self.run._repr_html_())

    @property
    def sdg(self) -> SDGExplorer:
        return self.open("SDG")

    def open(self, name: str):
        """The view of tab ``name``, built (with the current selection) on first use."""
        if name in self.views:
            return self.views[name]
        view = self._build(name)
        if view is None:
            self.pages[name].children = (self._absent(name),)
            return None
        self.views[name] = view
        self.pages[name].children = (view.widget,)
        if self.selected != NONE:
            view.select(self.selected)
        return view

    def _build(self, name: str):
        prog, profile = self.prog, None if self.run is None else self.run.profile
        bounds = prog.bounds if self.run is None else self.run.bounds
        if name == "SDG":
            return SDGExplorer(prog.sdg, prog.memory, profile, bounds, selector=False,
                               on_select=self.select)
        if name == "Passes":
            return None if prog.passes is None else PassStepper(prog.passes)
        if name == "Schedule":
            return None if prog.schedule is None else ScheduleView(
                prog.schedule, prog.bounds, self.constants.value)
        if name == "Memory":
            return None if prog.memory is None else MemoryView(prog.memory, profile, prog)
        if self.run is not None:
            return ProfileView(prog, self.run, self.kernels)
        from tempo_lab.saved import SavedProgram

        return Saved(prog) if isinstance(prog, SavedProgram) else RunPanel(self)

    def _absent(self, name: str):
        import ipywidgets as W

        return W.HTML(f"<i>no {name.lower()} stage for the "
                      f"{html.escape(self.prog.config.executor)} executor</i>")

    def profile(self, report=None):
        """Run the program once (recording statement times where the executor can) and show
        what was measured in every tab that has a view of it; the SDG tab keeps the groups
        that were open and the colouring chosen. ``report``: as for ``recorded_run``."""
        self.run, self.kernels = recorded_run(self.prog, report)
        self.overview.value = self._overview_html()
        shown = self.views.get("SDG")
        opened = None if shown is None else shown.expanded
        colour = None if shown is None else shown.colour.value
        for name in ("SDG", "Memory", "Profile"):
            if name in self.views:
                replaced = self.views.pop(name).widget
                self.open(name)
                close_tree(replaced)
        if opened is not None:
            view = self.views["SDG"]
            if colour in {value for _, value in view.colour.options}:
                view.colour.value = colour       # the colouring chosen is kept
            view.set_expanded(opened)

    def export(self, path=None):
        """Save the dashboard as a standalone HTML file (no kernel needed to read it): the SDG
        as drawn in its tab, every other view as it opens, the run if there is one."""
        from .export import save_html

        spec = self.views["SDG"].spec() if "SDG" in self.views else None
        out = save_html(self.prog, path or self.export_path.value, self.run, spec)
        self.export_link.value = (f'<a href="{html.escape(out.name)}" download '
                                  f'class="tempo-lab-export-link">{html.escape(str(out))}</a> '
                                  f'({out.stat().st_size // 1024} KB)')
        return out

    def _constants_changed(self, shown: bool):
        """Constants in the picker, the loop code and the schedule tree, or not."""
        keep = () if self.selected == NONE else (self.selected,)
        self.picker.options = op_options(self.prog.sdg, shown, keep)
        self.picker.value = self.selected
        view = self.views.get("Schedule")
        if view is not None:
            view.constants.value = shown

    def select(self, op_id: int | None):
        """Highlight ``op_id`` (or nothing, for None / -1) in every view."""
        op_id = NONE if op_id is None else op_id
        if self.picker.value != op_id:
            # the observer comes back here with the same id
            set_picked(self.picker, self.prog.sdg, op_id, self.constants.value)
            return
        self.selected = op_id
        for view in self.views.values():
            view.select(op_id)


class Saved:
    """The profile tab of a program read back by ``tl.load``: nothing to run, its compile
    times as they were measured."""

    def __init__(self, prog):
        import ipywidgets as W

        from .base import FigureSlot
        from .profile_view import compile_figure

        note = W.HTML("<i>loaded from a file with tl.load: it cannot run here (its arrays and "
                      "functions are not saved); the compile times were measured when it was "
                      "compiled.</i>")
        self.widget = W.VBox([note, FigureSlot(compile_figure(prog), "tempo-lab-compile").widget])
        self.widget.add_class("tempo-lab-profile")

    def select(self, op_id):
        pass


class RunPanel:
    """The profile tab before a run: a button that runs and profiles the program in a thread
    of its own, so that the notebook stays usable, with a progress bar of the steps."""

    def __init__(self, dash: Dashboard):
        import ipywidgets as W

        self.dash, self.worker = dash, None
        self.button = W.Button(description="run and profile", icon="play",
                               button_style="primary")
        self.button.add_class("tempo-lab-run-button")
        self.bar = W.IntProgress(value=0, min=0, max=1, layout=W.Layout(width="300px",
                                                                         visibility="hidden"))
        self.bar.add_class("tempo-lab-run-progress")
        self.status = W.HTML()
        self.status.add_class("tempo-lab-run-status")
        self.button.on_click(lambda _: self.click())
        note = W.HTML("<i>Nothing has run yet. The button runs the program on the "
                      f"{html.escape(dash.prog.config.executor)} executor in the background, "
                      "a warm-up and a run that records what each op costs; the memory and SDG "
                      "tabs then show measured data too.</i>")
        self.widget = W.VBox([note, W.HBox([self.button, self.bar, self.status])])
        self.widget.add_class("tempo-lab-profile")

    def click(self):
        import threading

        self.button.disabled, self.button.description = True, "running…"
        self.bar.layout.visibility = "visible"
        self.worker = threading.Thread(target=self._work, name="tempo-lab-profile", daemon=True)
        self.worker.start()

    def _work(self):
        import time

        start = time.perf_counter()

        def report(step, steps, what):
            self.bar.max, self.bar.value = steps, step
            self.status.value = (f"step {step + 1} of {steps}: {html.escape(what)} "
                                 f"({time.perf_counter() - start:.0f} s so far)")
        try:
            self.dash.profile(report)
        except Exception as e:   # shown in the tab: a thread's exception reaches no cell
            self.status.value = (f"<b>the run failed</b>: {html.escape(type(e).__name__)}: "
                                 f"{html.escape(str(e))}")
            self.button.disabled, self.button.description = False, "run and profile"

    def wait(self, timeout: float | None = None):
        """Block until the background run has finished (tests, scripts)."""
        if self.worker is not None:
            self.worker.join(timeout)

    def select(self, op_id):
        pass


def explore_program(prog, run=None):
    dash = Dashboard(prog, run)
    view = stage_view([dash.widget], dash._overview_html(), "tempo-lab-dashboard")
    view.dashboard = dash
    return view
