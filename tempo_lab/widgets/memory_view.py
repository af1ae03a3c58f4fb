"""The memory view: a Gantt chart of buffer lifetimes over schedule steps, and predicted vs
measured bytes over the same steps with the peaks marked. ``compare_memory`` puts several
plans (say window vs causal attention) side by side in one figure."""
from __future__ import annotations

import html
import math

from tempo_lab.executors import timeline_backend

from .base import FigureSlot, slider_grid, stage_view
from .costs import largest_stores, scope_order, scope_paths, top_label
from .palette import HIGHLIGHT, STORE_COLOURS, TEMPLATE
from .search import op_title
from .units import byte_ticks, nbytes


def lifetime_rows(plan) -> list[dict]:
    """One row per store, in order of first use: op, label (``op_title``), scope (its top-level
    scope, ``costs.scope_paths``), kind, first and last step, and what the store is."""
    paths = scope_paths(plan.sdg, plan.storages)
    rows = []
    for i, s in plan.storages.items():
        a, b = plan.lifetimes.get(i, (0, 0))
        rows.append({"op": i, "label": op_title(plan.sdg.ops[i]), "kind": s.kind, "start": a,
                     "end": b, "describe": s.describe(), "scope": top_label(paths[i]),
                     "path": paths[i]})
    return sorted(rows, key=lambda r: (r["start"], r["op"]))


def gantt_rows(plan, expanded=()) -> tuple[list[dict], list[str]]:
    """The lifetime rows with the row (``y``) each is drawn on, and the rows in order. Where
    the stores span two or more top-level scopes, each scope is one row holding all its
    stores' bars (in program order, layers side by side), except the scopes in ``expanded``,
    whose stores have a row each (``layer3: q · %934``); otherwise one row per store."""
    rows = lifetime_rows(plan)
    scopes = {r["scope"] for r in rows}
    if len(scopes) < 2:
        for r in rows:
            r["y"] = r["label"]
        return rows, [r["label"] for r in rows]
    order = scope_order({r["op"]: r["path"] for r in rows})
    rank = {r["scope"]: order.get(r["path"][:1], -1) for r in rows}
    ys: list[str] = []
    for r in sorted(rows, key=lambda r: (rank[r["scope"]], r["start"], r["op"])):
        r["y"] = f"{r['scope']}: {r['label']}" if r["scope"] in expanded else r["scope"]
        if r["y"] not in ys:
            ys.append(r["y"])
    return rows, ys


def peak(timeline: list[int]) -> tuple[int, int]:
    """(step, bytes) of the first maximum."""
    if not timeline:
        return 0, 0
    m = max(timeline)
    return timeline.index(m), m


