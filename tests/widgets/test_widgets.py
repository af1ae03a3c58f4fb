"""Payload tests of the notebook views, without a browser: what each view would draw (DOT,
SVG, plotly figures, HTML) and that selecting an op reaches every tab of the dashboard."""
import pytest
from rt_helpers import PER_STATEMENT

import tempo_lab as tl
import tempo_lab.svg

W = pytest.importorskip("ipywidgets")
go = pytest.importorskip("plotly.graph_objects")
pytest.importorskip("anywidget")

from tempo_lab.widgets import figures as F  # noqa: E402
from tempo_lab.widgets import graph as G  # noqa: E402


def _prog(executor="auto", steps=4):
    ctx = tl.Context(dims=("b", "t"))
    (b, t), (B, T) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.placeholder((4,), "float32", domain=(b, t), name="x")
        x[b, 0] = tl.ones((4,))
        x[b, t] = x[b, t - 1] * 0.5 + 1.0
        y = x[b, 0:t + 1].sum(axis=0)
        w = x[b, tl.max(0, t - 1):t + 1].mean(axis=0)
    cfg = tl.CompileConfig() if executor == "auto" else tl.CompileConfig(executor=executor)
    return ctx.compile(bounds={B: 2, T: steps}, outputs={"y": y, "w": w}, config=cfg)


