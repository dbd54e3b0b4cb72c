"""Which outbox entries are being published right now, and which were published recently.

The start-up sweep and the change stream see the same documents, change events carry
looked-up documents that may be older than our last ``$pull``, and the safety sweep runs
next to the stream: the same entry is seen several times. :class:`InFlight` makes sure it is
handed to the publisher once:

- an entry *in flight* (claimed, outcome unknown) is skipped by every other view;
- an entry *done* (acknowledged and pulled, or dead-lettered and pulled) is remembered in a
  bounded LRU; a stale view that still shows it gets it pulled again (a no-op normally)
  instead of republished.

Documents are serialised as well: while a document has entries in flight, its newer entries
wait (:meth:`claim` returns nothing and marks the document *dirty*, to be re-read when
the batch finishes) — so one aggregate's entries are always published in emission order.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["Claim", "InFlight"]


class Claim:
    """The outcome of :meth:`InFlight.claim` for one document."""

    __slots__ = ("fresh", "malformed", "stale")

    def __init__(self, fresh: list[Any], stale: list[str], malformed: int = 0) -> None:
        self.fresh = fresh  #: entries to publish, in outbox order
        self.stale = stale  #: ids published already (pull them again, do not publish)
        self.malformed = malformed  #: entries without a string id (cannot be pulled by id)


class InFlight:
    def __init__(self, *, done_capacity: int = 100_000) -> None:
        self._entries: dict[str, Any] = {}  # entry id → document key
        self._docs: dict[Any, int] = {}  # document key → entries in flight
        self._done: OrderedDict[str, None] = OrderedDict()
        self._capacity = done_capacity
        self.dirty: set[Any] = set()

    def __len__(self) -> int:
        return len(self._entries)

    def busy(self, doc_key: Any) -> bool:
        return doc_key in self._docs

    def claim(self, doc_key: Any, outbox: Sequence[Any],
              ids: Sequence[str | None] | None = None) -> Claim:
        """Claim the document's entries that nobody publishes yet (``ids``: their ids, when
        the entries are not decoded). A busy document yields nothing and is marked dirty
        (re-read it after :meth:`finish`)."""
        if doc_key in self._docs:
            self.dirty.add(doc_key)
            return Claim([], [])
        fresh: list[Any] = []
        stale: list[str] = []
        malformed = 0
        for i, entry in enumerate(outbox):
            if ids is not None:
                eid = ids[i]
            else:
                eid = entry.get("id") if isinstance(entry, dict) else None
            if not isinstance(eid, str) or not eid:
                malformed += 1
            elif eid in self._done:
                stale.append(eid)
            else:
                fresh.append(entry)
                self._entries[eid] = doc_key
        if fresh:
            self._docs[doc_key] = len(fresh)
        return Claim(fresh, stale, malformed)

    def finish(self, doc_key: Any, done: Iterable[str], released: Iterable[str]) -> None:
        """End the document's batch: ``done`` ids were published (or dead-lettered) and
        pulled; ``released`` ids were not (they will be claimed again)."""
        for eid in done:
            self._entries.pop(eid, None)
            self._done[eid] = None
            self._done.move_to_end(eid)
        for eid in released:
            self._entries.pop(eid, None)
        while len(self._done) > self._capacity:
            self._done.popitem(last=False)
        self._docs.pop(doc_key, None)

    def take_dirty(self) -> list[Any]:
        out = [k for k in self.dirty if k not in self._docs]
        self.dirty.difference_update(out)
        return out
