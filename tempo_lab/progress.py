"""Progress bars for long work (compilation stages, long runs): ``tqdm.auto``, shown only
when the work lasts over a second, and never when ``tl.config.progress`` is False."""
from __future__ import annotations

from .config import config

DELAY_S = 1.0  # work that ends sooner shows no bar


class _Silent:
    def update(self, n=1):
        pass

    def set_description_str(self, text, refresh=False):
        pass

    def close(self):
        pass


def bar(total: int | None, desc: str, unit: str = "it", delay: float = DELAY_S):
    """A progress bar (``update``, ``set_description_str``, ``close``), or one that shows
    nothing when progress is off or tqdm is missing; shown after ``delay`` seconds."""
    if not config.progress:
        return _Silent()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _Silent()
    return tqdm(total=total, desc=desc, unit=unit, delay=delay, leave=False)