def big_program(n_ops=500):
    """A long elementwise chain over (b, t): about ``n_ops`` ops once passes that would shrink
    it are off (and group vectorisation, whose per-point views add a quarter more ops, which dot
    did not lay out in a minute); reference executor and no validation, so no isl work on
    hundreds of ops."""
    ctx = tl.Context(dims=("b", "t"))
    (b, t), (B, T) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.placeholder((4,), "float32", domain=(b, t), name="x")
        x[b, 0] = tl.ones((4,))
        x[b, t] = x[b, t - 1] * 0.5 + 1.0
        y = x
        for k in range(n_ops // 4):
            y = tl.tanh(y * (1.0 + k / 1000)) + x[b, tl.max(0, t - 1)]
    cfg = tl.CompileConfig(executor="reference", validate=False, fuse=False, cse=False,
                           simplify=False, fold_constants=False, vectorise_groups=False)
    return ctx.compile(bounds={B: 2, T: 4}, outputs={"z": y}, config=cfg)


@pytest.fixture(scope="module")
def prog():
    return _prog()


@pytest.fixture(scope="module")
def run(prog):
    return prog.run()


@pytest.fixture
def no_dot(monkeypatch):
    def missing(*a, **k):
        raise FileNotFoundError("dot")

    monkeypatch.setattr(tempo_lab.svg, "_dot", missing)
    monkeypatch.setattr(G, "dot_installed", lambda: False)


def _has_dot():
    return G.svg_of("digraph { a -> b }") is not None


# -- SDG explorer -------------------------------------------------------------------------------
def test_graph_spec_clusters_and_dependence_labels(prog):
    sdg = prog.passes.initial
    spec = G.graph_spec(sdg)
    dot = G.to_dot(spec)
    drawn = {G.region_of(sdg.ops[i]) for i in spec.ops}    # constants are drawn in their readers
    assert dot.count("subgraph cluster_") == len(drawn)
    labels = {label for _, _, label, _ in spec.edges}
    assert any("t - 1" in lab for lab in labels)
    assert any("0:t + 1" in lab for lab in labels)
    assert dot == G.to_dot(G.graph_spec(sdg))  # stable: same ids, same colours
    assert f'id="op{next(iter(sdg.ops))}"' in dot


@pytest.mark.skipif(not _has_dot(), reason="graphviz's dot program is not installed")
def test_sdg_explorer_svg(prog):
    view = prog.sdg.explore()
    ex = view.explorer
    assert ex.graph.svg.count("<svg") == 1 and 'id="op' in ex.graph.svg
    assert "SDG(ops=" in view.static_html and "<svg" in view.static_html
    ex.search.value = "x"
    assert G.MATCH in G.to_dot(ex.spec())


def test_search_filter_and_inspector(prog, run):
    sdg = prog.sdg
    x = next(op.id for op in sdg.ops.values() if op.name == "x")
    assert x in G.matches(sdg, "X")
    spec = G.graph_spec(sdg, kind="merge")
    assert spec.ops == [x] and any("hidden" in h for h in spec.hidden)
    facts = F.op_facts(sdg, x, prog.memory, run.profile, run.bounds)
    assert "x = tl.placeholder" in facts["source"]       # the user's own line
    assert facts["domain"] == "(t)" or facts["domain"] == "(b, t)"
    assert facts["dtype"] == "float32" and "storage" in facts and "bytes" in facts
    assert "calls" in facts["time"]


def test_iteration_space_aggregates_by_group_at_scale():
    import numpy as np

    from tempo_lab.demo import make_weights
    from tempo_lab.examples import unrolled_decoder

    ctx = tl.Context(dims=("t",))
    tokens = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    h = unrolled_decoder(ctx, make_weights(4, 16, 32), tokens, heads=2)
    sch = ctx.compile(bounds={ctx.bounds[0]: 4}, outputs={"y": h}).schedule
    assert len(sch.sdg.ops) > 40
    pts, _, _ = F.iteration_space(sch, {"T": 3})
    groups = {p["group"] for p in pts}
    assert {f"layer{k}" for k in range(4)} <= groups and len(groups) <= 6
    assert sum(len(p["ops"]) for p in pts) == len(F.iteration_space(sch, {"T": 3},
                                                                    aggregate=False)[0])
    title = F.iteration_figure(sch, {"T": 3}).layout.title
    assert "one marker per group" in title.subtitle.text


def test_large_graph_collapses_and_says_what_is_hidden(monkeypatch):
    big = big_program(500)
    sdg = big.sdg
    assert len(sdg.ops) >= 450
    spec = G.graph_spec(sdg)
    assert len(spec.nodes) <= G.VISIBLE
    assert any("collapsed" in h for h in spec.hidden)
    sizes = [n for path, n in spec.sizes.items() if len(path) == 2]
    assert sizes and max(sizes) <= G.CHUNK      # big groups open into runs of CHUNK ops
    view = sdg.explore()
    ex = view.explorer
    assert "Not drawn" in ex.graph.note.value
    ex.search.value = "tanh"          # matches stay visible inside collapsed groups
    assert set(G.matches(sdg, "tanh")) <= set(ex.spec().ops)
    ex.search.value = ""
    spec = ex.spec()
    group = next(n for n in spec.nodes if n.op is None)
    path, before = spec.groups[group.key], len(spec.ops)
    ex.toggle(group.key)                       # what a click on a group node does
    assert len(ex.spec().ops) > before and path in ex.expanded
    ex.toggle(next(k for k, p in ex.spec().groups.items() if p == path))   # collapse again
    assert len(ex.spec().ops) == before
    ex.set_expanded(ex._all_groups())          # everything, drawn by graphviz
    assert set(ex.spec().ops) | G.inlined(sdg) == set(sdg.ops)
    assert ex.graph.svg is not None or not G.dot_installed()
    monkeypatch.setattr(G, "DOT_LIMIT", 100)   # more than graphviz is given: plotly
    ex.refresh()
    assert ex.graph.figure is not None and "plotly layout" in ex.graph.note.value


def test_groups_follow_scopes_and_calls():
    """tl.scope, then the user's functions and the library call, then the domain; the variable
    a library call's result is assigned to names its last op; the inspector shows the stack."""
    import numpy as np

    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    norm = tl.nn.RMSNorm(8)

    def block(x, k):
        with tl.scope(f"layer{k}"):
            normed = norm(norm.init(), x)
            return tl.relu(normed) + x

    with ctx:
        x = tl.source(lambda p: np.full(8, p["t"], np.float32), (8,), np.float32, (t,))
        for k in range(3):
            x = block(x, k)
    prog = ctx.compile(bounds={T: 3}, outputs={"y": x},
                       config=tl.CompileConfig(executor="reference"))
    sdg = prog.passes.initial if prog.passes is not None else prog.sdg
    paths = G.group_paths(sdg)
    named = [op for op in sdg.ops.values() if op.name == "normed"]
    assert len(named) == 3                      # one per call, the call's last op
    # block() is all there is in each layer: the layer's box keeps its name, block() goes;
    # the library call is a scope of its own, named after it (RMSNorm -> rms_norm)
    assert {paths[op.id][:2] for op in named} == {(f"layer{k}", "rms_norm") for k in range(3)}
    assert all(op.scope[-1] == "rms_norm" for op in named)
    facts = F.op_facts(sdg, named[0].id)
    assert "block" in facts["called from"] and facts["scope"] == "layer0/rms_norm"
    exported = sdg.to_dict()["ops"][named[0].id]
    assert exported["stack"][-1]["function"].endswith("block")
    assert exported["scope"] == ["layer0", "rms_norm"]
    spec = G.graph_spec(sdg, expanded=set())
    assert sorted(p[0] for p in spec.groups.values()) == ["layer0", "layer1", "layer2"]
    assert [sdg.ops[i].kind for i in spec.ops] == ["source"]   # a group of one op is the op


def test_graph_views_without_dot_fall_back_to_plotly(prog, no_dot):
    view = prog.sdg.explore()
    panel = view.explorer.graph
    assert panel.svg is None and isinstance(panel.figure, go.Figure)
    ops_trace = panel.figure.data[-1]
    assert sorted(ops_trace.customdata) == sorted(set(prog.sdg.ops) - G.inlined(prog.sdg))
    assert "not installed" in panel.note.value
    assert "SDG(ops=" in view.static_html
    stepper = prog.passes.explore().stepper
    assert stepper.after.figure is not None
    dash = prog.explore().dashboard
    dash.select(next(iter(prog.sdg.ops)))
    assert dash.sdg.graph.figure is not None


def test_a_graph_dot_fails_on_is_drawn_with_plotly(prog, monkeypatch):
    import subprocess

    def fails(*a, **k):
        raise subprocess.CalledProcessError(1, ["dot"], stderr="trouble in init_rank")

    monkeypatch.setattr(tempo_lab.svg, "_dot", fails)
    panel = prog.sdg.explore().explorer.graph
    assert panel.svg is None and panel.figure is not None
    assert "failed on this graph" in panel.note.value


@pytest.mark.skipif(not _has_dot(), reason="graphviz's dot program is not installed")
def test_a_layout_dot_does_not_finish_in_time_is_given_up():
    """dot killed at the time limit: no SVG (the views draw plotly), no hang."""
    import time

    nodes = "".join(f"n{i} -> n{(i * 7 + 3) % 400}; n{i} -> n{(i * 13 + 5) % 400};"
                    for i in range(400))
    t0 = time.perf_counter()
    assert G.svg_of(f"digraph {{ rankdir=TB; {nodes} }}", timeout=0.05) is None
    assert time.perf_counter() - t0 < 5


def test_plotly_layout_opens_groups_on_click(no_dot):
    import json

    ex = big_program(200).sdg.explore().explorer
    ops_trace = ex.graph.figure.data[-1]
    k = next(j for j, c in enumerate(ops_trace.customdata) if G.group_of(c))
    before = len(ex.spec().ops)
    chart = ex.graph._slot.widget      # what the browser sends on a click on that marker
    chart._on_msg(chart, {"event": "click", "points": [
        {"curve": len(ex.graph.figure.data) - 1, "point": k, "x": 0, "y": 0}]}, [])
    assert len(ex.spec().ops) > before
    # the figure travels in the widget's opening state, not in messages after it
    assert len(json.loads(chart.figure_json)["data"]) == len(ex.graph.figure.data)


def test_layered_layout_handles_recurrences(prog):
    spec = G.graph_spec(prog.passes.initial)
    pos = G.layered_positions(spec)
    assert set(pos) == {n.key for n in spec.nodes}
    fig = G.graph_figure(spec)
    assert fig.data[1].text  # dependence expressions drawn


# -- pass stepper -------------------------------------------------------------------------------
def test_pass_rows_and_marks(prog):
    rows = F.pass_rows(prog.passes)
    assert [r["pass"] for r in rows] == [r.name for r in prog.passes.records]
    fuse = next(r for r in prog.passes.records if r.name == "fuse")
    before, after = F.pass_marks(fuse)
    assert set(before.values()) <= {"erased", "rewritten"}
    assert sum(1 for v in before.values() if v == "erased") == fuse.count("erased")
    table = F.pass_table_html(prog.passes, 0)
    assert table.count("<tr") == len(rows) + 1
    st = prog.passes.explore().stepper
    st.slider.value = len(rows) - 1
    assert "fuse" in st.title.value


# -- schedule -----------------------------------------------------------------------------------
def test_schedule_payloads(prog):
    sch = prog.schedule
    tree = F.tree_html(sch)
    assert tree.count("<details") >= 2 and "band" in tree and "x" in tree
    x = next(op.id for op in prog.sdg.ops.values() if op.name == "x")
    assert F.code_html(sch, x).count("<mark") >= 1
    pts, arrows, (_, yname) = F.iteration_space(sch, {"B": 2, "T": 3})
    from tempo_lab.schedule import Exec, walk

    n = sum(1 for node, _ in walk(sch.ast, {"B": 2, "T": 3}) if isinstance(node, Exec))
    assert len(pts) == n and arrows     # t - 1 makes loop-carried arrows
    assert [p["order"] for p in pts] == sorted(p["order"] for p in pts)
    fig = F.iteration_figure(sch, {"B": 2, "T": 3}, highlight=x)
    assert len(fig.data[1].x) == n and fig.layout.annotations
    # b is vectorised: an axis of values (bars), not a row of the plot; constants run once,
    # in a column outside the loops, not at t = 0
    assert yname == "" and "vectorised over b" in fig.layout.title.subtitle.text
    bars = [p for p in pts if p["lanes"] == ("b", 2)]
    assert bars and all(sch.sdg.ops[p["op"]].domain for p in bars)
    once = [p for p in pts if not sch.sdg.ops[p["op"]].domain]
    assert once and all(p["xy"][0] < -1 for p in once) and "once" in fig.layout.xaxis.ticktext
    assert "tempo-lab-tree-mark" in F.tree_html(sch, x)
    view = sch.explore(bounds=prog.bounds).schedule_view
    view.sliders["T"].value = 2
    assert view.plot.figure.layout.title.text.startswith("iteration space")
    assert "T=2" in view.plot.figure.layout.title.subtitle.text


# -- memory -------------------------------------------------------------------------------------
def test_schedule_tree_hides_constants_and_names_ops_from_the_source():
    """The isl schedule tree, as the schedule view opens it: constants are left out (of its
    filters and band members) until *show constants* is ticked, and statements are named by
    their ops' names from the source and ids (``h_in · %7``, the weights ``wq · %1``)."""
    import re

    import numpy as np

    from tempo_lab.demo import decoder, make_weights
    from tempo_lab.widgets.schedule_view import _constant

    ctx = tl.Context(dims=("n", "t"))
    (_, t), (N, T) = ctx.dims, ctx.bounds
    tokens = np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32)
    h = decoder(ctx, make_weights(2, 16, 32), tokens, heads=2)
    with ctx:
        y = h[N - 1, t]
    prog = ctx.compile(bounds={N: 2, T: 8}, outputs={"y": y})
    sdg = prog.sdg
    consts = {i for i in sdg.ops if _constant(sdg, i)}
    assert consts

    def named(text: str) -> set[int]:
        return {int(m) for m in re.findall(r"%(\d+)", text)}

    view = prog.schedule.explore(bounds=prog.bounds).schedule_view
    assert not view.constants.value
    assert named(view.tree.value) and not named(view.tree.value) & consts
    for label in ("h_in · %7", "wq · %1", "emb · %0"):
        assert label in view.tree.value, label
    view.constants.value = True
    assert consts <= named(view.tree.value)


def test_memory_figure_marks_peaks(prog, run):
    measured = prog.on("interpreter").run().profile     # bytes after every statement
    fig = F.memory_figure(prog.memory, measured)
    names = [t.name for t in fig.data]
    assert "predicted bytes" in names and "measured bytes" in names
    peak = next(t for t in fig.data if t.name == "predicted peak")
    assert peak.y[0] == prog.memory.peak_bytes
    bars = sum(len(t.y) for t in fig.data if t.type == "bar")
    assert bars == len(prog.memory.storages)
    both = F.compare_memory({"a": prog.memory, "b": prog.memory})
    assert sum(1 for t in both.data if t.name == "predicted bytes") == 2