def _add_plan(fig, plan, profile, row: int, col: int, highlight, legend: bool, name: str = "",
              expanded=()):
    import plotly.graph_objects as go

    rows, ys = gantt_rows(plan, expanded)
    grouped = len(ys) < len(rows)
    for kind, colour in STORE_COLOURS.items():
        rs = [r for r in rows if r["kind"] == kind]
        if not rs:
            continue
        fig.add_trace(go.Bar(
            orientation="h", y=[r["y"] for r in rs], base=[r["start"] for r in rs],
            x=[r["end"] - r["start"] + 1 for r in rs], name=f"{kind} store",
            legendgroup=kind, showlegend=legend, customdata=[r["op"] for r in rs],
            hovertext=[f"{r['label']}: {r['describe']}<br>steps {r['start']}..{r['end']}"
                       for r in rs], hoverinfo="text",
            marker=dict(color=colour,
                        line=dict(color=[HIGHLIGHT if r["op"] == highlight else colour
                                         for r in rs],
                                  width=[3 if r["op"] == highlight else 0 for r in rs]),
                        opacity=[1.0 if highlight in (None, r["op"]) else 0.45 for r in rs])),
            row=row, col=col)
    fig.update_yaxes(categoryorder="array", categoryarray=ys, row=row, col=col)
    if grouped:
        fig.update_yaxes(title_text="scope", row=row, col=col)
    # a long run's plan holds a sample of its steps (the first and last iterations of each
    # stretch, memory/simulate.py): drawn at the steps they are, on the lifetimes' axis
    steps = list(plan.steps)
    fig.add_trace(go.Scatter(x=steps, y=plan.timeline, mode="lines", name="predicted bytes",
                             line=dict(color="#1f77b4", shape="hv"), legendgroup="pred",
                             showlegend=legend), row=row + 1, col=col)
    s, b = peak(plan.timeline)
    s = steps[s] if steps else 0
    fig.add_trace(go.Scatter(x=[s], y=[b], mode="markers+text", text=[f"peak {nbytes(b)}"],
                             textposition="top right", marker=dict(color="#1f77b4", size=10,
                                                                   symbol="star"),
                             name="predicted peak", legendgroup="pred", showlegend=False),
                  row=row + 1, col=col)
    if profile is not None and len(profile.timeline) == 1:
        # one entry: what the executor allocates for the whole run (XLA's static stores), a
        # level to compare the per-step prediction with, not a curve over the steps
        b = profile.timeline[0]
        fig.add_trace(go.Scatter(x=[0, max(plan.n_steps - 1, 1)], y=[b, b], mode="lines",
                                 name=f"{profile.executor} static stores", legendgroup="meas",
                                 line=dict(color="#d62728", dash="dash"),
                                 hovertext=f"allocated for the whole run: {nbytes(b)}",
                                 hoverinfo="text", showlegend=legend), row=row + 1, col=col)
    elif profile is not None and profile.timeline:
        fig.add_trace(go.Scatter(x=list(range(len(profile.timeline))), y=profile.timeline,
                                 mode="lines", name="measured bytes", legendgroup="meas",
                                 line=dict(color="#d62728", dash="dot", shape="hv"),
                                 showlegend=legend), row=row + 1, col=col)
        s, b = peak(profile.timeline)
        fig.add_trace(go.Scatter(x=[s], y=[b], mode="markers+text", text=[f"measured {nbytes(b)}"],
                                 textposition="bottom right", name="measured peak",
                                 marker=dict(color="#d62728", size=10, symbol="x"),
                                 legendgroup="meas", showlegend=False), row=row + 1, col=col)
    if highlight is not None and highlight in plan.lifetimes:
        a, e = plan.lifetimes[highlight]
        fig.add_vrect(x0=a, x1=e + 1, fillcolor=HIGHLIGHT, opacity=0.08, line_width=0,
                      row=row + 1, col=col)


def memory_figure(plan, profile=None, highlight: int | None = None, expanded=()):
    """Buffer lifetimes (top: grouped by top-level scope, the scopes in ``expanded`` one row
    per store, see ``gantt_rows``) and bytes per schedule step (bottom), predicted and, with a
    profile, measured, peaks marked; a ``go.Figure``."""
    from plotly.subplots import make_subplots

    n = len(gantt_rows(plan, expanded)[1])
    grouped = n < len(plan.storages)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        row_heights=[0.62, 0.38],
                        subplot_titles=("buffer lifetimes by scope" if grouped else
                                        "buffer lifetimes", "live store bytes"))
    _add_plan(fig, plan, profile, 1, 1, highlight, True, expanded=expanded)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    top = max([max(plan.timeline, default=0)] + list(profile.timeline if profile else []))
    vals, text = byte_ticks(top)
    fig.update_yaxes(title_text="bytes", tickvals=vals, ticktext=text, row=2, col=1)
    fig.update_xaxes(title_text="schedule step", row=2, col=1)
    fig.update_layout(template=TEMPLATE, barmode="overlay", height=min(300 + 16 * n, 900),
                      margin=dict(l=60, r=10, t=40, b=40), legend=dict(orientation="h"))
    return fig


