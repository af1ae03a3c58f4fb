"""The run profile: kernel time by top-level scope (the layers, side by side in program
order), a per-kernel timeline, an icicle chart of kernel time by region (domain), scope path
and op, and the compile-time breakdown by stage (passes split by pass)."""
from __future__ import annotations

import html
from dataclasses import dataclass

from tempo_lab.schedule import Exec, walk

from .base import FigureSlot, stage_view
from .costs import op_value, scope_costs, scope_order, scope_paths, time_unit, top_label
from .palette import HIGHLIGHT, NARROW, TEMPLATE, category_colour, place_title, region_of
from .search import op_title

MAX_KERNELS = 5000


@dataclass(frozen=True)
class Kernel:
    """One kernel call: the op, its point, start and end in seconds from the run's start."""

    op: int
    point: tuple
    start: float
    end: float


def recorded_run(prog, report=None):
    """Run ``prog`` once recording every statement instance (``run.profile.events``), and
    return ``(run, kernels)``. The XLA program runs its statements inside one XLA call and the
    reference interpreter has no schedule: there the kernels are ``None`` and views fall back
    to ``estimated_kernels``. A first, unrecorded run compiles what the executor compiles, so
    that the times recorded are warm ones. ``report(step, steps, what)`` hears of each step
    as it starts (the dashboard's progress bar)."""
    report = report or (lambda *_: None)
    if getattr(prog, "executable", None) is None:
        report(0, 1, "one run (this executor records no kernels)")
        return prog.run(), None
    report(0, 3, "warm-up run (compiles what the executor compiles)")
    prog.run()
    report(1, 3, "recorded run")
    run = prog.run(record=True)
    events = run.profile.events[:MAX_KERNELS]
    if not events:
        report(2, 3, f"per-op device time: {PROFILED_RUNS + 1} runs under JAX's profiler")
        _xla_measurements(prog, run)
        return run, None
    return run, [Kernel(e.op, e.point, e.start, e.end) for e in events]


PROFILED_RUNS = 3


def _xla_measurements(prog, run):
    """The XLA program runs every statement inside one call: its per-op seconds come from
    JAX's profiler (``executable.op_seconds``), when the program has no host callbacks that
    profiling runs would repeat, and what it allocates from XLA's ``memory_analysis``.

    The first profiled run is thrown away and each op's time is the median over
    ``PROFILED_RUNS`` runs profiled one by one (``profile.sessions`` keeps each): on a small
    program an op's kernels take well under a microsecond each, and the first run under the
    profiler and a run that shares the CPU with other work were up to twice as slow, enough
    to make one of 16 identical layers look 1.7x another's. The runs apart let the views say
    how far a scope's time moves from run to run."""
    import statistics

    ex = prog.executable
    if not hasattr(ex.prepared, "memory_analysis"):
        return
    run.profile.xla_memory = ex.memory_analysis()
    if ex.lowered.sources or ex.lowered.sinks:
        return
    ex.op_seconds(runs=1)    # the profiler's first run: slower, not kept
    sessions = [{i: s for i, s in ex.op_seconds(runs=1).items() if isinstance(i, int)}
                for _ in range(PROFILED_RUNS)]
    ops = set().union(*sessions)
    run.profile.seconds = {i: statistics.median(s.get(i, 0.0) for s in sessions)
                           for i in sorted(ops)}
    run.profile.sessions = sessions
    run.profile.fused = ex.fused_ops(set(run.profile.seconds))
    run.profile.synced = True
    run.profile.measured += ("; time: device time of each op's statements inside the XLA "
                             f"program (JAX profiler, median of {PROFILED_RUNS} runs profiled "
                             "one by one after one not kept)")