def test_what_if_bounds_replan_without_compiling(prog):
    """The memory view's bound sliders re-simulate the compiled plan at other bounds: equal to
    the plan at its own bounds and to a compile at others (same passes' decisions here)."""
    from tempo_lab.memory.plan import replan

    same = replan(prog.memory, prog.schedule, dict(prog.bounds))
    assert same.peak_bytes == prog.memory.peak_bytes and same.timeline == prog.memory.timeline
    compiled = _prog(steps=8).memory
    est = replan(prog.memory, prog.schedule, {**prog.bounds, "T": 8})
    assert (est.peak_bytes, est.n_steps) == (compiled.peak_bytes, compiled.n_steps)
    mem = prog.explore().dashboard.open("Memory")
    assert list(mem.sliders) == ["T"]          # b is vectorised: its size is in the shapes
    mem.sliders["T"].value = 10 ** 6
    assert "estimate at B=2, T=1000000" in mem.what_if.value
    assert "not compiled" in mem.plot.figure.layout.title.text


def test_a_sampled_memory_timeline_is_drawn_at_its_steps():
    """A long run's plan holds a sample of its steps (the first and last iterations of each
    stretch): the curve is drawn at the steps they are, on the lifetimes' axis, so it spans
    the run (it stopped a third of the way along, drawn at its sample's indices), and the
    summary counts every step."""
    from tempo_lab.widgets import memory_view as MV

    prog = _prog("interpreter", steps=3000)
    plan = prog.memory
    assert plan.sampled, (len(plan.timeline), plan.n_steps)
    fig = MV.memory_figure(plan)
    curve = next(t for t in fig.data if t.name == "predicted bytes")
    assert list(curve.x) == list(plan.steps) and curve.x[-1] > 0.9 * plan.n_steps
    assert max(e for _, e in plan.lifetimes.values()) < plan.n_steps
    star = next(t for t in fig.data if t.name == "predicted peak")
    assert star.x[0] in plan.steps and star.y[0] == plan.peak_bytes
    text = MV.MemoryView(plan, None, prog).summary.value
    assert f"of {plan.n_steps}" in text and "samples" in text, text


def test_measuring_per_step_says_how_far_the_run_is(prog, monkeypatch):
    """*measure per step* runs in a thread of its own and says how far the run is, its
    outermost loops' step of all ("step 2 of 4"), not only its seconds, and how many steps
    it measured."""
    import re

    from tempo_lab import progress
    from tempo_lab.widgets import memory_view as MV

    monkeypatch.setattr(progress, "DELAY_S", 0.0)     # the run reports from its first step
    view = MV.MemoryView(prog.memory, None, prog)
    seen = []
    view.measure_status.observe(lambda change: seen.append(change.new), "value")
    view.measure.click()
    view.wait()
    assert any(re.search(r"step \d+ of \d+", s) for s in seen), seen
    assert re.fullmatch(r"measured in [\d.]+ s \(\d+ steps\)", view.measure_status.value), \
        view.measure_status.value


def test_progress_listening_hears_a_bar_in_its_thread_only(monkeypatch):
    """``progress.listening`` hears the bars made in its thread, shown or not."""
    import threading

    from tempo_lab import progress

    monkeypatch.setattr(tl.config, "progress", False)
    heard = []
    with progress.listening(lambda n, total, unit: heard.append((n, total, unit))):
        bar = progress.bar(3, "run", "step")
        bar.update()
        bar.update(2)
        other = threading.Thread(target=lambda: progress.bar(5, "x", "step").update())
        other.start()
        other.join()
    progress.bar(2, "after", "step").update()
    assert heard == [(1, 3, "step"), (3, 3, "step")]


def test_memory_view_is_honest_about_xla():
    """XLA allocates its stores for the whole run: one level, not a curve over the steps; the
    view says so, shows XLA's own memory analysis and measures per step on request."""
    prog = _prog("xla")
    dash = prog.explore().dashboard
    panel = dash.open("Profile")
    panel.button.click()
    panel.wait()
    view = dash.open("Memory")
    names = [t.name for t in view.plot.figure.data]
    assert "xla static stores" in names and "measured peak" not in names
    assert "whole run" in view.summary.value and "temp" in view.summary.value
    assert dash.run.profile.xla_memory and "XLA temp" in dash.run.profile.pretty()
    view.measure.click()  # runs in a thread of its own: the notebook stays usable
    assert view.measure.disabled and view.worker is not None
    view.wait()
    assert "measured in" in view.measure_status.value, view.measure_status.value
    names = [t.name for t in view.plot.figure.data]
    run_on = tl.executors.timeline_backend()  # an executor that records bytes per statement
    assert tl.executors.CAPS[run_on].store_timeline
    assert "measured bytes" in names and f"{run_on} run" in view.summary.value
    assert max(view.profile.timeline) == prog.memory.peak_bytes


# -- profile ------------------------------------------------------------------------------------
def test_profile_payloads(prog, run):
    d = F.icicle_data(prog.sdg, run.profile)
    total = (sum(run.profile.seconds.values()) * 1e3 if d["unit"] == "ms"
             else sum(run.profile.calls.values()))
    assert d["values"][0] == pytest.approx(total)
    assert len(d["ids"]) == len(set(d["ids"]))
    kernels = F.estimated_kernels(prog.schedule, run.profile, run.bounds)
    assert len(kernels) == sum(run.profile.calls.values())
    fig = F.timeline_figure(prog.sdg, kernels, estimated=True)
    assert sum(len(t.x) for t in fig.data) == len(kernels)
    rows = dict(F.compile_rows(prog))
    assert "schedule" in rows and any(k.startswith("pass ") for k in rows)
    fig = F.compile_figure(prog)
    assert len(fig.data) == len(rows)
    colours = [t.marker.color for t in fig.data]
    assert len(set(colours)) == len(colours)          # a colour per stage, none reused
    assert fig.layout.legend.orientation == "v"       # beside the bar, not over its axis


@pytest.mark.executors(PER_STATEMENT, reason="kernel events are per statement")
def test_recorded_run_times_every_op(executor):
    prog = _prog(executor)
    run, kernels = F.recorded_run(prog)
    assert kernels is not None and len(kernels) == sum(run.profile.calls.values())
    assert all(k.end >= k.start for k in kernels)
    assert set(run.profile.seconds) == set(run.profile.calls)   # the graph can colour by time
    assert not hasattr(prog.executable.__dict__, "_exec")


# -- dashboard ----------------------------------------------------------------------------------
def test_dashboard_tabs_and_linked_selection(prog, run):
    view = prog.explore(run=run)
    dash = view.dashboard
    titles = [dash.tabs.get_title(k) for k in range(len(dash.tabs.children))]
    assert titles == ["Program", "SDG", "Passes", "Schedule", "Memory", "Profile"]
    assert dash.views == {}                     # tabs are built when first shown
    x = next(op.id for op in prog.sdg.ops.values() if op.name == "x")
    dash.picker.value = x
    assert dash.sdg.selected == x and "x = tl.placeholder" in dash.sdg.inspector.value
    assert dash.sdg.graph.canvas is None or dash.sdg.graph.canvas.selected == x
    dash.tabs.selected_index = 3
    assert "<mark" in dash.views["Schedule"].code.value
    mem = dash.open("Memory").plot.figure
    assert any(3 in (t.marker.line.width or ()) for t in mem.data if t.type == "bar")
    tl_fig = dash.open("Profile").timeline.figure
    assert any("#d62728" in t.marker.color for t in tl_fig.data)
    dash.picker.value = -1
    assert dash.sdg.selected is None


def test_dashboard_runs_only_on_request():
    prog = _prog("interpreter")
    calls = []
    run = prog.run
    prog.run = lambda *a, **k: calls.append(a or k) or run(*a, **k)
    dash = prog.explore().dashboard
    panel = dash.open("Profile")
    assert not calls and "run and profile" == panel.button.description
    dash.select(next(iter(prog.sdg.ops)))
    old_sdg = dash.sdg
    panel.button.click()                        # runs in the background: the kernel is free
    panel.wait()
    assert len(calls) == 2                      # a warm-up run, then the recorded one
    assert dash.run is not None and dash.views["Profile"].timeline is not None
    assert "calls" in dash.sdg.inspector.value  # the SDG tab now shows measured time
    # the views the run replaced are closed, their widgets no longer kept by ipywidgets
    assert dash.sdg is not old_sdg and dash.sdg.widget.comm is not None
    assert old_sdg.widget.comm is None and old_sdg.graph.canvas.comm is None
    assert panel.widget.comm is None and panel.button.comm is None


