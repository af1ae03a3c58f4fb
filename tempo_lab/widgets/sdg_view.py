"""The SDG explorer: the graph with one cluster per domain, search, a kind filter, collapsible
regions and a node inspector (source line, domain, shape, dtype, storage, time and bytes)."""
from __future__ import annotations

from . import graph as G
from .base import GraphPanel, stage_view, static_html
from .inspector import facts_html, op_facts, op_links
from .palette import region_of
from .search import INLINE_KINDS, op_title

NONE = -1


def op_options(sdg, constants: bool = False, keep=()) -> list[tuple[str, int]]:
    """Dropdown entries for picking an op: ``name · %id · kind · (domain)``, in id order;
    constants only with ``constants`` (they are most of a large program's ops), or when in
    ``keep``."""
    return [("(no op selected)", NONE)] + [
        (f"{op_title(op)} · {op.kind} · {region_of(op)}", op.id) for op in sdg.ops.values()
        if constants or op.kind not in INLINE_KINDS or op.id in keep]


def set_picked(picker, sdg, op_id: int, constants: bool) -> None:
    """``picker.value = op_id``, first adding the op to the options if it is a constant they
    leave out (a link in the inspector may pick one)."""
    if op_id not in {v for _, v in picker.options}:
        picker.options = op_options(sdg, constants, keep=(op_id,))
    picker.value = op_id


