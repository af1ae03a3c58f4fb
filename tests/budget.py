"""How many generated examples the differential tests draw.

CI runs a third of each thorough count (the suite has to finish in about 25 minutes on two
cores); ``TEMPO_LAB_THOROUGH=1 python -m pytest`` draws them all. Either way the examples are
derandomised, so a run draws the same programs each time and the CI ones are the first of the
thorough ones."""
from __future__ import annotations

import os

THOROUGH = os.environ.get("TEMPO_LAB_THOROUGH", "") not in ("", "0")


def examples(thorough: int) -> int:
    """The number of examples to draw where a thorough run draws ``thorough``."""
    return thorough if THOROUGH else max(4, thorough // 3)