def estimated_kernels(schedule, profile, bounds) -> list[Kernel]:
    """Without recorded kernels: calls in schedule order, each lasting its op's mean time."""
    out, t = [], 0.0
    for node, point in walk(schedule.ast, dict(bounds)):
        if isinstance(node, Exec) and node.op in profile.calls:
            dt = profile.seconds.get(node.op, 0.0) / max(1, profile.calls[node.op])
            out.append(Kernel(node.op, point, t, t + dt))
            t += dt
            if len(out) >= MAX_KERNELS:
                break
    return out


def untimed(kernels: list[Kernel]) -> bool:
    """True when the executor measured no per-op time (a whole loop nest in one XLA call)."""
    return bool(kernels) and all(k.end - k.start <= 0 for k in kernels)


def timeline_figure(sdg, kernels: list[Kernel], highlight: int | None = None,
                    estimated: bool = False):
    """One row per op (in order of first call), one bar per kernel call; a ``go.Figure``.
    Without per-op times the x axis is the call's position in schedule order instead."""
    import plotly.graph_objects as go

    if untimed(kernels):
        kernels = [Kernel(k.op, k.point, i * 1e-3, (i + 1) * 1e-3)
                   for i, k in enumerate(kernels)]
        estimated = None
    rows = list(dict.fromkeys(k.op for k in kernels))
    fig = go.Figure()
    by_cat: dict[str, list[Kernel]] = {}
    for k in kernels:
        by_cat.setdefault(sdg.ops[k.op].category, []).append(k)
    for cat, ks in sorted(by_cat.items()):
        colour = category_colour(cat)
        fig.add_trace(go.Bar(
            orientation="h", y=[op_title(sdg.ops[k.op]) for k in ks],
            base=[k.start * 1e3 for k in ks], x=[max(k.end - k.start, 1e-7) * 1e3 for k in ks],
            name=cat, customdata=[k.op for k in ks], hoverinfo="text",
            hovertext=[f"{op_title(sdg.ops[k.op])} ({sdg.ops[k.op].kind}) at "
                       f"{list(k.point)}: {(k.end - k.start) * 1e6:.0f} µs" for k in ks],
            marker=dict(color=[HIGHLIGHT if k.op == highlight else colour for k in ks],
                        line=dict(width=0.5, color="#555"))))
    what = ("this executor times no kernel: calls in schedule order"
            if estimated is None else "estimated from per-op totals" if estimated
            else "measured")
    place_title(fig, f"kernel timeline: {len(kernels)} calls", what)
    fig.update_layout(template=TEMPLATE, barmode="overlay", bargap=0.15,
                      xaxis_title="call number" if estimated is None
                      else "ms since the run started",
                      yaxis=dict(categoryorder="array", categoryarray=[op_title(sdg.ops[i])
                                                                       for i in rows],
                                 autorange="reversed"),
                      height=min(240 + 18 * len(rows), 940),   # 18 px a row under the title
                      margin=dict(l=70, r=10, b=40))
    return fig


SEP = "\x1f"   # joins the parts of an icicle id (scope names may hold "/")


def icicle_data(sdg, profile) -> dict[str, list]:
    """ids, labels, parents and values of the icicle: all → region → scope path (nested,
    ``layer3`` → ``attention``) → op, ops named as everywhere (``q · %934``). Values are
    milliseconds, or kernel calls (``unit``) when the executor measured no per-op time.
    ``ops``: the op id of each entry (None for a group)."""
    unit, _ = time_unit(profile)
    ids, labels, parents, values, ops = ["all"], ["all kernels"], [""], [0.0], [None]
    seen: dict[str, int] = {"all": 0}
    paths = scope_paths(sdg, [i for i in profile.calls if i in sdg.ops])

    def add(ident, label, parent, v, op=None):
        if ident not in seen:
            seen[ident] = len(ids)
            ids.append(ident)
            labels.append(label)
            parents.append(parent)
            values.append(0.0)
            ops.append(op)
        values[seen[ident]] += v

    order = scope_order(paths)
    for i in sorted(paths, key=lambda i: (order.get(paths[i], -1) if paths[i] else -1, i)):
        op = sdg.ops[i]
        v = op_value(profile, i, unit)
        values[0] += v
        parent = region_of(op)
        add(parent, parent, "all", v)
        for name in paths[i]:
            ident = parent + SEP + name
            add(ident, name, parent, v)
            parent = ident
        add(f"%{op.id}", op_title(op), parent, v, op.id)
    return {"ids": ids, "labels": labels, "parents": parents, "values": values, "ops": ops,
            "unit": unit}


