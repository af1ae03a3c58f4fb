"""The graph view's nested layout (``tempo_lab.widgets.layout``) on a 16-layer Llama-style
decoder written layer by layer: the layers read top to bottom, opening or closing one group
moves nothing outside it (every group has its open room, closed or not), titles never
overlap, a toggle runs no layout, and every view lays out in well under 2 s."""
from __future__ import annotations

import time

import numpy as np
import pytest

import tempo_lab as tl
from tempo_lab.widgets import graph as G
from tempo_lab.widgets import layout as L

pytestmark = pytest.mark.skipif(not G.dot_installed(), reason="graphviz's dot is not installed")

LAYERS, D, HEADS = 16, 16, 2


def _rms_norm(x, w):
    return x / tl.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6) * w


@pytest.fixture(scope="module")
def sdg():
    """One tl.scope per layer, tl.nn.rope, tl.nn.attention, tl.nn.silu, a user rms_norm (the
    decoder of test_search: 1289 traced ops, 473 after the passes)."""
    sdg = decoder()
    assert len(sdg.ops) > 400
    return sdg


def decoder(layers=LAYERS, odd=None):
    """The decoder's SDG; layer ``odd`` (if any) has no silu."""
    rng = np.random.default_rng(0)
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    dh = D // HEADS
    with ctx:
        h = tl.from_array(rng.normal(size=(6, D)).astype(np.float32), domain=(t,))
        for layer in range(layers):
            with tl.scope(f"layer{layer}"):
                w = {k: rng.normal(size=(D, D)).astype(np.float32) * 0.3
                     for k in ("wq", "wk", "wv", "wo", "w1", "w2", "w3")}
                g = rng.uniform(0.5, 1.5, size=D).astype(np.float32)
                x = _rms_norm(h, g)
                q = tl.nn.rope((x @ w["wq"]).reshape(HEADS, dh), t)
                k = tl.nn.rope((x @ w["wk"]).reshape(HEADS, dh), t)
                v = (x @ w["wv"]).reshape(HEADS, dh)
                att = tl.nn.attention(q, k, v, t)
                h = h + att.reshape(D) @ w["wo"]
                x = _rms_norm(h, g)
                up = x @ w["w1"] if layer == odd else tl.nn.silu(x @ w["w1"])
                h = h + (up * (x @ w["w3"])) @ w["w2"]
        logits = _rms_norm(h, np.ones(D, np.float32))
    return ctx.compile(bounds={T: 6}, outputs={"logits": logits}).sdg


def _every_group(sdg):
    return {p[:j + 1] for p in G.group_paths(sdg).values() for j in range(len(p))}


def _views(sdg):
    return {"default": G.default_expanded(sdg), "collapsed": set(), "expanded": _every_group(sdg)}


def _layer_boxes(spec, lay):
    boxes = lay.boxes()
    key = {path: k for k, path in spec.groups.items()}
    return [boxes[key[(f"layer{k}",)]] for k in range(LAYERS)]


@pytest.mark.parametrize("view", ["default", "collapsed", "expanded"])
def test_the_layers_read_top_to_bottom(sdg, view):
    """Layer k's box starts below layer k-1's bottom, whatever the layers share (layer0 makes
    the rope table every layer reads) and whichever groups are open: program order reads top
    to bottom, the sixteen layers one vertical chain."""
    spec = G.graph_spec(sdg, expanded=_views(sdg)[view])
    lay = L.layout(spec)
    layers = _layer_boxes(spec, lay)
    assert len(layers) == 16
    for (_, y0, _, h0), (_, y1, _, _) in zip(layers, layers[1:]):
        assert y1 > y0 + h0
    assert lay.height > 2 * lay.width          # a chain, not side by side


def _overlap(a, b) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


@pytest.mark.parametrize("view", ["default", "collapsed", "expanded"])
def test_titles_and_boxes_never_overlap(sdg, view):
    """Titles (their boxes estimated from text length and font size) never overlap one
    another; siblings' boxes never overlap; a title fits in its box."""
    spec = G.graph_spec(sdg, expanded=_views(sdg)[view])
    lay = L.layout(spec)
    titles = list(lay.titles().items())
    assert len(titles) >= 16
    for k, (a, ra) in enumerate(titles):
        for b, rb in titles[k + 1:]:
            assert not _overlap(ra, rb), (a, b)
    boxes = lay.boxes()
    for key, (x, _, w, _) in lay.titles().items():
        bx, by, bw, bh = boxes[key]
        assert bx <= x and x + w <= bx + bw + 0.5, key

    def siblings(items):
        for k, a in enumerate(items):
            for b in items[k + 1:]:
                assert not _overlap((a.x, a.y, a.w, a.h), (b.x, b.y, b.w, b.h)), (a.key, b.key)
            siblings(a.children)
    siblings(lay.items)