def test_closing_a_view_closes_every_widget_it_made():
    """``view.close()`` on what ``explore()`` returned closes every widget made for it (a
    dashboard with every tab opened and a profiling run included): a notebook that explores
    many programs gives their memory back. Only plotly.js's one shared loader stays."""
    import gc
    import weakref

    import ipywidgets

    prog = _prog("interpreter")
    registry = ipywidgets.widgets.widget._instances
    for stage in (prog, prog.sdg, prog.passes, prog.schedule, prog.memory):
        before = set(registry)
        view = stage.explore()
        dash = getattr(view, "dashboard", None)
        if dash is not None:
            for name in ("SDG", "Passes", "Schedule", "Memory", "Profile"):
                dash.open(name)
            dash.open("Profile").button.click()
            dash.open("Profile").wait()
            dash.open("Memory")
        assert len(set(registry) - before) > 5
        views = [weakref.ref(v) for v in (dash.views if dash else {}).values()]
        view.close()
        left = [type(registry[k]).__name__ for k in set(registry) - before]
        assert set(left) <= {"PlotlyJS"}, (type(stage).__name__, left)
        del view, dash
        gc.collect()   # and nothing else keeps them (anywidget kept every widget of a path)
        assert not [v() for v in views if v() is not None]


def test_reference_program_dashboard():
    dash = _prog("reference").explore().dashboard
    panel = dash.open("Profile")
    panel.button.click()
    panel.wait()
    assert "reference executor keeps no profile" in dash.views["Profile"].widget \
        .children[0].value


def test_static_html_for_renderers_without_a_kernel(prog, run):
    for stage in (prog, prog.sdg, prog.passes, prog.schedule, prog.memory, run, prog.trace):
        bundle = stage.explore()._repr_mimebundle_()
        assert "application/vnd.jupyter.widget-view+json" in bundle
        assert repr(stage).split("(")[0] in bundle["text/html"]


# -- the graph at a model's size: less noise, stable groups, search ------------------------------
@pytest.fixture(scope="module")
def decoder16():
    """16 layers written one by one, one tl.scope each (673 traced ops, 307 after the passes)."""
    import numpy as np

    from tempo_lab.demo import make_weights
    from tempo_lab.examples import unrolled_decoder

    ctx = tl.Context(dims=("t",))
    tokens = np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32)
    h = unrolled_decoder(ctx, make_weights(16, 16, 32), tokens, heads=2)
    return ctx.compile(bounds={ctx.bounds[0]: 8}, outputs={"y": h})


def test_constants_are_drawn_inside_their_readers(decoder16):
    """A scalar shared by every layer draws no edge into each; its value is in the labels of
    the ops that read it, and it is drawn as a node again when selected."""
    sdg = decoder16.sdg
    readers: dict[int, int] = {}
    for e in sdg.edges:
        readers[e.src] = readers.get(e.src, 0) + 1
    shared = max((i for i, op in sdg.ops.items() if op.kind == "const"), key=readers.get)
    assert readers[shared] >= 16 and sdg.ops[shared].type.shape == ()
    everything = {p[:j + 1] for p in G.group_paths(sdg).values() for j in range(len(p))}
    spec = G.graph_spec(sdg, expanded=everything)
    assert shared not in spec.ops and f"op{shared}" not in {s for s, *_ in spec.edges}
    assert sum(f"◦ {sdg.ops[shared].label} = " in n.label for n in spec.nodes) >= 16
    assert any("constants written inside" in h for h in spec.hidden)
    assert shared in G.graph_spec(sdg, expanded=everything, keep=(shared,)).ops
    # the layers are a chain, not side by side: the picture is taller than wide
    svg = G.svg_of(G.to_dot(spec))
    if svg is not None:
        import re

        w, h = (float(v) for v in re.search(r'viewBox="[\d.-]+ [\d.-]+ ([\d.]+) ([\d.]+)"',
                                             svg).groups())
        assert h > 3 * w


def test_groups_open_in_program_order_with_stable_keys(decoder16):
    sdg = decoder16.sdg
    spec = G.graph_spec(sdg)
    layers = [n.label.split(":")[0] for n in spec.nodes if n.op is None]
    assert layers == [f"layer{k}" for k in range(16)]        # layer2 before layer10
    key = next(k for k, p in spec.groups.items() if p[0] == "layer11")
    opened = G.graph_spec(sdg, expanded=set(spec.groups.values()) | {spec.groups[key]})
    assert opened.groups[key] == spec.groups[key]            # the same key once it is open
    assert f'subgraph cluster_{key} ' in G.to_dot(opened)
    dot = G.to_dot(opened)
    assert dot.index('id="g') < dot.index(f'cluster_{key} ')  # earlier layers drawn before


def test_search_takes_several_words_best_first(decoder16):
    sdg = decoder16.sdg
    hits = G.matches(sdg, "layer11 softmax")
    assert hits and sdg.ops[hits[0]].kind == "softmax"
    assert all("layer11" in G.group_paths(sdg)[i] for i in hits)
    assert G.matches(sdg, "LAYER11   Softmax") == hits
    assert G.matches(sdg, "layer11 no-such-thing") == []
    consts = [i for i in G.matches(sdg, "layer3") if sdg.ops[i].kind == "const"]
    assert consts and G.matches(sdg, "layer3")[-len(consts):] == consts   # constants last


