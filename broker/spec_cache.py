"""The scheduler's cache of parsed job specs, bounded in entries and in the bytes of the specs it holds.

A parsed spec is kept while its job is likely read again (pending heads, running jobs being polled); the
least recently used entries go first once either bound is passed, and the scheduler drops a job's entry when
the job ends (:meth:`SpecCache.discard`). Memory held stays below ``max_bytes`` of spec JSON (plus the
parsed objects, of about the same size) however many jobs pass through.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Generic, TypeVar

__all__ = ["SpecCache", "DEFAULT_MAX_ENTRIES", "DEFAULT_MAX_BYTES"]

DEFAULT_MAX_ENTRIES = 4096
DEFAULT_MAX_BYTES = 16 * 1024 * 1024

V = TypeVar("V")


class SpecCache(Generic[V]):
    """An LRU map job id -> parsed spec, weighed by the length of the spec's JSON."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[V, int]] = OrderedDict()
        self.bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str) -> V | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return None
            self._items.move_to_end(key)
            return hit[0]

    def put(self, key: str, value: V, weight: int) -> None:
        """Keep ``value`` (of ``weight`` bytes); a value heavier than the whole bound is not kept."""
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            if weight > self.max_bytes:
                return
            self._items[key] = (value, weight)
            self.bytes += weight
            while self._items and (len(self._items) > self.max_entries or self.bytes > self.max_bytes):
                _, (_, w) = self._items.popitem(last=False)
                self.bytes -= w

    def discard(self, keys: Iterable[str]) -> None:
        """Forget ``keys`` (jobs that ended)."""
        with self._lock:
            for key in keys:
                old = self._items.pop(key, None)
                if old is not None:
                    self.bytes -= old[1]
