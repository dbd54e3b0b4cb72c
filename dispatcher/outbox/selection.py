"""The partitions a worker publishes, as server-side filters (pure).

One object per worker, updated at each activation and read by the sweep, the change
stream, the retries and the backlog gauges, so every read of the worker selects exactly
its partitions (docs/design.md "Scale-out: partitions and leases"). Holding every
partition selects everything — no filter at all, which also covers documents without the
partition field. Otherwise a document without ``_p`` (inserted by something other than the
writer, until ``aggbox migrate partitions`` gives it its own) belongs to partition 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aggregates.core.partitions import F_PARTITION, PARTITIONS

__all__ = ["Selection", "partition_filter"]


def partition_filter(partitions: Iterable[int], *, total: int = PARTITIONS,
                     prefix: str = "") -> dict[str, Any]:
    """The query selecting documents of these partitions (``prefix``: e.g.
    ``"fullDocument."`` inside a change stream's ``$match``). Empty for all of them."""
    parts = sorted(set(partitions))
    if len(parts) >= total:
        return {}
    field = prefix + F_PARTITION
    if not parts:
        return {field: {"$in": []}}
    selected: dict[str, Any] = {field: {"$in": parts}}
    if 0 in parts:
        return {"$or": [selected, {field: {"$exists": False}}]}
    return selected


class Selection:
    """The worker's current partitions (all of them until told otherwise: a worker used
    without partition leases selects everything)."""

    def __init__(self, *, total: int = PARTITIONS) -> None:
        self.total = total
        self.partitions: frozenset[int] = frozenset(range(total))
        self._query: dict[str, Any] = {}
        self._stream: dict[str, Any] = {}

    def set(self, partitions: Iterable[int]) -> None:
        self.partitions = frozenset(partitions)
        self._query = partition_filter(self.partitions, total=self.total)
        self._stream = partition_filter(self.partitions, total=self.total,
                                        prefix="fullDocument.")

    def held(self) -> frozenset[int] | None:
        """The partitions, ``None`` when all are held (no filter)."""
        return None if self.full else self.partitions

    @property
    def full(self) -> bool:
        return len(self.partitions) >= self.total

    def query(self) -> dict[str, Any]:
        """For ``find``/``$match`` on the collection (a copy: callers add to it)."""
        return dict(self._query)

    def stream_match(self) -> dict[str, Any]:
        """For the change stream's ``$match`` (on the looked-up ``fullDocument``)."""
        return dict(self._stream)