def test_wrapper_groups_and_comprehensions_fold():
    """A generator expression is not a group of its own; a group that is all of its parent
    is dropped, the parent keeps its name."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds

    def mix(xs):
        return sum(tl.tanh(x) for x in xs)

    def model(x):
        with tl.scope("body"):
            return mix([x, x * 2.0])

    with ctx:
        x = tl.placeholder((4,), domain=(t,), name="x")
        x[0] = tl.ones((4,))
        x[t] = x[t - 1] * 0.5
        y = model(x)
    sdg = ctx.compile(bounds={T: 3}, outputs={"y": y},
                      config=tl.CompileConfig(executor="reference")).passes.initial
    paths = G.group_paths(sdg)
    tanh = [paths[op.id] for op in sdg.ops.values() if op.kind == "tanh"]
    assert tanh and all(p[:2] == ("body", "mix()") for p in tanh), tanh
    assert not any("<genexpr>" in part for p in paths.values() for part in p)


def test_notebook_locations_read_as_cells(monkeypatch):
    """An op written in a notebook cell is placed as IPython writes it in tracebacks."""
    import IPython

    from tempo_lab.errors import Location

    class Compiler:
        def format_code_name(self, name):
            return ("Cell", "In[12]") if name.endswith("89075343.py") else None

    class Shell:
        compile = Compiler()

    monkeypatch.setattr(IPython, "get_ipython", lambda: Shell())
    assert Location("/tmp/ipykernel_1/89075343.py", 3).place == "cell [12], line 3"
    assert Location("/home/me/model.py", 7).place == "model.py:7"
    assert str(Location("/tmp/ipykernel_1/89075343.py", 3)) == "/tmp/ipykernel_1/89075343.py:3"


def test_opening_a_group_opens_what_is_alone_inside(decoder16):
    """A layer holds one domain (its constants are drawn inside their readers): opening it
    shows its ops, not a box around one closed box."""
    ex = decoder16.sdg.explore().explorer
    ex.fold.value = False          # the layers, alike, are folded into one box by default
    spec = ex.spec()
    key = next(k for k, p in spec.groups.items() if p == ("layer3",))
    before = len(spec.ops)
    ex.toggle(key)
    opened = ex.spec()
    assert len(opened.ops) >= before + 10
    assert not any(n.op is None and opened.groups[n.key][0] == "layer3" for n in opened.nodes)


def test_fold_repeats_in_the_explorer(decoder16):
    """*fold repeats* is ticked where layers repeat and draws them as one box; selecting an op
    of a folded layer unticks it, so that the op is drawn; ticked again, the op stays selected
    (the inspector shows it) and the layers fold."""
    ex = decoder16.sdg.explore().explorer
    assert ex.fold.value and ex.fold.layout.display != "none"
    assert list(ex.spec().titles.values()) == ["layer0…layer15 ×16"]
    op = next(i for i, o in decoder16.sdg.ops.items() if o.scope == ("layer11",)
              and o.kind not in ("const", "dimval"))
    ex.select(op)
    assert not ex.fold.value and f"op{op}" in {n.key for n in ex.drawn.nodes}
    ex.fold.value = True
    assert ex.selected == op and ex.drawn.titles and "layer11" in ex.inspector.value


def test_a_folded_run_marks_an_output_of_a_later_member(decoder16):
    """The program's output ``y`` is made in layer15, the last of the sixteen layers folded
    into ``layer0…layer15 ×16``: the folded box says it holds it (``→ y (layer15)``), as
    layer15's own box does unfolded (``→ y``) and the op's label does when drawn; opened, the
    op drawn for it (layer0's op at its place) says it, once. Before, no box said it."""
    sdg = decoder16.sdg
    paths = G.group_paths(sdg)
    (name, out), = sdg.outputs.items()
    assert name == "y" and paths[out][0] == "layer15"

    def marked(spec):
        return [n for n in spec.nodes if "→ y" in n.label]

    every = {p[:j + 1] for p in paths.values() for j in range(len(p))}
    unfolded = marked(G.graph_spec(sdg, expanded=set()))
    assert [n.label.split(":")[0] for n in unfolded] == ["layer15"]
    assert unfolded[0].label.endswith("\n→ y")
    shown = marked(G.graph_spec(sdg, expanded=every))
    assert [n.op for n in shown] == [out] and shown[0].label.endswith("\n→ y")

    for expanded in (set(), G.default_expanded(sdg)):    # the folded box closed
        folded = marked(G.graph_spec(sdg, expanded=expanded, fold=True))
        assert len(folded) == 1 and folded[0].op is None
        assert folded[0].label.startswith("layer0…layer15 ×16: ")
        assert folded[0].label.endswith("\n→ y (layer15)")
    for expanded in (G.open_group(sdg, G.default_expanded(sdg), ("layer0",)), every):
        spec = G.graph_spec(sdg, expanded=expanded, fold=True)
        assert spec.titles, "the layers are folded"
        ops = marked(spec)
        assert len(ops) == 1 and ops[0].op is not None and paths[ops[0].op][0] == "layer0"
        assert ops[0].label.endswith("\n→ y (layer15)")
        # the folded box's room (its closed label) holds the mark too, so that opening and
        # closing it moves nothing
        assert spec.frame.closed[("layer0",)].endswith("\n→ y (layer15)")


def test_pass_stepper_at_a_model_size(decoder16):
    """Why-not notes grouped by reason with counts and the layers held back; rows that step
    to a pass; the pass's doc without reST markup; before and after grouped alike."""
    trace = decoder16.passes
    tile = next(r for r in trace.records if r.name == "tile")
    notes = F.grouped_notes(tile)
    assert sum(e["count"] for e in notes) == sum(ev.kind == "note" for ev in tile.events)
    assert notes[0]["count"] >= 16 and not notes[0]["reason"].startswith("%")
    assert notes[0]["groups"][:2] == ["layer0", "layer1"] and len(notes[0]["groups"]) == 16
    text = F.notes_html(tile)
    assert text.count("<li>") == len(notes) and "layer15 (16 groups)" in text
    assert F.rst_html("use ``tile_block`` or :class:`CompileConfig`") == \
        "use <code>tile_block</code> or <code>CompileConfig</code>"
    st = trace.explore().stepper
    k = [r.name for r in trace.records].index("tile")
    st.rows.value = k                              # a click on the tile row
    assert st.slider.value == k and "tile" in st.title.value and "``" not in st.title.value
    fuse = [r.name for r in trace.records].index("fuse")
    st.rows.value = fuse                           # fuse merges ops, the layers stay
    tops = [{p[0] for p in panel.spec.groups.values()} for panel in (st.before, st.after)]
    assert tops[0] == tops[1] and {f"layer{k}" for k in range(16)} <= tops[0]


@pytest.mark.skipif(not tempo_lab.svg.dot_installed(), reason="graphviz's dot is not installed")
def test_pass_diff_places_an_op_alike_on_both_sides(decoder16):
    """Before and after a pass are placed by one layout (of the two graphs together): every
    op and group drawn on both sides has the same box on both, with the default groups open
    (those holding a change) and with every group open; every node of either side is drawn
    (erased constants too); erased ops are drawn only before, created ones only after; groups
    without a change start closed; both sides open on the first change."""
    from tempo_lab.widgets import layout as L
    from tempo_lab.widgets import pass_view as P

    checked = 0
    for r in decoder16.passes.records:
        if not any(ev.kind in ("created", "erased", "replaced") for ev in r.events):
            continue
        before, after, opened = P.diff_specs(r)
        marks = {**P.pass_marks(r)[0], **P.pass_marks(r)[1]}
        paths = G.group_paths(P.Union(r.before, r.after))
        assert opened == P.changed_groups(paths, marks)
        every = {p[:j + 1] for p in paths.values() for j in range(len(p))}
        assert every - opened                   # something is unchanged, and closed
        for expanded in (None, every):
            b, a, _ = P.diff_specs(r, expanded)
            lb, la = L.layout(b).boxes(), L.layout(a).boxes()
            assert {n.key for n in b.nodes} <= set(lb) and {n.key for n in a.nodes} <= set(la)
            common = set(lb) & set(la)
            assert sum(k.startswith("op") for k in common) >= 1
            for k in common:
                assert lb[k] == la[k], (r.name, k)
                checked += 1
            erased = {i for i in r.before.ops if i not in r.after.ops}
            created = {i for i in r.after.ops if i not in r.before.ops}
            assert not {n.op for n in a.nodes} & erased
            assert not {n.op for n in b.nodes} & created
    assert checked >= 50
    st = decoder16.passes.explore().stepper
    st.rows.value = [r.name for r in decoder16.passes.records].index("cse")
    assert len(st.before.canvas.focus) == 4 and st.before.canvas.focus == st.after.canvas.focus
    cse = decoder16.passes.records[st.slider.value]
    erased = {i for i in cse.before.ops if i not in cse.after.ops}
    found = {row[0] for row in st.after.canvas.index}      # the search finds both sides' ops
    assert erased and erased <= found and set(cse.after.ops) <= found


def test_a_profiling_run_keeps_the_colouring_and_the_open_groups():
    """The SDG tab is rebuilt with the run's data: the colouring chosen before stays chosen
    (a run used to reset it to op category), and so do the groups that were open."""
    prog = _prog("interpreter")
    dash = prog.explore().dashboard
    view = dash.open("SDG")
    view.colour.value = "bytes"
    view.set_expanded(set())
    dash.profile()
    view = dash.views["SDG"]
    assert view.colour.value == "bytes" and view.expanded == set()
    assert "time" in {value for _, value in view.colour.options}


def test_run_and_profile_leaves_the_kernel_free():
    """The profile tab's button returns at once; the run's steps show in the tab as it goes,
    and a run that fails says so there (a thread's exception reaches no cell)."""
    import threading
    import time

    prog = _prog("xla")
    gate, run = threading.Event(), prog.run
    prog.run = lambda *a, **k: gate.wait(10) and run(*a, **k)
    panel = prog.explore().dashboard.open("Profile")
    start = time.perf_counter()
    panel.button.click()
    assert time.perf_counter() - start < 1.0 and panel.worker.is_alive()
    assert "step 1 of 3: warm-up run" in panel.status.value and panel.button.disabled
    gate.set()
    panel.wait(60)
    assert panel.dash.run is not None and "Profile" in panel.dash.views

    def broken(*a, **k):
        raise RuntimeError("device lost")

    prog.run = broken
    panel = prog.explore().dashboard.open("Profile")
    panel.button.click()
    panel.wait(60)
    assert "the run failed" in panel.status.value and "device lost" in panel.status.value
    assert not panel.button.disabled


def test_every_op_has_a_time_or_says_where_it_went():
    """On XLA an op has measured time, or the inspector names the fused kernel it ran in and
    the op that kernel's time is counted under; only constants and layout ops XLA folded into
    their readers have none, and say so."""
    import numpy as np

    from tempo_lab.demo import make_weights
    from tempo_lab.examples import unrolled_decoder
    from tempo_lab.widgets.inspector import time_fact

    ctx = tl.Context(dims=("t",))
    tokens = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    h = unrolled_decoder(ctx, make_weights(3, 16, 32), tokens, heads=2)
    prog = ctx.compile(bounds={ctx.bounds[0]: 4}, outputs={"y": h})
    run, _ = F.recorded_run(prog)
    p, sdg = run.profile, prog.sdg
    assert p.synced and p.fused
    untimed = [i for i in p.calls if i not in p.seconds and i not in p.fused]
    assert {sdg.ops[i].category for i in untimed} <= {"source", "layout"}
    kernel, root = next(iter(p.fused.values()))
    assert root in p.seconds and root not in p.fused
    facts = {i: time_fact(sdg, p, i) for i in p.calls}
    assert all(facts.values())
    fused = next(i for i in p.fused)
    assert "fused kernel" in facts[fused] and sdg.ops[p.fused[fused][1]].label in facts[fused]


def test_hostile_names_reach_the_views_escaped(tmp_path):
    """Names and scopes a user gives reach the graph (clusters, constants written inside
    their readers, tooltips), the legend, the search index, the pass notes, the inspector and
    the exported page escaped: graphviz accepts the DOT and no page has a live tag."""
    import json

    import numpy as np

    hostile = ['q"uote', "new\nline", "<script>alert(1)</script>", "back\\slash",
               "uni\u00e9\u2603", 'b\\"x\nz']
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    outs = {}
    with ctx:
        for k, name in enumerate(hostile):
            with tl.scope(name):
                c = tl.constant(np.float32(k + 1))
                x = tl.placeholder((), "float32", domain=(t,), name=name)
                x[0] = tl.zeros(())
                x[t] = x[t - 1] + c
                outs[name] = x
    prog = ctx.compile(bounds={T: 3}, outputs=outs)
    sdg = prog.sdg
    everything = {p[:j + 1] for p in G.group_paths(sdg).values() for j in range(len(p))}
    opened = G.graph_spec(sdg, expanded=everything, search="script")
    assert any("◦" in n.label for n in opened.nodes)        # constants inside their readers
    assert any(p[0] == hostile[2] for p in opened.groups.values())     # a scope as a cluster
    for spec in (G.graph_spec(sdg), opened):
        svg = G.svg_of(G.to_dot(spec))
        assert svg is not None or not G.dot_installed()
        for text in (svg or "", G.legend_html(spec), G.hidden_html(spec)):
            assert "<script>" not in text
    assert json.loads(json.dumps(G.search_rows(sdg)))
    assert G.matches(sdg, "<script>alert(1)</script>")
    for record in prog.passes.records:
        assert "<script>" not in F.notes_html(record)
    view = prog.explore()
    dash = view.dashboard
    dash.select(next(i for i, op in sdg.ops.items() if op.name == hostile[2]))
    assert "<script>" not in dash.sdg.inspector.value
    page = dash.export(tmp_path / "hostile.html").read_text()
    assert "<script>alert(1)</script>" not in page


def _controlled_program():
    """Names with control characters (a NUL, a bell, an escape sequence, DEL, a C1 control, a
    tab) on a placeholder, a scope and an output."""
    names = ["nul\x00byte", "bell\x07", "esc\x1b[31m", "del\x7f", "next\x85line", "tab\tx"]
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    outs = {}
    with ctx:
        for name in names:
            with tl.scope(name):
                x = tl.placeholder((), "float32", domain=(t,), name=name)
                x[0] = tl.zeros(())
                x[t] = x[t - 1] + 1.0
                outs[name] = x
    return ctx.compile(bounds={T: 3}, outputs=outs, config=tl.CompileConfig(
        executor="reference"))


def test_control_characters_in_names_are_shown_as_symbols_in_dot():
    import re

    from tempo_lab.ir.sdg import dot_quote

    assert dot_quote("a\x00b\x07\x1b\x7f\x85\tc") == "a\u2400b\u2407\u241b\u2421\ufffd\tc"
    prog = _controlled_program()
    spec = G.graph_spec(prog.sdg, expanded={p for p in G.group_paths(prog.sdg).values()})
    for dot in (prog.sdg.to_dot(), G.to_dot(spec)):
        assert "\u2400" in dot and not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f]", dot)