def icicle_figure(sdg, profile, highlight: int | None = None):
    """Kernel time aggregated by region, scope and op; a ``go.Figure``."""
    import plotly.graph_objects as go

    d = icicle_data(sdg, profile)
    colours = []
    for ident, op in zip(d["ids"], d["ops"]):
        if op is not None:
            colours.append(HIGHLIGHT if op == highlight else
                           category_colour(sdg.ops[op].category))
        else:
            colours.append("#f0f0f0" if ident == "all" or SEP not in ident else "#e4e4e4")
    fig = go.Figure(go.Icicle(ids=d["ids"], labels=d["labels"], parents=d["parents"],
                              values=d["values"], branchvalues="total",
                              marker=dict(colors=colours), tiling=dict(orientation="v"),
                              customdata=[-1 if o is None else o for o in d["ops"]],
                              hovertemplate=f"%{{label}}: %{{value:.3f}} {d['unit']}"
                                            "<extra></extra>"))
    what = "time (ms)" if d["unit"] == "ms" else "calls (this executor measured no times)"
    place_title(fig, f"kernel {what} by region, scope and op")
    fig.update_layout(template=TEMPLATE, height=420, margin=dict(l=10, r=10, b=10))
    return fig


def scope_figure(sdg, profile, highlight: int | None = None):
    """One bar per top-level scope (the layers), in program order so that like scopes sit
    side by side, stacked by the scopes one level down; with several profiled runs, a line
    from the least to the most a scope took over them. The title says what was measured; a
    ``go.Figure`` (``costs.scope_costs`` holds the numbers)."""
    import plotly.graph_objects as go

    from .layout import text_width

    c = scope_costs(sdg, profile)
    rows, unit = c["rows"], c["unit"]
    names = [r["scope"] for r in rows]
    parts = list(dict.fromkeys(p for r in rows for p in r["parts"]))
    mine = None
    if highlight is not None and highlight in sdg.ops:
        mine = top_label(scope_paths(sdg, [i for i in profile.calls if i in sdg.ops]
                                     ).get(highlight, ()))
    fmt = ".3f" if unit == "ms" else ".0f"
    fig = go.Figure()
    for part in parts:
        ys = [r["parts"].get(part, 0.0) for r in rows]
        fig.add_trace(go.Bar(
            x=names, y=ys, name=part or "own ops", customdata=[r["ops"] for r in rows],
            hovertemplate=f"%{{x}}{' / ' + part if part else ''}: %{{y:{fmt}}} {unit}"
                          "<extra></extra>",
            marker=dict(line=dict(color=[HIGHLIGHT if n == mine else "rgba(0,0,0,0)"
                                         for n in names], width=3))))
    if any(r["high"] > r["low"] for r in rows):
        fig.add_trace(go.Scatter(
            x=names, y=[r["value"] for r in rows], mode="markers", name="runs' range",
            marker=dict(size=1, color="#333"), hoverinfo="skip",
            error_y=dict(type="data", symmetric=False, color="#333", width=3,
                         array=[r["high"] - r["value"] for r in rows],
                         arrayminus=[r["value"] - r["low"] for r in rows])))
    place_title(fig, f"{unit} by scope", c["what"])
    # The legend is rows between the title and the plot, and the bottom margin holds the
    # longest scope name at -45°: as a row under the plot (plotly's place for a horizontal
    # legend) it covered the first layers' names, and "(outside scopes)" ran out of a
    # fixed 80-px margin (a 16-layer decoder's chart).
    shown = [fig.data[k].name for k in range(len(fig.data))] if len(parts) > 1 else []
    top = fig.layout.margin.t
    legend = _legend_rows(shown, NARROW - 20)
    tick = max((text_width(n, TICK_FONT) for n in names), default=0.0) * 0.71
    fig.update_layout(template=TEMPLATE, barmode="stack",
                      xaxis=dict(categoryorder="array", categoryarray=names, tickangle=-45,
                                 tickfont=dict(size=TICK_FONT), automargin=True),
                      yaxis_title=unit, height=360 + LEGEND_ROW * legend,
                      showlegend=bool(shown), margin=dict(l=60, r=10, b=round(tick) + 24,
                                                          t=top + LEGEND_ROW * legend),
                      legend=dict(orientation="h", x=0, xanchor="left", yref="container",
                                  y=1 - top / (360 + LEGEND_ROW * legend), yanchor="top"))
    return fig


