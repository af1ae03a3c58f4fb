"""Fixed colours, so that every picture of the same program looks the same in every session:
op categories reuse the SDG's own table, domains hash their name, edits have one colour each;
and the charts' shared style (plotly template, where a title goes)."""
from __future__ import annotations

import zlib

from tempo_lab.ir.sdg import CATEGORY_COLOURS

DOMAIN_PALETTE = ("#4c72b0", "#55a868", "#c44e52", "#8172b2", "#ccb974", "#64b5cd")
EDIT_COLOURS = {"created": "#74c476", "erased": "#fb6a4a", "replaced": "#fb6a4a",
                "rewritten": "#fdae6b"}
STORE_COLOURS = {"point": "#9ecae1", "ring": "#fdae6b", "block": "#e6550d"}
HIGHLIGHT = "#d62728"
MATCH = "#ff7f0e"
TEMPLATE = "plotly_white"


def category_colour(category: str) -> str:
    return CATEGORY_COLOURS.get(category, "#eeeeee")


def domain_colour(name: str) -> str:
    """Same hash as the SDG's DOT output, so clusters match ``sdg.to_dot()`` pictures."""
    return DOMAIN_PALETTE[zlib.crc32(name.encode()) % len(DOMAIN_PALETTE)]


def region_of(op) -> str:
    """The region an op belongs to: its domain, written like the SDG's clusters."""
    return "(" + ", ".join(map(str, op.domain)) + ")"


MODEBAR = 28    # px: the band at a chart's top right that plotly's toolbar (modebar) takes


def place_title(fig, text: str, detail: str = ""):
    """Give ``fig`` its title below the toolbar's band, ``detail`` as its subtitle, and the
    top margin both need. Why: plotly draws the title and the toolbar in one band, and at a
    900-px window a chart is about 430 px wide, so that a title of more than about 15
    characters ran under the toolbar; below it, nothing covers the title at any width.
    Returns ``fig``."""
    fig.update_layout(title=dict(text=text, subtitle=dict(text=detail), yref="container",
                                 y=1, yanchor="top", pad=dict(t=MODEBAR)),
                      margin=dict(t=MODEBAR + (54 if detail else 26)))
    return fig
