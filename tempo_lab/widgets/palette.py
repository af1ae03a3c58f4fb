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
NARROW = 380    # px: the narrowest chart a view draws (the iteration space at a 900-px window)
SUBTITLE_FONT = 12                   # px: plotly's subtitle (0.7 of its 17-px title)
SUBTITLE_LINE = 16                   # px: a subtitle line's height
# where a subtitle may break, most telling first, and what is left at the end of a line there
BREAKS = ((" · ", ""), ("; ", ";"), (", ", ","), (" ", ""))


def wrap(text: str, room: float, size: float = SUBTITLE_FONT, breaks=BREAKS) -> list[str]:
    """``text`` as lines of at most ``room`` px at ``size`` px (Helvetica's widths, as the
    graph's labels are measured), broken at its ``·`` first, then at ``;``, ``,`` and spaces:
    plotly draws a title or subtitle on one line, however wide the chart is. A word longer
    than ``room`` is a line of its own."""
    from .layout import text_width  # here, not above: layout imports graph, which imports us

    if text_width(text, size) <= room or not breaks:
        return [text]
    (sep, kept), rest = breaks[0], breaks[1:]
    parts = text.split(sep)
    lines, line = [], parts[0]
    for part in parts[1:]:
        if text_width(line + sep + part, size) <= room:
            line += sep + part
        else:
            lines += wrap(line + kept, room, size, rest)
            line = part
    return lines + wrap(line, room, size, rest)


def place_title(fig, text: str, detail: str = "", width: float | None = None):
    """Give ``fig`` its title below the toolbar's band, ``detail`` as its subtitle, and the
    top margin both need. Why: plotly draws the title and the toolbar in one band, and at a
    900-px window a chart is about 430 px wide, so that a title of more than about 15
    characters ran under the toolbar; below it, nothing covers the title at any width. The
    subtitle is broken into lines (``<br>``) that fit the chart's width (``width``, else the
    figure's, else ``NARROW``) from where the title starts (5% in) to its right edge: plotly
    never wraps it, and the iteration space's bounds and notes were cut off at 900 px.
    Returns ``fig``."""
    width = width or fig.layout.width or NARROW
    lines = wrap(detail, 0.95 * width - 12) if detail else []
    fig.update_layout(title=dict(text=text, subtitle=dict(text="<br>".join(lines)),
                                 yref="container", y=1, yanchor="top", pad=dict(t=MODEBAR)),
                      margin=dict(t=MODEBAR + 26 + (28 + SUBTITLE_LINE * (len(lines) - 1)
                                                    if lines else 0)))
    return fig