def _inside(path, toggled):
    return path[:len(toggled)] == toggled


@pytest.mark.parametrize("which", [("layer5",), ("layer0", "attention"), ("layer15",)])
def test_a_toggle_moves_nothing_outside_the_group(sdg, which):
    """Opening one group (then closing it again): the group keeps its box (the room it has
    open is kept for it when closed), every box outside it keeps its coordinates exactly, and
    closing it gives back the first layout exactly."""
    opened = G.default_expanded(sdg) - {p for p in _every_group(sdg) if _inside(p, which)}
    if which[:-1]:
        opened |= {which[:-1]}
    before_spec = G.graph_spec(sdg, expanded=opened)
    key = next(k for k, p in before_spec.groups.items() if p == which)
    after_spec = G.graph_spec(sdg, expanded=G.open_group(sdg, opened, which))
    before, after = L.layout(before_spec).boxes(), L.layout(after_spec).boxes()
    assert after[key] == before[key]
    assert key in {n.key for n in before_spec.nodes} and key in after_spec.groups
    paths = {**{k: p for k, p in after_spec.groups.items()},
             **{n.key: G.group_paths(sdg)[n.op] for n in after_spec.nodes if n.op is not None}}
    inside = {k for k, p in paths.items() if _inside(p, which)}
    assert len(inside) > 1
    kept = 0
    for k, box in before.items():
        if k in after and k not in inside:
            assert after[k] == box, k
            kept += 1
    assert kept >= 16
    assert L.layout(G.graph_spec(sdg, expanded=opened)).boxes() == before


def test_every_box_is_where_the_frame_has_it(sdg):
    """Whichever groups are open, a node or group is drawn at the box it has with every group
    open (collapse all, the default view and expand all agree on every common key)."""
    views = [L.layout(G.graph_spec(sdg, expanded=v)) for v in _views(sdg).values()]
    full = views[-1].boxes()
    for lay in views[:-1]:
        assert (lay.width, lay.height) == (views[-1].width, views[-1].height)
        for k, box in lay.boxes().items():
            assert full[k] == box, k


def test_a_toggle_runs_no_layout(sdg, monkeypatch):
    """Every group's inside is laid out once and cached: opening or closing a group after the
    first drawing runs no ``dot`` at all."""
    import tempo_lab.svg

    opened = G.default_expanded(sdg)
    L._SKELETONS.clear()
    L.svg(G.graph_spec(sdg, expanded=opened))
    calls = []
    real = tempo_lab.svg._dot

    def counting(source, timeout):
        calls.append(source.count("digraph"))
        return real(source, timeout)

    monkeypatch.setattr(L, "_RUNNER", counting)   # the cache stays valid for this runner
    monkeypatch.setattr(tempo_lab.svg, "_dot", counting)
    closed = next(p for p in G.graph_spec(sdg, expanded=opened).groups.values()
                  if p not in opened and p[0] == "layer7")
    assert L.svg(G.graph_spec(sdg, expanded=G.open_group(sdg, opened, closed))) is not None
    assert L.svg(G.graph_spec(sdg, expanded=opened)) is not None
    assert calls == []


@pytest.mark.parametrize("view", ["default", "collapsed", "expanded"])
def test_every_view_lays_out_quickly(sdg, view):
    """graph_spec, the layout (nothing cached) and the SVG in under 2 s at 473 ops."""
    L._SKELETONS.clear()
    start = time.perf_counter()
    svg = L.svg(G.graph_spec(sdg, expanded=_views(sdg)[view]))
    took = time.perf_counter() - start
    assert svg is not None and svg.startswith("<svg")
    assert took <= 2.0, f"{view}: {took:.2f} s"


def test_the_svg_has_what_the_canvas_reads(sdg):
    """Nodes and groups with their keys as ids (``g.node``, ``g.cluster``), edges, a view box and the drawing's own box (``data-box``)."""
    spec = G.graph_spec(sdg)
    svg = L.svg(spec)
    assert svg.count('class="node"') == len(spec.nodes)
    opened = {k for k, p in spec.groups.items() if k not in {n.key for n in spec.nodes}}
    assert all(f'<g id="{k}" class="cluster">' in svg for k in opened)
    assert svg.count('class="edge"') >= 16 and 'viewBox="0 ' in svg and 'data-box="0 0 ' in svg