TICK_FONT = 12      # px: the scope chart's x tick labels
LEGEND_ROW = 22     # px: a row of a horizontal legend


def _legend_rows(names: list[str], width: float) -> int:
    """How many rows plotly's horizontal legend takes for ``names`` in ``width`` px: each
    entry its 40-px symbol and gap and its text at 12 px."""
    from .layout import text_width

    rows, x = (1 if names else 0), 0.0
    for name in names:
        w = 40 + text_width(name, 12)
        if x and x + w > width:
            rows, x = rows + 1, 0.0
        x += w
    return rows


def scope_notes_html(sdg, profile) -> str:
    """What the scope chart measured, and how like scopes compare: their spread, whether it
    is within what one scope moves from run to run, and ops counted under another scope."""
    c = scope_costs(sdg, profile)
    unit = c["unit"]

    def v(x):
        return f"{x:.3g} ms" if unit == "ms" else f"{x:.0f} calls"

    n = len(c["rows"])
    lines = [f"{n} top-level scopes; {html.escape(c['what'])}" if n > 1 else
             f"no scopes to compare (no tl.scope or library call divides the program); "
             f"{html.escape(c['what'])} per op in the icicle below"]
    for g in c["alike"]:
        text = (f"{len(g['names'])} like scopes <b>{html.escape(g['stem'])}</b>: median "
                f"{v(g['median'])}, {v(g['low'])} to {v(g['high'])} "
                f"({g['spread']:.2f}x)")
        if unit == "ms" and g["run_spread"] is not None:
            noise = "within" if g["spread"] <= g["run_spread"] else "beyond"
            text += (f"; one scope moved up to {g['run_spread']:.2f}x between profiled runs: "
                     f"the difference is {noise} the measurement's noise")
        lines.append(text)
    if c["elsewhere"]:
        lines.append("ops XLA fused into a kernel counted under another scope's op (their "
                     "time is there): " + ", ".join(
                         f"{html.escape(k)} {n}" for k, n in c["elsewhere"].items()))
    return "<br>".join(lines)


def compile_rows(prog) -> list[tuple[str, float]]:
    """(stage, seconds) in pipeline order; the passes stage is split into its passes."""
    rows = []
    for stage, sec in prog.compile_times.items():
        if stage == "passes" and prog.passes is not None and prog.passes.records:
            rest = max(0.0, sec - sum(r.seconds for r in prog.passes.records))
            rows += [(f"pass {r.name}", r.seconds) for r in prog.passes.records]
            rows.append(("passes (manager)", rest))
        else:
            rows.append((stage, sec))
    return rows


