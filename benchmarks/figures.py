"""Plotly figures and summaries of benchmark records, shared by the research notebooks.

The records are the dicts ``benchmarks.decode.measure`` returns (and ``python -m
benchmarks.decode`` writes as JSON) and those of ``benchmarks.compile.measure``. Plotly is
imported here, not in the measuring code, so a benchmark run does not need it.
"""
from __future__ import annotations

import json
from pathlib import Path

SYSTEM_COLOURS = {"tempo_lab": "#1f77b4", "jax_scan": "#d62728", "jax_step": "#ff7f0e"}
MIB = 2**20

# The targets for tempo_lab against the jax_scan baseline (CPU, same run).
TARGETS = {"causal ms/token": 0.5, "window ms/token": 0.3, "compile": 3.0, "rss": 1.2}


def load_records(path: str | Path) -> list[dict]:
    """The records of a saved ``python -m benchmarks.decode`` (or ``benchmarks.compile``) run."""
    with open(path) as f:
        return json.load(f)


def attention_name(rec: dict) -> str:
    return "causal" if rec["window"] is None else f"window {rec['window']}"


def by_key(records: list[dict]) -> dict[tuple[str, int], dict[str, dict]]:
    """``{(attention, T): {system: record}}`` in the order the records came."""
    keyed: dict[tuple[str, int], dict[str, dict]] = {}
    for r in records:
        keyed.setdefault((attention_name(r), r["seq_len"]), {})[r["system"]] = r
    return keyed


def ratio_rows(records: list[dict]) -> list[dict]:
    """tempo_lab / jax_scan for every (attention, T) that has both, with the target checks."""
    rows = []
    for (att, T), by in by_key(records).items():
        a, b = by.get("tempo_lab"), by.get("jax_scan")
        if not (a and b):
            continue
        target = TARGETS["causal ms/token" if att == "causal" else "window ms/token"]
        time_ratio = a["ms_per_token"] / b["ms_per_token"]
        compile_ratio = a["compile_s"] / b["compile_s"]
        rss_ratio = a["rss_peak_bytes"] / b["rss_peak_bytes"]
        rows.append({"attention": att, "T": T, "time_ratio": time_ratio,
                     "time_target": target, "time_met": time_ratio <= target,
                     "compile_ratio": compile_ratio,
                     "compile_met": compile_ratio <= TARGETS["compile"],
                     "store_ratio": a["store_peak_bytes"] / b["store_peak_bytes"],
                     "rss_ratio": rss_ratio, "rss_met": rss_ratio <= TARGETS["rss"]})
    return rows


def decode_table(records: list[dict]) -> str:
    """A plain-text table (readable where plotly output is not rendered)."""
    head = (f"{'attention':<10} {'T':>5}  {'system':<9} {'ms/token':>9} {'compile s':>9} "
            f"{'store MiB':>9} {'rss MiB':>8} {'load 1m':>8}")
    lines = [head, "-" * len(head)]
    for (att, T), by in by_key(records).items():
        for s, r in by.items():
            load = (r.get("loadavg_at_start") or [r.get("loadavg_1m_at_start") or float("nan")])[0]
            lines.append(f"{att:<10} {T:>5}  {s:<9} {r['ms_per_token']:>9.3f} "
                         f"{r['compile_s']:>9.2f} {r['store_peak_bytes'] / MIB:>9.2f} "
                         f"{r['rss_peak_bytes'] / MIB:>8.0f} {load:>8.2f}")
    return "\n".join(lines)


def _go():
    import plotly.graph_objects as go

    return go


def _subplots(titles: list[str]):
    from plotly.subplots import make_subplots

    return make_subplots(rows=1, cols=len(titles), subplot_titles=titles, shared_yaxes=False)


def time_per_token_figure(records: list[dict]):
    """Time per token against T, one panel per attention, one line per system (log-log)."""
    go = _go()
    keyed = by_key(records)
    atts = list(dict.fromkeys(att for att, _ in keyed))
    fig = _subplots([f"{a} attention" for a in atts])
    for col, att in enumerate(atts, start=1):
        Ts = sorted(T for a, T in keyed if a == att)
        for system, colour in SYSTEM_COLOURS.items():
            pts = [(T, keyed[(att, T)][system]) for T in Ts if system in keyed[(att, T)]]
            if not pts:
                continue
            fig.add_trace(go.Scatter(
                x=[T for T, _ in pts], y=[r["ms_per_token"] for _, r in pts],
                error_y={"type": "data", "symmetric": False,
                         "array": [r["ms_per_token_max"] - r["ms_per_token"] for _, r in pts],
                         "arrayminus": [r["ms_per_token"] - r["ms_per_token_min"]
                                        for _, r in pts]},
                mode="lines+markers", name=system, legendgroup=system, showlegend=col == 1,
                line={"color": colour}), row=1, col=col)
        fig.update_xaxes(type="log", title_text="sequence length T", row=1, col=col)
        fig.update_yaxes(type="log", title_text="ms per token" if col == 1 else None,
                         row=1, col=col)
    fig.update_layout(title="Decoding: time per token against sequence length", height=420)
    return fig