@pytest.mark.skipif(not _has_dot(), reason="graphviz's dot program is not installed")
def test_a_nul_in_a_name_keeps_the_dot_valid_and_the_exported_graph(tmp_path):
    """A NUL in an op name made ``to_dot()`` invalid (graphviz stops reading there) and the
    exported dashboard dropped its graph without a word: dot accepts both DOT texts and the
    page has the graph canvas."""
    from tempo_lab.widgets.export import save_html

    prog = _controlled_program()
    spec = G.graph_spec(prog.sdg, expanded={p for p in G.group_paths(prog.sdg).values()})
    for dot in (prog.sdg.to_dot(), G.to_dot(spec)):
        assert "<svg" in tempo_lab.svg._dot(dot, 60)      # raises if dot rejects it
    page = save_html(prog, tmp_path / "controls.html").read_text(encoding="utf-8")
    assert "tl-sdg-canvas" in page and "nul\u2400byte" in page
    assert page.index("tempo-lab-legend") < page.index("tl-sdg-canvas")   # the legend too


def test_an_exported_dashboard_without_dot_draws_its_graph_with_plotly(prog, no_dot):
    from tempo_lab.widgets.export import dashboard_html

    page = dashboard_html(prog)
    assert "tl-sdg-canvas" not in page and "is not installed" in page
    assert "plotly layout instead" in page and "Plotly.newPlot" in page


# -- costs by scope -----------------------------------------------------------------------------
def _fake_profile(sdg, per_op=1e-6, sessions=()):
    """A profile as an XLA run leaves it, without running: every op called once, ``per_op``
    seconds each (a callable: of the op id)."""
    from tempo_lab.runtime.profile import Profile

    sec = per_op if callable(per_op) else (lambda i: per_op)
    return Profile(sdg=sdg, calls={i: 1 for i in sdg.ops}, seconds={i: sec(i) for i in sdg.ops},
                   synced=True, executor="xla", sessions=list(sessions))


def test_profile_by_scope_lists_the_16_layers_in_program_order(decoder16):
    """The scope chart has one bar per layer, layer2 before layer10, each the sum of its ops'
    times; the icicle goes region -> scope -> op; both are built well within 2 s."""
    import time

    from tempo_lab.widgets import costs
    from tempo_lab.widgets import profile_view as PV
    from tempo_lab.widgets.palette import region_of

    sdg = decoder16.sdg
    profile = _fake_profile(sdg, lambda i: 1e-6 * (1 + i % 3))
    start = time.perf_counter()
    fig = PV.scope_figure(sdg, profile)
    fig.to_json()
    icicle = PV.icicle_figure(sdg, profile)
    icicle.to_json()
    assert time.perf_counter() - start < 2.0
    layers = [f"layer{k}" for k in range(16)]
    c = costs.scope_costs(sdg, profile)
    assert [r["scope"] for r in c["rows"] if r["scope"] != costs.NO_SCOPE] == layers
    assert list(fig.layout.xaxis.categoryarray)[-16:] == layers
    for r in c["rows"]:
        want = sum(1e-3 * (1 + i % 3) for i, op in sdg.ops.items()
                   if costs.top_label(op.scope) == r["scope"])
        assert r["value"] == pytest.approx(want)
    assert sum(fig.data[0].y) == pytest.approx(c["total"])
    assert "measured device time" in fig.layout.title.subtitle.text
    d = PV.icicle_data(sdg, profile)
    parent = dict(zip(d["ids"], d["parents"]))
    label = dict(zip(d["ids"], d["labels"]))
    op = next(i for i, o in sdg.ops.items() if o.scope == ("layer3",))
    assert label[parent[f"%{op}"]] == "layer3"            # the op's parent is its scope
    assert parent[parent[f"%{op}"]] == region_of(sdg.ops[op])   # whose parent: the region
    assert d["values"][0] == pytest.approx(c["total"])
    assert "16 like scopes <b>layer#</b>" in PV.scope_notes_html(sdg, profile)


def _scoped_program():
    """Two blocks, each an ``attention`` scope inside a ``block<k>`` scope, names from the
    source; block1's projection is 4x wider than block0's (unfused, so that every op keeps
    its own scope)."""
    import numpy as np

    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    rng = np.random.default_rng(0)
    with ctx:
        h = tl.from_array(rng.standard_normal((4, 8)).astype(np.float32), domain=(t,))
        for k, width in enumerate((8, 32)):
            with tl.scope(f"block{k}"):
                with tl.scope("attention"):
                    q = h @ tl.constant(rng.standard_normal((8, width)).astype(np.float32))
                    wide = tl.tanh(q)
                back = wide @ tl.constant(rng.standard_normal((width, 8)).astype(np.float32))
                h = h + back
    return ctx.compile(bounds={T: 4}, outputs={"y": h}, config=tl.CompileConfig(fuse=False))


