"""A least-recently-used cache bounded by the bytes it holds, not by its number of entries.

A cache bounded by entries holds whatever those entries weigh (long prompts
are megabytes each); :class:`ByteLRU` counts each entry's size and drops the
least recently used entries once the total passes ``max_bytes``.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["ENTRY_OVERHEAD", "ByteLRU", "object_bytes"]

K = TypeVar("K")
V = TypeVar("V")

#: Bytes one entry costs beyond its key and value (the ordered dictionary's
#: slot and links, the size kept with it), rounded up from what CPython measures
#: (docs/benchmarks.md, "Figures behind constants").
ENTRY_OVERHEAD = 200


def object_bytes(key: object, value: object) -> int:
    """An entry's size: its key's and value's own (``sys.getsizeof``), and the entry's cost."""
    return sys.getsizeof(key) + sys.getsizeof(value) + ENTRY_OVERHEAD


class ByteLRU(Generic[K, V]):
    """The most recently used entries whose sizes add up to at most ``max_bytes``.

    Args:
        max_bytes: the bound on the sizes held.
        size: an entry's size in bytes (default :func:`object_bytes`; keys and
            values that hold other objects need their own).
    """

    def __init__(self, max_bytes: int, size: Callable[[K, V], int] = object_bytes) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._size = size
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: K) -> V | None:
        """The value of ``key`` (now the most recently used), or None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: K, value: V) -> None:
        """Keeps ``value`` under ``key``, dropping the least recently used entries over the bound.

        An entry larger than ``max_bytes`` on its own is not kept.
        """
        self.discard(key)
        size = self._size(key, value)
        if size > self.max_bytes:
            return
        self._entries[key] = (value, size)
        self.nbytes += size
        self._shrink()

    def resize(self, max_bytes: int) -> None:
        """Changes the bound, dropping the least recently used entries over it."""
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._shrink()

    def clear(self) -> None:
        """Forgets every entry."""
        self._entries.clear()
        self.nbytes = 0

    def _shrink(self) -> None:
        while self.nbytes > self.max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self.nbytes -= dropped

    def discard(self, key: K) -> None:
        """Forgets ``key`` if it is held."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.nbytes -= entry[1]