def memory_timeline_figure(curves: dict[str, tuple[list[float], list[int]]],
                           flat: dict[str, int], title: str):
    """Bytes against decode step: ``curves`` maps a name to (x, bytes); ``flat`` maps a name
    to a constant (a baseline that holds its maximum from the start)."""
    go = _go()
    fig = go.Figure()
    for name, (x, y) in curves.items():
        dash = "dot" if "predicted" in name else "solid"
        fig.add_trace(go.Scatter(x=x, y=[b / MIB for b in y], mode="lines", name=name,
                                 line={"dash": dash}))
    xmax = max((max(x) for x, _ in curves.values() if x), default=1)
    for name, b in flat.items():
        fig.add_trace(go.Scatter(x=[0, xmax], y=[b / MIB, b / MIB], mode="lines", name=name,
                                 line={"dash": "dash", "color": SYSTEM_COLOURS["jax_scan"]}))
    fig.update_layout(title=title, xaxis_title="decode step t", yaxis_title="store MiB",
                      height=420)
    return fig


def downsample(values: list[int], points: int = 400) -> tuple[list[float], list[int]]:
    """(fraction of the run in [0, 1], value) keeping each stretch's maximum, so a figure
    stays small without hiding a peak."""
    n = len(values)
    if n <= points:
        return [i / max(1, n - 1) for i in range(n)], list(values)
    xs, ys = [], []
    for k in range(points):
        a, b = k * n // points, (k + 1) * n // points
        xs.append(b / n)
        ys.append(max(values[a:b]))
    return xs, ys


def tile_block_figure(rows: list[dict], baseline_ms: float | None = None):
    """ms/token, compile time and store peak against the tiling block size; rows with
    ``tile_block`` 0 (tiling off) are drawn as dashed lines across."""
    go = _go()
    fig = _subplots(["time per token", "compile time", "store peak"])
    on = [r for r in rows if r["tile_block"]]
    off = next((r for r in rows if not r["tile_block"]), None)
    x = [r["tile_block"] for r in on]
    for col, key, scale, name in ((1, "ms_per_token", 1, "ms/token"), (2, "compile_s", 1, "s"),
                                  (3, "store_peak_bytes", 1 / MIB, "MiB")):
        fig.add_trace(go.Scatter(x=x, y=[r[key] * scale for r in on], mode="lines+markers",
                                 name=f"tiled: {key}"), row=1, col=col)
        if off is not None:
            fig.add_hline(y=off[key] * scale, line_dash="dash", row=1, col=col,
                          annotation_text="untiled")
        fig.update_xaxes(type="log", title_text="CompileConfig.tile_block", row=1, col=col)
        fig.update_yaxes(title_text=name, row=1, col=col)
    if baseline_ms is not None:
        fig.add_hline(y=baseline_ms, line_dash="dot", line_color="grey", row=1, col=1,
                      annotation_text="jax_scan")
    fig.update_layout(title="Tiling block size (causal decode)", height=420)
    return fig


def compile_by_stage_figure(records: list[dict]):
    """tempo_lab's compile time as stacked stages against layers, jax_scan's jit as a line."""
    go = _go()
    fig = go.Figure()
    layers = [r["layers"] for r in records]
    stages = list(dict.fromkeys(k for r in records for k in r["tempo_lab_by_stage"]))
    for stage in stages:
        fig.add_trace(go.Bar(x=layers, y=[r["tempo_lab_by_stage"].get(stage, 0.0)
                                           for r in records], name=f"tempo_lab: {stage}"))
    fig.add_trace(go.Scatter(x=layers, y=[r["jax_scan_compile_s"] for r in records],
                             mode="lines+markers", name="jax_scan: jit compile",
                             line={"color": SYSTEM_COLOURS["jax_scan"]}))
    fig.update_layout(barmode="stack", title="Compile time by stage against layers",
                      xaxis={"title": "layers", "type": "category"},
                      yaxis_title="seconds", height=420)
    return fig


def markdown_table(records: list[dict]) -> str:
    """The README's table: one row per system and configuration, then tempo_lab / jax_scan
    with the issue's targets (ms/token ≤ 0.5x causal, ≤ 0.3x window; compile ≤ 3x; RSS ≤ 1.2x)."""
    lines = ["| attention | T | system | ms/token median [min, max] | compile s | "
             "store peak MiB (predicted) | RSS MiB | load 1m |",
             "|---|---:|---|---|---:|---|---:|---|"]
    ratios = {(r["attention"], r["T"]): r for r in ratio_rows(records)}
    for (att, T), by in by_key(records).items():
        for s, r in by.items():
            pred = r.get("predicted_store_peak_bytes")
            store = f"{r['store_peak_bytes'] / MIB:.1f}" + (f" ({pred / MIB:.1f})" if pred else "")
            a, b = r.get("loadavg_at_start"), r.get("loadavg_at_end")
            load = f"{a[0]:.1f}–{b[0]:.1f}" if a and b else "-"
            lines.append(f"| {att} | {T} | {s} | {r['ms_per_token']:.2f} "
                         f"[{r['ms_per_token_min']:.2f}, {r['ms_per_token_max']:.2f}] | "
                         f"{r['compile_s']:.2f} | {store} | {r['rss_peak_bytes'] / MIB:.0f} | "
                         f"{load} |")
        q = ratios.get((att, T))
        if q:
            def mark(met):
                return "" if met else " ✗"
            lines.append(f"| | | **tempo_lab / jax_scan** | **{q['time_ratio']:.2f}x**"
                         f" (target ≤ {q['time_target']}x){mark(q['time_met'])} | "
                         f"**{q['compile_ratio']:.1f}x** (≤ 3x){mark(q['compile_met'])} | "
                         f"**{q['store_ratio']:.2f}x** | **{q['rss_ratio']:.2f}x** "
                         f"(≤ 1.2x){mark(q['rss_met'])} | |")
    return "\n".join(lines)


if __name__ == "__main__":     # python -m benchmarks.figures RESULTS.json: the README's table
    import sys

    print(markdown_table(load_records(sys.argv[1])))