def test_scopes_nest_and_ops_carry_their_source_names():
    from tempo_lab.widgets import costs
    from tempo_lab.widgets import profile_view as PV
    from tempo_lab.widgets.search import op_title

    prog = _scoped_program()
    sdg = prog.sdg
    d = PV.icicle_data(sdg, _fake_profile(sdg))
    label = dict(zip(d["ids"], d["labels"]))
    parent = dict(zip(d["ids"], d["parents"]))
    named = [o for o in sdg.ops.values() if costs.scope_of(o) == ("block1", "attention")
             and o.kind not in ("const",)]
    assert named
    for o in named:
        leaf = f"%{o.id}"
        assert label[leaf] == op_title(o)
        assert [label[parent[leaf]], label[parent[parent[leaf]]]] == ["attention", "block1"]
    assert any(" · %" in label[f"%{o.id}"] for o in named)   # a source name, then the id
    fig = PV.scope_figure(sdg, _fake_profile(sdg))
    assert {t.name for t in fig.data} >= {"attention", "own ops"}     # stacked one level down
    assert list(fig.layout.xaxis.categoryarray) == ["(outside scopes)", "block0", "block1"]


def test_like_scopes_say_whether_their_difference_is_noise(decoder16):
    """Runs that move a layer by 2x make a 1.3x difference between layers noise; runs that
    agree make a 3x one real."""
    from tempo_lab.widgets import costs
    from tempo_lab.widgets import profile_view as PV

    sdg = decoder16.sdg
    slow = {i for i, o in sdg.ops.items() if o.scope == ("layer5",)}
    base = _fake_profile(sdg, lambda i: 1.3e-6 if i in slow else 1e-6)
    base.sessions = [dict(base.seconds), {i: 2 * s for i, s in base.seconds.items()},
                     dict(base.seconds)]
    (g,) = costs.scope_costs(sdg, base)["alike"]
    assert g["spread"] == pytest.approx(1.3) and g["run_spread"] == pytest.approx(2.0)
    assert "within the measurement's noise" in PV.scope_notes_html(sdg, base)
    real = _fake_profile(sdg, lambda i: 3e-6 if i in slow else 1e-6)
    real.sessions = [dict(real.seconds)] * 3
    assert "beyond the measurement's noise" in PV.scope_notes_html(sdg, real)
    fig = PV.scope_figure(sdg, base)
    assert any(t.name == "runs' range" for t in fig.data)


def test_xla_profile_keeps_each_profiled_run():
    """The XLA measurement drops the profiler's first run and keeps the median of the next
    ones per op; each run's seconds are kept for the views' error bars."""
    import statistics

    from tempo_lab.widgets.profile_view import PROFILED_RUNS

    prog = _prog("xla")
    run, _ = F.recorded_run(prog)
    p = run.profile
    assert len(p.sessions) == PROFILED_RUNS == 3 and p.seconds
    for i, s in p.seconds.items():
        assert s == pytest.approx(statistics.median(r.get(i, 0.0) for r in p.sessions))
    assert "median of 3" in p.measured


def test_memory_rows_group_by_scope_and_open_on_selection(decoder16):
    import time

    from tempo_lab.widgets import memory_view as MV

    plan = decoder16.memory
    start = time.perf_counter()
    fig = MV.memory_figure(plan)
    fig.to_json()
    assert time.perf_counter() - start < 2.0
    layers = [f"layer{k}" for k in range(16)]
    rows, ys = MV.gantt_rows(plan)
    assert ys[-16:] == layers and len(ys) <= 17            # one row per scope, not per store
    assert list(fig.layout.yaxis.categoryarray) == ys
    assert sum(len(t.y) for t in fig.data if t.type == "bar") == len(plan.storages)
    view = MV.MemoryView(plan, None, decoder16)
    op = next(r["op"] for r in rows if r["scope"] == "layer7")
    view.select(op)
    assert view.scopes.value == ("layer7",)
    shown = list(view.plot.figure.layout.yaxis.categoryarray)
    inside = [y for y in shown if y.startswith("layer7: ")]
    assert len(inside) == sum(r["scope"] == "layer7" for r in rows)
    assert "layer7" not in shown and "layer6" in shown


def test_largest_stores_are_sorted_by_bytes_and_named_from_the_source():
    from tempo_lab.widgets import costs
    from tempo_lab.widgets import memory_view as MV
    from tempo_lab.widgets.search import op_title

    prog = _scoped_program()
    plan = prog.memory
    rows = costs.largest_stores(plan, dict(prog.bounds))
    assert len(rows) == min(20, len(plan.storages))
    sizes = [r["bytes"] for r in rows]
    assert sizes == sorted(sizes, reverse=True)
    every = plan.store_bytes(dict(prog.bounds))
    assert sizes[0] == max(every.values())
    for r in rows:
        op = prog.sdg.ops[r["op"]]
        assert r["name"] == op_title(op) and r["dtype"] == plan.storages[r["op"]].dtype.name
        assert r["bytes"] == every[r["op"]]
        assert r["scope"] == "/".join(costs.scope_paths(prog.sdg, plan.storages)[r["op"]]) \
            or r["scope"] == costs.NO_SCOPE
    wide = next(r for r in rows if r["scope"] == "block1/attention" and " · %" in r["name"])
    assert wide["shape"][-1] == 32
    page = MV.largest_stores_html(plan, dict(prog.bounds))
    assert page.count("<tr data-op=") == len(rows) and "block1/attention" in page


def test_a_scope_around_everything_is_not_the_top_level():
    """A ``tl.scope("model")`` around the layers: the layers are the top level, and the ops
    made in ``model`` itself a row of their own."""
    import numpy as np

    from tempo_lab.widgets import costs

    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx, tl.scope("model"):
        h = tl.from_array(np.ones((4, 8), np.float32), domain=(t,))
        for k in range(2):
            with tl.scope(f"layer{k}"):
                h = tl.tanh(h * float(k + 2))
        out = h.sum()
    prog = ctx.compile(bounds={T: 4}, outputs={"y": out},
                       config=tl.CompileConfig(executor="reference", fuse=False))
    rows = costs.scope_costs(prog.sdg, _fake_profile(prog.sdg))["rows"]
    assert [r["scope"] for r in rows] == ["model (own ops)", "layer0", "layer1"]


def test_a_program_without_scopes_draws_no_scope_chart(prog, run):
    from tempo_lab.widgets.profile_view import ProfileView

    view = ProfileView(prog, run)
    assert view.scopes is None and "no scopes to compare" in view.scope_notes.value
    view.select(1)


# -- titles, ticks, colours and the SVG legend at a model's size -------------------------------
def _contrast(a: str, b: str) -> float:
    """WCAG contrast of two ``#rrggbb`` colours."""
    def lum(c):
        r, g, b = (int(c[k:k + 2], 16) / 255 for k in (1, 3, 5))
        f = [v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4 for v in (r, g, b)]
        return 0.2126 * f[0] + 0.7152 * f[1] + 0.0722 * f[2]
    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_the_timeline_title_sits_below_the_toolbar(prog, run):
    """At a 900-px window the profile tab's charts are about 430 px wide and plotly's toolbar
    takes the right 270 px of the band the title was drawn in: the timeline's title ran under
    it. The title is short now, what the times are is its subtitle, and both sit below the
    toolbar's band, in a top margin that holds them; each line fits in 400 px."""
    from tempo_lab.widgets.layout import text_width
    from tempo_lab.widgets.profile_view import Kernel

    kernels = F.estimated_kernels(prog.schedule, run.profile, run.bounds)
    untimed = [Kernel(k.op, k.point, 0.0, 0.0) for k in kernels]
    for ks, estimated in ((kernels, True), (kernels, False), (untimed, False)):
        t = F.timeline_figure(prog.sdg, ks, estimated=estimated).layout
        assert (t.title.yref, t.title.yanchor, t.title.y) == ("container", "top", 1)
        # the toolbar is 22 px high, 2 px from the top (measured in Chromium)
        assert t.title.pad.t >= 24 and t.margin.t >= t.title.pad.t + 50
        assert t.title.subtitle.text and f"{len(ks)} calls" in t.title.text
        assert text_width(t.title.text, 17) <= 400 and text_width(t.title.subtitle.text, 12) <= 400