def largest_stores_html(plan, bounds=None, top: int = 20) -> str:
    """The ``top`` largest stores as an HTML table, largest first: name · scope · shape ·
    dtype · bytes · live range (``costs.largest_stores``)."""
    rows = largest_stores(plan, bounds, top)
    at = "" if bounds else "; no bounds given: a growing store counts one block"
    head = "".join(f"<th style='text-align:left;padding:0 8px'>{h}</th>" for h in
                   ("store", "scope", "shape", "dtype", "bytes", "kind", "live (steps)"))
    body = []
    for r in rows:
        cells = (html.escape(r["name"]), html.escape(r["scope"]),
                 "[" + ", ".join(map(str, r["shape"])) + "]", r["dtype"], nbytes(r["bytes"]),
                 r["kind"], f"{r['live'][0]}..{r['live'][1]}")
        body.append(f"<tr data-op='{r['op']}'>" + "".join(
            f"<td style='padding:0 8px'>{c}</td>" for c in cells) + "</tr>")
    return (f"<b>largest stores</b> ({len(rows)} of {len(plan.storages)}{at})"
            f"<table class='tempo-lab-largest-stores'><tr>{head}</tr>{''.join(body)}</table>")


def compare_memory(plans: dict, profiles: dict | None = None):
    """Several memory plans side by side (``{"window": p1.memory, "causal": p2.memory}``),
    one column each, byte axes shared so the peaks compare at a glance; a ``go.Figure``."""
    from plotly.subplots import make_subplots

    profiles = profiles or {}
    names = list(plans)
    titles = [f"{n}: lifetimes" for n in names] + [
        f"{n}: peak {nbytes(plans[n].peak_bytes)}" for n in names]
    fig = make_subplots(rows=2, cols=len(names), shared_yaxes="rows", vertical_spacing=0.08,
                        row_heights=[0.6, 0.4], subplot_titles=titles)
    for k, name in enumerate(names):
        _add_plan(fig, plans[name], profiles.get(name), 1, k + 1, None, k == 0, name)
        fig.update_yaxes(autorange="reversed", row=1, col=k + 1)
        fig.update_xaxes(title_text="schedule step", row=2, col=k + 1)
    n = max(len(gantt_rows(p)[1]) for p in plans.values())
    fig.update_layout(template=TEMPLATE, barmode="overlay", height=min(320 + 16 * n, 900),
                      margin=dict(l=60, r=10, t=40, b=40), legend=dict(orientation="h"))
    return fig


