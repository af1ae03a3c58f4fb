"""The run profile: a per-kernel timeline, an icicle chart of kernel time by region (domain),
op kind and op, and the compile-time breakdown by stage (passes split by pass)."""
from __future__ import annotations

from dataclasses import dataclass

from tempo_lab.schedule import Exec, walk

from .base import FigureSlot, stage_view
from .palette import HIGHLIGHT, TEMPLATE, category_colour, region_of
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
        report(2, 3, "per-op device time: 3 runs under JAX's profiler")
        _xla_measurements(prog, run)
        return run, None
    return run, [Kernel(e.op, e.point, e.start, e.end) for e in events]


def _xla_measurements(prog, run):
    """The XLA program runs every statement inside one call: its per-op seconds come from
    JAX's profiler (``executable.op_seconds``), when the program has no host callbacks that
    profiling runs would repeat, and what it allocates from XLA's ``memory_analysis``."""
    ex = prog.executable
    if not hasattr(ex.prepared, "memory_analysis"):
        return
    run.profile.xla_memory = ex.memory_analysis()
    if ex.lowered.sources or ex.lowered.sinks:
        return
    seconds = ex.op_seconds(runs=3)
    run.profile.seconds = {i: s for i, s in seconds.items() if isinstance(i, int)}
    run.profile.fused = ex.fused_ops(set(run.profile.seconds))
    run.profile.synced = True
    run.profile.measured += ("; time: device time of each op's statements inside the XLA "
                             "program (JAX profiler, mean of 3 runs)")


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
    what = ("no per-kernel times from this executor: calls in schedule order"
            if estimated is None else "estimated from per-op totals" if estimated
            else "measured")
    fig.update_layout(template=TEMPLATE, barmode="overlay", bargap=0.15,
                      title=f"kernel timeline ({len(kernels)} calls, {what})",
                      xaxis_title="call number" if estimated is None
                      else "ms since the run started",
                      yaxis=dict(categoryorder="array", categoryarray=[op_title(sdg.ops[i])
                                                                       for i in rows],
                                 autorange="reversed"),
                      height=min(200 + 18 * len(rows), 900), margin=dict(l=70, r=10, t=40,
                                                                         b=40))
    return fig


def icicle_data(sdg, profile) -> dict[str, list]:
    """ids, labels, parents and values of the icicle: all → region → kind → op. Values are
    milliseconds, or kernel calls (``unit``) when the executor measured no per-op time."""
    timed = any(v > 0 for v in profile.seconds.values())
    ids, labels, parents, values = ["all"], ["all kernels"], [""], [0.0]
    seen: dict[str, int] = {"all": 0}

    def add(ident, label, parent, v):
        if ident not in seen:
            seen[ident] = len(ids)
            ids.append(ident)
            labels.append(label)
            parents.append(parent)
            values.append(0.0)
        values[seen[ident]] += v

    for i in sorted(profile.calls):
        op = sdg.ops[i]
        ms = profile.seconds.get(i, 0.0) * 1e3 if timed else float(profile.calls[i])
        region = region_of(op)
        values[0] += ms
        add(region, region, "all", ms)
        add(f"{region}/{op.kind}", op.kind, region, ms)
        add(f"{region}/{op.kind}/%{op.id}", op_title(op), f"{region}/{op.kind}", ms)
    return {"ids": ids, "labels": labels, "parents": parents, "values": values,
            "unit": "ms" if timed else "calls"}


def icicle_figure(sdg, profile, highlight: int | None = None):
    """Kernel time aggregated by region, op kind and op; a ``go.Figure``."""
    import plotly.graph_objects as go

    d = icicle_data(sdg, profile)
    colours = []
    for ident in d["ids"]:
        parts = ident.split("/")
        if highlight is not None and highlight in sdg.ops and len(parts) == 3 \
                and parts[2] == f"%{highlight}":
            colours.append(HIGHLIGHT)
        elif len(parts) >= 2:
            kinds = [op for op in sdg.ops.values() if op.kind == parts[1]]
            colours.append(category_colour(kinds[0].category) if kinds else "#eee")
        else:
            colours.append("#f0f0f0")
    fig = go.Figure(go.Icicle(ids=d["ids"], labels=d["labels"], parents=d["parents"],
                              values=d["values"], branchvalues="total",
                              marker=dict(colors=colours), tiling=dict(orientation="v"),
                              hovertemplate=f"%{{label}}: %{{value:.3f}} {d['unit']}"
                                            "<extra></extra>"))
    what = "time (ms)" if d["unit"] == "ms" else "calls (this executor measured no times)"
    fig.update_layout(template=TEMPLATE, title=f"kernel {what} by region, kind and op",
                      height=420, margin=dict(l=10, r=10, t=40, b=10))
    return fig


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
    """Compile time by stage as one stacked horizontal bar; a ``go.Figure``."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for stage, sec in compile_rows(prog):
        fig.add_trace(go.Bar(orientation="h", y=["compile"], x=[sec * 1e3], name=stage,
                             hovertemplate=f"{stage}: %{{x:.2f}} ms<extra></extra>"))
    fig.update_layout(template=TEMPLATE, barmode="stack", height=220,
                      title="compile time by stage (ms)", xaxis_title="ms",
                      margin=dict(l=70, r=10, t=40, b=40), legend=dict(orientation="h"))
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
        self.timeline = self.icicle = None
        if profile is not None:
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


def explore_run(run, kernels=None):
    pv = ProfileView(run.program, run, kernels)
    html = run._repr_html_() + (run.profile._repr_html_() if run.profile is not None else "")
    view = stage_view([pv.widget], html, "tempo-lab-run-view")
    view.profile_view = pv
    return view


def explore_profile(profile):
    """A Profile alone (no program at hand): icicle only."""
    import ipywidgets as W

    slot = FigureSlot(icicle_figure(profile.sdg, profile), "tempo-lab-icicle")
    return stage_view([W.HTML(f"<code>{profile!r}</code>"), slot.widget],
                      profile._repr_html_(), "tempo-lab-profile-view")
