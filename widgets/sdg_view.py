"""The SDG explorer: the graph with one cluster per domain, search, a kind filter, collapsible
regions and a node inspector (source line, domain, shape, dtype, storage, time and bytes)."""
from __future__ import annotations

from . import graph as G
from .base import GraphPanel, stage_view, static_html
from .inspector import facts_html, op_facts
from .palette import region_of

NONE = -1


def op_options(sdg) -> list[tuple[str, int]]:
    """Dropdown entries for picking an op: ``label · kind · (domain)``, in id order."""
    return [("(no op selected)", NONE)] + [
        (f"{op.label} · {op.kind} · {region_of(op)}", op.id) for op in sdg.ops.values()]


class SDGExplorer:
    """Interactive SDG view; ``select(op_id)`` highlights an op and fills the inspector."""

    def __init__(self, sdg, plan=None, profile=None, bounds=None, selector: bool = True,
                 collapse_above: int = G.COLLAPSE_ABOVE):
        import ipywidgets as W

        self.sdg, self.plan, self.profile, self.bounds = sdg, plan, profile, bounds
        self.selected: int | None = None
        regions: dict[str, int] = {}
        for op in sdg.ops.values():
            regions[region_of(op)] = regions.get(region_of(op), 0) + 1
        self.search = W.Text(placeholder="search ops by name or kind", description="search",
                             continuous_update=False)
        kinds = sorted({op.kind for op in sdg.ops.values()})
        self.kind = W.Dropdown(options=[("all kinds", "")] + [(k, k) for k in kinds],
                               description="op kind")
        self.collapse = W.SelectMultiple(
            options=[(f"{r} · {n} ops", r) for r, n in sorted(regions.items())],
            value=tuple(sorted(G.default_collapsed(sdg, collapse_above))),
            description="collapse", rows=min(4, len(regions)) or 1)
        self.picker = W.Dropdown(options=op_options(sdg), value=NONE, description="op")
        self.graph = GraphPanel(on_pick=self.select)
        self.inspector = W.HTML(self._inspector_html())
        for w in (self.search, self.kind, self.collapse):
            w.observe(lambda _: self.refresh(), "value")
        self.picker.observe(lambda ch: self.select(ch.new), "value")
        controls = [self.search, self.kind] + ([self.picker] if selector else [])
        self.widget = W.VBox([W.HBox(controls), self.collapse, self.graph.widget,
                              W.HTML("<b>inspector</b>"), self.inspector])
        self.widget.add_class("tempo-lab-sdg")
        self.refresh()

    def spec(self) -> G.GraphSpec:
        return G.graph_spec(self.sdg, highlight=self.selected, search=self.search.value,
                            kind=self.kind.value or None, collapsed=self.collapse.value)

    def refresh(self):
        self.graph.show(self.spec())

    def select(self, op_id: int | None):
        op_id = None if op_id is None or op_id == NONE or op_id not in self.sdg.ops else op_id
        if op_id == self.selected:
            return
        self.selected = op_id
        if self.picker.value != (NONE if op_id is None else op_id):
            self.picker.value = NONE if op_id is None else op_id
        self.inspector.value = self._inspector_html()
        self.refresh()

    def _inspector_html(self) -> str:
        if self.selected is None:
            return "<i>pick an op to see where it comes from and what it costs</i>"
        return facts_html(op_facts(self.sdg, self.selected, self.plan, self.profile,
                                   self.bounds))


def explore_sdg(sdg, plan=None, profile=None, bounds=None):
    ex = SDGExplorer(sdg, plan, profile, bounds)
    view = stage_view([ex.widget], static_html(sdg, ex.graph.svg), "tempo-lab-sdg-view")
    view.explorer = ex
    return view