class MemoryView:
    """Memory figure in a FigureWidget; ``select(op_id)`` highlights that op's buffer. With
    ``prog`` and no per-step measurement, a button measures one: a run on an executor that
    records the store bytes after every statement (``executors.timeline_backend``)."""

    def __init__(self, plan, profile=None, prog=None):
        import ipywidgets as W

        self.plan, self.profile, self.prog = plan, profile, prog
        self.highlight = None
        self.expanded: set[str] = set()    # scopes drawn one row per store
        self.plot = FigureSlot(memory_figure(plan, profile), "tempo-lab-memory-plot")
        self.summary = W.HTML(self._summary())
        self.what_if = None   # made with the sliders
        self.sliders = {}
        rows, ys = gantt_rows(plan)
        scopes = list(dict.fromkeys(ys)) if len(ys) < len(rows) else []
        self.scopes = W.SelectMultiple(options=scopes, rows=min(6, max(1, len(scopes))),
                                       description="open scopes",
                                       layout=W.Layout(display="" if scopes else "none"))
        self.scopes.add_class("tempo-lab-memory-scopes")
        self.scopes.observe(lambda _: self._expand(set(self.scopes.value)), "value")
        self.largest = W.HTML(largest_stores_html(plan, None if prog is None else
                                                  dict(prog.bounds)))
        self.largest.add_class("tempo-lab-largest")
        parts = [self.summary, self.scopes, self.plot.widget, self.largest]
        if prog is not None and hasattr(prog.schedule, "ast"):
            from .schedule_view import loop_dims

            looped = {d.bound.name for d in loop_dims(prog.sdg)}  # vectorised: fixed shapes
            for name, value in prog.bounds.items():
                if isinstance(value, int) and name in looped:
                    # a log scale up to 10^6 (or three decades above the compiled value) on
                    # a track at least 300 px wide; the readout takes a typed value
                    self.sliders[name] = W.FloatLogSlider(
                        value=value, base=10, min=0, max=max(6, math.log10(value) + 3),
                        step=0.01, readout_format=",.0f", description=name,
                        continuous_update=False)
                    self.sliders[name].observe(lambda _: self.at_bounds(), "value")
            if self.sliders:
                self.what_if = W.HTML()
                parts[1:1] = [W.HTML("<b>what if</b>: other bound values, predicted from this "
                                     "plan without compiling again"),
                              slider_grid(self.sliders.values()), self.what_if]
        self.measure, self.worker = None, None
        if prog is not None and prog.lowered is not None and (
                profile is None or len(profile.timeline) <= 1):
            self.measure = W.Button(description=f"measure per step ({timeline_backend()} run)",
                                    layout=W.Layout(width="auto"))
            self.measure.add_class("tempo-lab-measure-memory")
            self.measure.on_click(lambda _: self.measure_steps())
            self.measure_status = W.HTML()
            self.measure_status.add_class("tempo-lab-measure-status")
            parts.insert(1, W.HBox([self.measure, self.measure_status]))
        self.widget = W.VBox(parts)
        self.widget.add_class("tempo-lab-memory")

    def _summary(self) -> str:
        plan, profile = self.plan, self.profile
        s, b = peak(plan.timeline)
        sample = (f"; the curve samples {len(plan.timeline)} of them, the first and last "
                  "iterations of each stretch" if plan.sampled else "")
        lines = [f"<code>{plan!r}</code>",
                 f"predicted peak {nbytes(b)} at step {plan.steps[s] if plan.steps else 0} of "
                 f"{plan.n_steps} (the memory plan: every store of the program live at once at "
                 f"that step, as the schedule runs statement by statement{sample})"]
        if profile is not None and len(profile.timeline) == 1:
            lines.append(f"measured: {profile.executor} allocates {nbytes(profile.timeline[0])} "
                         "of static stores for the whole run (no per-step measurement)")
        elif profile is not None and profile.timeline:
            ms, mb = peak(profile.timeline)
            lines.append(f"measured peak {nbytes(mb)} at step {ms} ({profile.executor} run)")
        if profile is not None and profile.xla_memory:
            lines.append("XLA's memory analysis of the compiled program: " + ", ".join(
                f"{k} {nbytes(v)}" for k, v in profile.xla_memory.items()))
            lines.append("<i>Which to believe: the plan counts the program's stores as this "
                         "compiler lays them out; XLA's figures count what its compiled "
                         "program allocates after fusing ops and reusing buffers, without "
                         "arguments it borrows, so it is usually smaller. XLA's is what the "
                         "device holds; the plan is what a budget is checked against.</i>")
        return "<br>".join(lines)

    def at_bounds(self):
        """The plan re-simulated at the sliders' bounds (``memory.plan.replan``): an estimate,
        labelled so, as a compile there may tile, vectorise or size rings differently."""
        from tempo_lab.memory.plan import replan

        bounds = dict(self.prog.bounds)
        bounds.update({k: max(1, round(s.value)) for k, s in self.sliders.items()})
        plan = self.plan if bounds == dict(self.prog.bounds) else \
            replan(self.plan, self.prog.schedule, bounds)
        at = ", ".join(f"{k}={v}" for k, v in bounds.items())
        self.what_if.value = "" if plan is self.plan else (
            f"<i>estimate at {at}</i>: peak {nbytes(plan.peak_bytes)} over {plan.n_steps} steps "
            f"(compiled at {', '.join(f'{k}={v}' for k, v in self.prog.bounds.items())}: "
            f"{nbytes(self.plan.peak_bytes)}); same program and store decisions, not compiled there")
        fig = memory_figure(plan, self.profile if plan is self.plan else None, self.highlight,
                            self.expanded)
        if plan is not self.plan:
            fig.update_layout(title=f"estimate at {at} (re-simulated plan, not compiled)")
        self.plot.show(fig)
        return plan

    def measure_steps(self):
        """Run the program on an executor whose profile has the store bytes after every
        statement (``executors.timeline_backend``), and show that measured curve. The run is
        made in a thread of its own, so that the notebook stays usable (a 16-layer decoder's
        took 55 s), with how far it is beside the button: its outermost loops' step of all
        ("step 12 of 64", once the run has taken a second: ``progress.listening``) and its
        seconds; ``wait()`` waits for it."""
        import threading

        self.measure.disabled, self.measure.description = True, "measuring…"
        self.worker = threading.Thread(target=self._measure, name="tempo-lab-memory",
                                       daemon=True)
        self.worker.start()

    def _measure(self):
        import threading
        import time

        from tempo_lab import progress

        start, done, backend = time.perf_counter(), threading.Event(), timeline_backend()
        steps = [0, 0]      # the run's outermost steps done and in all, once it reports them

        def status():
            where = f"step {steps[0]} of {steps[1]}, " if steps[1] else ""
            return (f"running on the {backend} executor: {where}"
                    f"{time.perf_counter() - start:.0f} s so far")

        def heard(n, total, unit):
            if unit == "step" and total:    # a run's outermost loops (not a compile's stages)
                first = not steps[1]
                steps[:] = [n, total]
                if first or n == total or n % max(1, total // 50) == 0:
                    self.measure_status.value = status()

        def tick():
            while not done.wait(0.5):
                self.measure_status.value = status()
        threading.Thread(target=tick, name="tempo-lab-memory-tick", daemon=True).start()
        try:
            with progress.listening(heard):
                profile = self.prog.on(backend).run().profile
        except Exception as e:   # shown beside the button: a thread's exception reaches no cell
            self.measure_status.value = (f"<b>the run failed</b>: {html.escape(type(e).__name__)}"
                                         f": {html.escape(str(e))}")
            self.measure.disabled = False
            self.measure.description = f"measure per step ({backend} run)"
            return
        finally:
            done.set()
        self.profile = profile
        self.summary.value = self._summary()
        self._redraw()
        self.measure.description = "measured per step"
        self.measure_status.value = (f"measured in {time.perf_counter() - start:.1f} s" +
                                     (f" ({steps[1]} steps)" if steps[1] else ""))

    def wait(self, timeout: float | None = None):
        """Block until a per-step measurement running in the background has finished."""
        if self.worker is not None:
            self.worker.join(timeout)

    def _redraw(self):
        self.plot.show(memory_figure(self.plan, self.profile, self.highlight, self.expanded))

    def _expand(self, scopes: set[str]):
        if scopes != self.expanded:
            self.expanded = scopes
            self._redraw()

    def select(self, op_id: int | None):
        """Highlight the op's store; its scope opens (one row per store) so that it shows."""
        self.highlight = None if op_id is None or op_id < 0 else op_id
        scope = next((r["y"] for r in gantt_rows(self.plan)[0] if r["op"] == self.highlight),
                     None)
        if scope in self.scopes.options and scope not in self.scopes.value:
            self.scopes.value = (*self.scopes.value, scope)    # redraws (_expand)
        else:
            self._redraw()


def explore_memory(plan, profile=None):
    mv = MemoryView(plan, profile)
    view = stage_view([mv.widget], plan._repr_html_(), "tempo-lab-memory-view")
    view.memory_view = mv
    return view
