"""Progress bars for long work (compilation stages, long runs): ``tqdm.auto``, shown only
when the work lasts over a second, and never when ``tl.config.progress`` is False."""
from __future__ import annotations

import threading
from contextlib import contextmanager

from .config import config

DELAY_S = 1.0  # work that ends sooner shows no bar
_HEARD = threading.local()  # this thread's listener (``listening``)


class _Silent:
    def update(self, n=1):
        pass

    def set_description_str(self, text, refresh=False):
        pass

    def close(self):
        pass


class _Heard:
    """A bar whose updates a listener hears too: ``listener(done, total, unit)``."""

    def __init__(self, inner, total, unit, listener):
        self.inner, self.total, self.unit, self.listener, self.done = inner, total, unit, \
            listener, 0

    def update(self, n=1):
        self.done += n
        self.inner.update(n)
        self.listener(self.done, self.total, self.unit)

    def set_description_str(self, text, refresh=False):
        self.inner.set_description_str(text, refresh)

    def close(self):
        self.inner.close()


@contextmanager
def listening(listener):
    """While in it, the bars made in this thread call ``listener(done, total, unit)`` on every
    update, shown or not (``tl.config.progress`` off): a view that runs a program in a thread
    of its own says how far the run is ("step 12 of 64") rather than only its seconds."""
    before = getattr(_HEARD, "listener", None)
    _HEARD.listener = listener
    try:
        yield
    finally:
        _HEARD.listener = before


def bar(total: int | None, desc: str, unit: str = "it", delay: float = DELAY_S):
    """A progress bar (``update``, ``set_description_str``, ``close``), or one that shows
    nothing when progress is off or tqdm is missing; shown after ``delay`` seconds. A
    listener (``listening``) hears its updates either way."""
    listener = getattr(_HEARD, "listener", None)
    inner = _tqdm(total, desc, unit, delay)
    return inner if listener is None else _Heard(inner, total, unit, listener)


def _tqdm(total, desc, unit, delay):
    if not config.progress:
        return _Silent()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _Silent()
    return tqdm(total=total, desc=desc, unit=unit, delay=delay, leave=False)
