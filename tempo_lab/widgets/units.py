"""How the views write amounts: one place, so that every tab says 16.0 MiB the same way."""
from __future__ import annotations


def nbytes(value: float) -> str:
    """Bytes in binary units: ``512 B``, ``1.50 KiB``, ``16.0 MiB``, ``2.25 GiB``."""
    for scale, name in ((2 ** 40, "TiB"), (2 ** 30, "GiB"), (2 ** 20, "MiB"), (2 ** 10, "KiB")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {name}"
    return f"{value:.0f} B"


def amount(value: float, unit: str) -> str:
    """Seconds as ms or µs, bytes (unit ``"B"``) as ``nbytes`` writes them."""
    if unit == "s":
        return f"{value * 1e3:.3g} ms" if value >= 1e-3 else f"{value * 1e6:.3g} µs"
    return nbytes(value)


def byte_ticks(top: float, count: int = 5) -> tuple[list[float], list[str]]:
    """Tick values and labels for a bytes axis from 0 to ``top``: round numbers of the unit
    ``nbytes`` writes ``top`` in (plotly's own ticks would be decimal kB and MB)."""
    scale = next((s for s in (2 ** 40, 2 ** 30, 2 ** 20, 2 ** 10) if top >= s), 1)
    span = max(top / scale, 1e-9)
    step = next(m * 10 ** e for e in range(-2, 16) for m in (1, 2, 5)
                if m * 10 ** e * count >= span)
    vals = [k * step * scale for k in range(int(span / step) + 2)]
    return vals, [nbytes(v) for v in vals]
