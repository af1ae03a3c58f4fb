"""A bounded, least-recently-used cache for process-wide memos: compiled kernels and XLA
programs (a long notebook session compiles many programs, each entry holding compiled code), and
solved isl problems keyed by their canonical text (a program's repeated layers ask alike)."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable


class LRU:
    """At most ``size`` entries and, with ``weigh`` (an entry's bytes), at most ``max_bytes``
    in all, except that the newest entry is kept whatever its size; getting or putting an
    entry makes it the most recent."""

    def __init__(self, size: int, max_bytes: int | None = None,
                 weigh: Callable[[object], int] | None = None):
        self.size, self.max_bytes, self.weigh = size, max_bytes, weigh
        self._items: OrderedDict = OrderedDict()
        self._bytes: dict = {}
        self.nbytes = 0  # the entries' bytes, as weighed

    def get(self, key: Hashable, make: Callable[[], object]):
        """The entry for ``key``, made with ``make()`` (and the oldest dropped) if missing."""
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        if self.max_bytes is not None:  # an entry kept above the budget only as the newest
            while self._items and self.nbytes > self.max_bytes:  # goes before the next is
                self._evict()  # made: two such (PPO programs, 100 MB each) are never held
        value = self._items[key] = make()
        if self.weigh is not None:
            self._bytes[key] = int(self.weigh(value))
            self.nbytes += self._bytes[key]
        while len(self._items) > self.size or (
                self.max_bytes is not None and self.nbytes > self.max_bytes
                and len(self._items) > 1):
            self._evict()
        return value

    def _evict(self):
        old, _ = self._items.popitem(last=False)
        self.nbytes -= self._bytes.pop(old, 0)

    def pop(self, key: Hashable):
        """Drop the entry for ``key`` (if there is one)."""
        if key in self._items:
            del self._items[key]
            self.nbytes -= self._bytes.pop(key, 0)

    def __len__(self) -> int:
        return len(self._items)

    def values(self):
        return list(self._items.values())

    def clear(self):
        self._items.clear()
        self._bytes.clear()
        self.nbytes = 0