class SDGExplorer:
    """Interactive SDG view; ``select(op_id)`` highlights an op and fills the inspector,
    ``toggle(group key)`` expands or collapses a group (what a click on it in the graph does).
    ``on_select``: what a click on an op calls instead of ``select`` (the dashboard's picker)."""

    def __init__(self, sdg, plan=None, profile=None, bounds=None, selector: bool = True,
                 visible: int = G.VISIBLE, on_select=None):
        import ipywidgets as W

        self.sdg, self.plan, self.profile, self.bounds = sdg, plan, profile, bounds
        self.selected: int | None = None
        self.expanded = G.default_expanded(sdg, visible)
        # the words whose hits stay drawn and marked: set by Shift+Enter in the graph's own
        # search box; shown as a box of its own only where there is no graph canvas (no dot),
        # hidden but in the view otherwise (so that closing the view closes it)
        self.search = W.Text(placeholder="mark ops: words of name, kind, line or scope",
                             description="mark", continuous_update=False,
                             layout=W.Layout(display="none" if G.dot_installed() else None))
        kinds = sorted({op.kind for op in sdg.ops.values()})
        self.kind = W.Dropdown(options=[("all kinds", "")] + [(k, k) for k in kinds],
                               description="op kind")
        self.colour = W.Dropdown(options=self._colourings(), description="colour")
        self.colour.add_class("tempo-lab-colour")
        self.expand_all = W.Button(description="expand all", layout=W.Layout(width="auto"))
        self.collapse_all = W.Button(description="collapse all", layout=W.Layout(width="auto"))
        # sibling groups that compute alike (a decoder's layers) drawn as one box ×N; the
        # box only where there are such runs
        runs = bool(G.repeats(sdg))
        self.fold = W.Checkbox(value=runs, description="fold repeats", indent=False,
                               layout=W.Layout(width="auto", display=None if runs else "none"))
        self.fold.add_class("tempo-lab-fold")
        self._unfolding = False      # unticked by ``select``, which draws the graph itself
        self.fold.observe(lambda _: None if self._unfolding else self.refresh(fit=True),
                          "value")
        self.expand_all.on_click(lambda _: self.set_expanded(self._all_groups(), fit=True))
        self.collapse_all.on_click(lambda _: self.set_expanded(set(), fit=True))
        self.picker = W.Dropdown(options=op_options(sdg), value=NONE, description="op",
                                 layout=W.Layout(display=None if selector else "none"))
        self.constants = W.Checkbox(value=False, description="constants in the picker",
                                    indent=False, layout=W.Layout(
                                        width="auto", display=None if selector else "none"))
        self.constants.observe(lambda ch: self._constants_changed(), "value")
        self.graph = GraphPanel(on_pick=on_select or self.select, on_toggle=self.toggle,
                                index=G.search_rows(sdg), query=self.search)
        self.inspector = W.HTML(self._inspector_html())
        self.inspector.add_class("tempo-lab-inspector-box")
        for w in (self.search, self.kind, self.colour):
            w.observe(lambda _: self.refresh(), "value")
        self.picker.observe(lambda ch: self.select(ch.new), "value")
        controls = [self.search, self.kind, self.colour, self.picker, self.constants]
        # the inspector beside the graph where the notebook is wide enough for both (a row
        # that wraps: under about 900 px it goes below the graph)
        main = W.VBox([self.graph.widget], layout=W.Layout(flex="3 1 560px", min_width="0"))
        main.add_class("tempo-lab-sdg-main")
        side = W.VBox([W.HTML("<b>inspector</b>"), self.inspector], layout=W.Layout(
            flex="1 1 280px", min_width="260px", max_width="560px", max_height="85vh",
            overflow_y="auto", margin="0 0 0 8px"))
        side.add_class("tempo-lab-sdg-side")
        buttons = W.HBox([self.expand_all, self.collapse_all, self.fold])
        self.widget = W.VBox([W.HBox(controls), buttons,
                              W.Box([main, side], layout=W.Layout(
                                  display="flex", flex_flow="row wrap",
                                  align_items="flex-start", width="100%"))])
        self.widget.add_class("tempo-lab-sdg")
        self.refresh()

    def _colourings(self) -> list[tuple[str, str]]:
        """The colourings this view has data for: op category always, predicted bytes with a
        memory plan, measured time after a run that timed its ops."""
        out = [("op category", "")]
        if self.plan is not None and self.bounds:
            out.append(("store bytes (predicted)", "bytes"))
        if self.profile is not None and self.profile.seconds:
            out.append(("kernel time (measured)", "time"))
        return out

    def weights(self) -> tuple[dict[int, float] | None, str]:
        """Per-op cost for the chosen colouring, and its unit."""
        if self.colour.value == "time":
            return dict(self.profile.seconds), "s"
        if self.colour.value == "bytes":
            out = {}
            for i, st in self.plan.storages.items():
                if i in self.sdg.ops:
                    ext = tuple(self.bounds.get(d.bound.name, 1) for d in self.sdg.ops[i].domain)
                    out[i] = float(st.bytes_for(ext))
            return out, "B"
        return None, ""

    def spec(self) -> G.GraphSpec:
        weights, unit = self.weights()
        return G.graph_spec(self.sdg, search=self.search.value, kind=self.kind.value or None,
                            expanded=self.expanded,
                            keep=self._keep(),
                            weights=weights, unit=unit, fold=self.fold.value)

    def _keep(self) -> tuple:
        """The selected op, drawn whatever is closed; not when it is in a folded layer (the
        inspector shows it): ticking *fold repeats* then folds, as it says."""
        if self.selected is None or (self.fold.value and
                                     self.selected in G.folded_ops(self.sdg)):
            return ()
        return (self.selected,)

    def refresh(self, fit: bool = False):
        self.drawn = self.spec()
        self.graph.show(self.drawn, self.selected, fit=fit)

    def toggle(self, key: str):
        """Expand a collapsed group, or collapse an expanded one (and what is inside it)."""
        path = self.drawn.groups.get(key)
        if path is None:
            return
        if path in self.expanded:
            self.set_expanded({g for g in self.expanded if g[:len(path)] != path})
        else:
            self.set_expanded(G.open_group(self.sdg, self.expanded, path))

    def set_expanded(self, groups, fit: bool = False):
        """Open ``groups``; ``fit``: the view fits the new drawing (expand or collapse all), else
        it stays where it is (a group opened by a click stays under the pointer)."""
        self.expanded = set(groups)
        self.refresh(fit)

    def _all_groups(self) -> set:
        return {p[:j + 1] for p in G.group_paths(self.sdg).values() for j in range(len(p))}

    def select(self, op_id: int | None):
        op_id = None if op_id is None or op_id == NONE or op_id not in self.sdg.ops else op_id
        if op_id == self.selected:
            return
        self.selected = op_id
        if self.picker.value != (NONE if op_id is None else op_id):
            set_picked(self.picker, self.sdg, NONE if op_id is None else op_id,
                       self.constants.value)
        self.inspector.value = self._inspector_html()
        if op_id is not None and self.fold.value and op_id in G.folded_ops(self.sdg):
            self._unfolding = True     # an op of a folded layer: the layers unfold to show it
            try:
                self.fold.value = False
            finally:
                self._unfolding = False
        if op_id is not None:      # its groups open, so that it is seen among its neighbours
            path = G.group_paths(self.sdg)[op_id]
            self.expanded |= {path[:j + 1] for j in range(len(path))}
        self.refresh()

    def _inspector_html(self) -> str:
        if self.selected is None:
            return "<i>pick an op to see where it comes from and what it costs</i>"
        return facts_html(op_facts(self.sdg, self.selected, self.plan, self.profile,
                                   self.bounds), op_links(self.sdg, self.selected))

    def _constants_changed(self):
        keep = () if self.selected is None else (self.selected,)
        self.picker.options = op_options(self.sdg, self.constants.value, keep)
        self.picker.value = NONE if self.selected is None else self.selected


def explore_sdg(sdg, plan=None, profile=None, bounds=None):
    ex = SDGExplorer(sdg, plan, profile, bounds)
    view = stage_view([ex.widget], static_html(sdg, ex.graph.svg), "tempo-lab-sdg-view")
    view.explorer = ex
    return view