def compile_figure(prog):
    """Compile time by stage as one stacked horizontal bar; a ``go.Figure``. Every stage has
    a colour of its own (the passes shades of blue, in order; the template's 10 colours were
    reused over 17 stages), and the legend is a column at the right (a row under the bar
    covered the axis title)."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative, sample_colorscale

    rows = compile_rows(prog)
    passes = [stage for stage, _ in rows if stage.startswith("pass")]
    blues = iter(sample_colorscale("Blues", [0.3 + 0.6 * k / max(len(passes) - 1, 1)
                                             for k in range(len(passes))]) if passes else [])
    others = iter(qualitative.Set2 + qualitative.Pastel1)
    fig = go.Figure()
    for stage, sec in rows:
        colour = next(blues) if stage.startswith("pass") else next(others, "#999999")
        fig.add_trace(go.Bar(orientation="h", y=["compile"], x=[sec * 1e3], name=stage,
                             marker_color=colour,
                             hovertemplate=f"{stage}: %{{x:.2f}} ms<extra></extra>"))
    place_title(fig, "compile time by stage (ms)")
    fig.update_layout(template=TEMPLATE, barmode="stack", height=max(220, 20 * len(rows) + 100),
                      xaxis_title="ms", margin=dict(l=70, r=10, b=40),
                      legend=dict(orientation="v", x=1.02, y=1, yanchor="top",
                                  traceorder="normal", font=dict(size=11)))
    return fig


class ProfileView:
    """Timeline, icicle and compile breakdown; ``select(op_id)`` colours that op's kernels."""

    def __init__(self, prog, run, kernels=None):
        import ipywidgets as W

        self.prog, self.run = prog, run
        profile = run.profile
        self.sdg = prog.sdg
        self.estimated = kernels is None
        if kernels is None and profile is not None and prog.schedule is not None:
            kernels = estimated_kernels(prog.schedule, profile, run.bounds)
        self.kernels = kernels or []
        parts = [W.HTML(f"<code>{profile!r}</code>" if profile is not None else
                        "<i>the reference executor keeps no profile</i>")]
        self.timeline = self.icicle = self.scopes = None
        if profile is not None:
            self.scope_notes = W.HTML(scope_notes_html(self.sdg, profile))
            self.scope_notes.add_class("tempo-lab-scope-notes")
            if len(scope_costs(self.sdg, profile)["rows"]) > 1:   # one scope: nothing to chart
                self.scopes = FigureSlot(scope_figure(self.sdg, profile), "tempo-lab-scopes")
                parts.append(self.scopes.widget)
            parts.append(self.scope_notes)
            self.timeline = FigureSlot(timeline_figure(self.sdg, self.kernels, None,
                                                       self.estimated), "tempo-lab-timeline")
            self.icicle = FigureSlot(icicle_figure(self.sdg, profile), "tempo-lab-icicle")
            parts += [self.timeline.widget, self.icicle.widget]
        self.compile = FigureSlot(compile_figure(prog), "tempo-lab-compile")
        parts.append(self.compile.widget)
        self.widget = W.VBox(parts)
        self.widget.add_class("tempo-lab-profile")

    def select(self, op_id: int | None):
        op_id = None if op_id is None or op_id < 0 else op_id
        if self.timeline is not None:
            self.timeline.show(timeline_figure(self.sdg, self.kernels, op_id, self.estimated))
            self.icicle.show(icicle_figure(self.sdg, self.run.profile, op_id))
            if self.scopes is not None:
                self.scopes.show(scope_figure(self.sdg, self.run.profile, op_id))


def explore_run(run, kernels=None):
    pv = ProfileView(run.program, run, kernels)
    html = run._repr_html_() + (run.profile._repr_html_() if run.profile is not None else "")
    view = stage_view([pv.widget], html, "tempo-lab-run-view")
    view.profile_view = pv
    return view


def explore_profile(profile):
    """A Profile alone (no program at hand): scopes and icicle only."""
    import ipywidgets as W

    scopes = FigureSlot(scope_figure(profile.sdg, profile), "tempo-lab-scopes")
    slot = FigureSlot(icicle_figure(profile.sdg, profile), "tempo-lab-icicle")
    return stage_view([W.HTML(f"<code>{profile!r}</code>"), scopes.widget,
                       W.HTML(scope_notes_html(profile.sdg, profile)), slot.widget],
                      profile._repr_html_(), "tempo-lab-profile-view")
