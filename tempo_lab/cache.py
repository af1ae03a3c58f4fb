"""A bounded, least-recently-used cache for process-wide memos: compiled kernels and XLA
programs (a long notebook session compiles many programs, each entry holding compiled code), and
solved isl problems keyed by their canonical text (a program's repeated layers ask alike)."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable


class LRU:
    """At most ``size`` entries; getting or putting an entry makes it the most recent."""

    def __init__(self, size: int):
        self.size = size
        self._items: OrderedDict = OrderedDict()

    def get(self, key: Hashable, make: Callable[[], object]):
        """The entry for ``key``, made with ``make()`` (and the oldest dropped) if missing."""
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        value = self._items[key] = make()
        while len(self._items) > self.size:
            self._items.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._items)

    def values(self):
        return list(self._items.values())

    def clear(self):
        self._items.clear()