def test_the_layers_fold_into_one_box(sdg):
    """The sixteen layers compute alike (same op kinds, same edges; layer0 also makes the rope
    table and the scalars every layer reads, which are left out of the comparison): folded,
    they are one box titled ``layer0…layer15 ×16`` that opens to layer0's inside, the
    edges into and out of the run drawn as before, and the box is laid out like any other
    (no title overlaps another)."""
    assert {p: len(ms) for p, ms in G.repeats(sdg).items()} == {("layer0",): 16}
    spec = G.graph_spec(sdg, expanded=set(), fold=True)
    boxes = [n for n in spec.nodes if n.op is None]
    assert [n.label.split(":")[0] for n in boxes if "layer" in n.label] == \
        ["layer0…layer15 ×16"]
    assert not any(p[0] in {f"layer{k}" for k in range(1, LAYERS)}
                   for p in spec.groups.values())
    key = next(k for k, p in spec.groups.items() if p == ("layer0",))
    assert {s for s, _, _, _ in spec.edges} | {d for _, d, _, _ in spec.edges} >= {key}
    opened = G.graph_spec(sdg, expanded=_every_group(sdg), fold=True)
    ops = {n.op for n in opened.nodes if n.op is not None}
    assert len(ops) > 5 and not any(G.group_paths(sdg)[i][0] in [f"layer{k}" for k in
                                                                  range(1, LAYERS)] for i in ops)
    lay = L.layout(G.graph_spec(sdg, expanded=_every_group(sdg), fold=True))
    titles = list(lay.titles().values())
    for k, a in enumerate(titles):
        for b in titles[k + 1:]:
            assert not _overlap(a, b)
    x, _, w, _ = lay.boxes()[key]
    tx, _, tw, _ = lay.titles()[key]
    assert x <= tx and tx + tw <= x + w + 0.5


def test_unfolding_gives_back_the_sixteen_boxes(sdg):
    """Folding is a drawing of its own (the parent laid out again, each layer's inside from the
    cache); unfolding draws the sixteen layers where they were before it was folded, and a
    toggle inside the folded box moves nothing outside it."""
    opened = G.default_expanded(sdg)
    before = L.layout(G.graph_spec(sdg, expanded=opened)).boxes()
    folded = L.layout(G.graph_spec(sdg, expanded=opened, fold=True)).boxes()
    assert len(folded) < len(before)
    after_spec = G.graph_spec(sdg, expanded=opened)
    after = L.layout(after_spec).boxes()
    assert after == before and len(_layer_boxes(after_spec, L.layout(after_spec))) == LAYERS
    closed = G.graph_spec(sdg, expanded=opened, fold=True)
    inner = next(p for k, p in closed.groups.items() if p[0] == "layer0" and len(p) == 2
                 and k in {n.key for n in closed.nodes})
    spec = G.graph_spec(sdg, expanded=G.open_group(sdg, opened, inner), fold=True)
    moved = L.layout(spec).boxes()
    key = next(k for k, p in spec.groups.items() if p == inner)
    keys = {k for k, p in spec.groups.items() if p[:2] == inner}
    keys |= {n.key for n in spec.nodes
             if n.op is not None and G.group_paths(sdg)[n.op][:2] == inner}
    assert moved[key] == folded[key]
    assert all(moved[k] == box for k, box in folded.items() if k in moved and k not in keys)


def test_layers_that_differ_do_not_fold():
    """Four layers, the third without its silu: no three alike in a row, so nothing folds
    and the four layers are drawn as four boxes; four alike fold into one ×4."""
    odd = decoder(4, odd=2)
    assert G.repeats(odd) == {}
    spec = G.graph_spec(odd, expanded=set(), fold=True)
    assert sorted(p[0] for p in spec.groups.values() if p[0].startswith("layer")) == \
        [f"layer{k}" for k in range(4)] and not spec.titles
    alike = G.graph_spec(decoder(4), expanded=set(), fold=True)
    assert list(alike.titles.values()) == ["layer0…layer3 ×4"]


def test_search_and_selection_reach_folded_layers(sdg):
    """Search finds ops of every layer, folded or not, and a selected op (kept drawn) in a
    folded layer unfolds its run."""
    hits = G.matches(sdg, "layer11 softmax")
    assert hits
    spec = G.graph_spec(sdg, expanded=G.default_expanded(sdg), fold=True, keep=(hits[0],))
    assert not spec.titles and f"op{hits[0]}" in {n.key for n in spec.nodes}


def test_folded_edges_are_the_first_layers(sdg):
    """Inside the folded box the edges are layer0's own (one read each, not sixteen): the
    later layers' edges are not drawn onto it."""
    spec = G.graph_spec(sdg, expanded=_every_group(sdg), fold=True)
    inside = {n.key for n in spec.nodes if n.op is not None
              and G.group_paths(sdg)[n.op][0] == "layer0"}
    labels = [lab for s, d, lab, _ in spec.edges if s in inside and d in inside]
    assert labels and not any("16 reads" in lab for lab in labels)