def test_ppo_iteration_space_labels_only_the_rows_that_fit():
    """PPO as in the RL tutorial (4 epochs x 4 minibatches, 16 iterations) opens its iteration
    space on 96 rows (i, e, m at the sliders' 6, 4, 4): a tick per row wrote 96 labels over
    each other on 350 px. The ticks are every 10th row now, at least 18 px apart with room to
    spare, and the sliders fill their grid's cells (at 100% plus their margins the grid
    scrolled sideways)."""
    cfg = tl.rl.PPOConfig(hidden=16)
    ctx = tl.Context(dims=cfg.DIMS)
    trained = tl.rl.ppo(ctx, tl.rl.CartPole(), cfg)
    ppo = ctx.compile(bounds=cfg.bounds(ctx, 16, 4, 16), outputs={"return": trained.episode_return})
    view = ppo.schedule.explore(bounds=ppo.bounds).schedule_view
    fig = view.plot.figure
    rows = 1 + max(round(y) for y in fig.data[1].y)
    room = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    ticks = list(fig.layout.yaxis.tickvals or ())
    assert rows == 96 and fig.layout.yaxis.dtick is None
    assert ticks[0] == 0 and ticks[-1] >= rows - 10 and len(ticks) * 18 * 1.5 <= room
    assert len({b - a for a, b in zip(ticks, ticks[1:])}) == 1          # evenly spaced
    assert all(s.layout.width == "auto" for s in view.sliders.values())
    small = F.iteration_figure(_prog().schedule, {"B": 2, "T": 3})     # few rows: every one
    assert small.layout.yaxis.tickvals is None or len(small.layout.yaxis.tickvals) <= 12


def test_the_iteration_space_subtitle_fits_at_900_px():
    """PPO's iteration space says its bounds (six of them), the dims its bars are vectorised
    over and that a marker stands for a group, in its subtitle: on one line (about 600 px) it
    was cut off in the 390 px the chart has at a 900-px window, as plotly never wraps it. It
    is in lines now (``<br>``, at its ``·`` first) that each fit 350 px, below the toolbar's
    band, in a top margin that holds them and that leaves the plot its height; each dim is
    named once (it said ``b, b, t, m, m, s, s``)."""
    from tempo_lab.widgets.layout import text_width

    room, band = 0.95 * 380 - 12, 28    # px: the title's room at 900 px; the toolbar's band
    cfg = tl.rl.PPOConfig(hidden=16, update_epochs=2, num_minibatches=2)
    ctx = tl.Context(dims=cfg.DIMS)
    trained = tl.rl.ppo(ctx, tl.rl.CartPole(), cfg)
    ppo = ctx.compile(bounds=cfg.bounds(ctx, 2, 4, 16), outputs={"return": trained.episode_return})
    bounds = {"I": 12, "E": 4, "M": 4, "S": 4, "B": 4, "T": 4}
    t = F.iteration_figure(ppo.schedule, bounds).layout
    lines = t.title.subtitle.text.split("<br>")
    assert len(lines) >= 2 and lines[0] == "I=12, E=4, M=4, S=4, B=4, T=4"
    assert all(text_width(line, 12) <= room for line in lines), lines
    assert "one marker per group and point" in lines[-1]
    said = " ".join(lines)
    assert "vectorised over" in said and said.count(" b,") + said.count(" b:") <= 1
    assert text_width(t.title.text, 17) <= room - band      # the title: one line
    assert (t.title.yref, t.title.yanchor, t.title.pad.t) == ("container", "top", band)
    assert t.margin.t >= band + 26 + 28 + 16 * (len(lines) - 1)
    assert t.height - t.margin.t - t.margin.b == 350
    # a small program's subtitle fits on one line, as it did
    small = F.iteration_figure(_prog().schedule, {"B": 2, "T": 3}).layout
    assert "<br>" not in small.title.subtitle.text and small.height == 350 + small.margin.t + 40


def test_subtitles_break_at_the_width_of_the_figure():
    """``place_title`` breaks a subtitle at the figure's width when it has one (else at the
    narrowest chart's): wide, the PPO line above is one line; at 200 px it is four, none
    wider than the room."""
    from tempo_lab.widgets.layout import text_width
    from tempo_lab.widgets.palette import place_title, wrap

    detail = ("I=12, E=4, M=4, S=4, B=4, T=4 · vectorised over b, m, s, t: bars; one marker "
              "per group and point")
    wide = place_title(go.Figure(layout=dict(width=1300)), "iteration space", detail)
    assert wide.layout.title.subtitle.text == detail
    narrow = place_title(go.Figure(layout=dict(width=200)), "iteration space", detail)
    lines = narrow.layout.title.subtitle.text.split("<br>")
    assert len(lines) >= 3 and all(text_width(x, 12) <= 0.95 * 200 - 12 for x in lines)
    assert " ".join(lines).replace(";", "; ").split() == detail.replace(" ·", "").split()
    assert wrap("averyveryverylongword and more", 40) == ["averyveryverylongword", "and",
                                                          "more"]
    assert place_title(go.Figure(), "t").layout.margin.t == 28 + 26     # a title alone


def test_node_labels_read_on_every_fill():
    """Every fill a node can have (its category, a pass's edit, a closed group, the cost
    scale from nothing to the largest) has its label in a colour with at least 4.5:1 contrast
    (WCAG AA): black on the cost scale's red read 4.3:1, and a closed group's grey 3.2:1."""
    import re

    from tempo_lab.ir.sdg import CATEGORY_COLOURS
    from tempo_lab.widgets.layout import svg
    from tempo_lab.widgets.palette import EDIT_COLOURS

    fills = {*CATEGORY_COLOURS.values(), *EDIT_COLOURS.values(), "#f4f4f4",
             *(G.heat(k / 50) for k in range(51))}
    assert min(_contrast("#000000", f) for f in fills) >= 4.5
    sdg = _prog().sdg
    drawn = svg(G.graph_spec(sdg, weights={i: float(i) for i in sdg.ops}, unit="s",
                             expanded=set()))
    if drawn is None:
        pytest.skip("graphviz's dot program is not installed")
    for fill, texts in re.findall(r'<g id="[^"]+" class="node">(?:<title>[^<]*</title>)?'
                                  r'<path fill="(#[0-9a-f]{6})"[^>]*/>(.*?)</g>', drawn):
        for colour in re.findall(r'<text [^>]*?(?:fill="(#[0-9a-f]{6})")?[^>]*>', texts):
            assert _contrast(colour or "#000000", fill) >= 4.5, (fill, colour)


@pytest.mark.skipif(not _has_dot(), reason="graphviz's dot program is not installed")
def test_the_downloaded_svg_has_the_colour_legend(prog):
    """The canvas's SVG button saves the SVG the view holds (``canvas.svg``): it has the
    colour legend the HTML above the canvas shows (each colour and what it means, the cost
    scale when coloured by cost), drawn above the graph inside the file's view box, and the
    drawing's own box (``data-box``), which the canvas fits to, leaves it out."""
    import re
    import xml.etree.ElementTree as ET

    from tempo_lab.widgets.layout import svg as nested_svg

    panel = prog.sdg.explore().explorer.graph
    panel.show(G.graph_spec(prog.sdg, highlight=max(prog.sdg.ops), search="x"))
    spec, saved = panel.spec, panel.canvas.svg
    root = ET.fromstring(saved)
    legend = root.find("{http://www.w3.org/2000/svg}g[@class='tl-legend']")
    assert legend is not None
    words = [t.text for t in legend.iter("{http://www.w3.org/2000/svg}text")]
    swatches = [(r.get("fill"), r.get("stroke")) for r in legend.iter("{http://www.w3.org/2000/svg}rect")]
    items = G.legend_items(spec)
    assert words == ["colour:"] + [t for t, _, _ in items] and len(items) >= 3
    assert swatches == [(f, b) for _, f, b in items]
    assert {("selected", G.HIGHLIGHT), ("search hit", G.MATCH)} <= {(t, b) for t, _, b in items}
    x, y, w, h = map(float, root.get("viewBox").split())
    bx, by, bw, bh = map(float, root.get("data-box").split())
    ys = [float(t.get("y")) for t in legend.iter() if t.get("y") is not None]
    assert y < by and (x, w, y + h) == (bx, bw, by + bh) and y <= min(ys) and max(ys) < by
    weights = {i: 1e-6 * i for i in prog.sdg.ops}
    heat = nested_svg(G.graph_spec(prog.sdg, weights=weights, unit="s"))
    assert re.search(r'class="tl-legend".*url\(#tl-heat\).*square-root scale', heat)
    assert G.heat(1.0) in heat.split('class="tl-legend"')[1]
