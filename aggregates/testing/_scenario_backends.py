"""Where a :class:`~aggregates.testing.scenario.Scenario` keeps its aggregates.

- :class:`MemoryBackend` — one :class:`~aggregates.testing.AggregateHarness` per aggregate:
  the writer's fold (:func:`aggregates.fold.fold`) in memory, with the harness's checks
  (every handling run twice, the state's store round trip). Pure.
- :class:`StoreBackend` — the real :class:`~aggregates.store.writer.StoreWriter` on a pymongo
  ``Database`` (:func:`aggregates.testing.memory_database` or a MongoDB server), outboxes
  read from the documents and ``$pull``-ed by id as the dispatcher does. The only module of
  the scenario that does I/O.

Both answer the same questions, so one scenario runs on either unchanged."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from aggregates.core.errors import UnknownAggregateType
from aggregates.core.reasons import Reason
from aggregates.domain.aggregate import AggregateType, Registry
from aggregates.fold.document import F_OUTBOX, F_STATE, F_STATE_VERSION, F_TIMERS, F_VERSION
from aggregates.message.envelope import Message
from aggregates.message.outcomes import Outcome

__all__ = ["Backend", "MemoryBackend", "StoreBackend"]

Entry = Mapping[str, Any]


class Backend(Protocol):
    now: datetime

    def deliver(self, msg: Message, *, lose_write: bool = False, step: int | None = None
                ) -> tuple[list[Outcome], list[Entry]]:
        """Apply ``msg``: its outcomes (with released parked ones) and the entries it
        emitted; with ``lose_write`` the handling runs but nothing is stored. ``step``: the
        timeline's step, for error messages."""
        ...

    def outbox(self, atype: AggregateType[Any], aggregate_id: str) -> list[Entry]: ...

    def pull(self, atype: AggregateType[Any], aggregate_id: str, ids: Sequence[str]) -> None: ...

    def timers(self, atype: AggregateType[Any], aggregate_id: str) -> list[Entry]:
        """The aggregate's pending timers (docs/design.md "Timers")."""
        ...

    def pull_timers(self, atype: AggregateType[Any], aggregate_id: str,
                    ids: Sequence[str]) -> None:
        """Remove fired timers, as the dispatcher does after the broker's ack."""
        ...

    def state(self, atype: AggregateType[Any], aggregate_id: str) -> Any: ...

    def aggregates(self) -> list[tuple[str, str]]: ...


def _unknown(registry: Registry, msg: Message) -> Outcome | None:
    try:
        registry.get(msg.aggregate_type)
    except UnknownAggregateType as exc:
        return Outcome(msg.message_id, msg.aggregate_type, msg.aggregate_id, "dead_lettered",
                       Reason.UNKNOWN_AGGREGATE_TYPE, str(exc))
    return None


class MemoryBackend:
    def __init__(self, registry: Registry, *, now: datetime, check_determinism: bool) -> None:
        from aggregates.testing.harness import AggregateHarness

        self._harness_type = AggregateHarness
        self.registry = registry
        self.now = now
        self.check_determinism = check_determinism
        self._h: dict[tuple[str, str], Any] = {}

    def _harness(self, type_name: str, aggregate_id: str) -> Any:
        key = (type_name, aggregate_id)
        h = self._h.get(key)
        if h is None:
            h = self._harness_type(self.registry.get(type_name), aggregate_id=aggregate_id,
                                   check_determinism=self.check_determinism, now=self.now)
            self._h[key] = h
        h.now = self.now
        return h

    def deliver(self, msg: Message, *, lose_write: bool = False, step: int | None = None
                ) -> tuple[list[Outcome], list[Entry]]:
        unknown = _unknown(self.registry, msg)
        if unknown is not None:
            return [unknown], []
        h = self._harness(msg.aggregate_type, msg.aggregate_id)
        n = len(h.history)
        if lose_write:
            saved = (copy.deepcopy(h.snapshot), list(h.outbox), list(h.parked),
                     len(h.dead_letters))
            h.when(msg)
            h.snapshot, h.outbox, h.parked = saved[0], saved[1], saved[2]
            del h.dead_letters[saved[3]:]
            del h.history[n:]
            return [], []
        handled = h.when(msg, step=step)
        return list(h.history[n:]), list(handled.emitted)

    def outbox(self, atype: AggregateType[Any], aggregate_id: str) -> list[Entry]:
        return list(self._harness(atype.name, aggregate_id).outbox)

    def pull(self, atype: AggregateType[Any], aggregate_id: str, ids: Sequence[str]) -> None:
        h = self._harness(atype.name, aggregate_id)
        gone = set(ids)
        h.outbox = [e for e in h.outbox if e.get("id") not in gone]
        h.snapshot.outbox_ids = [i for i in h.snapshot.outbox_ids if i not in gone]

    def timers(self, atype: AggregateType[Any], aggregate_id: str) -> list[Entry]:
        return list(self._harness(atype.name, aggregate_id).snapshot.timers)

    def pull_timers(self, atype: AggregateType[Any], aggregate_id: str,
                    ids: Sequence[str]) -> None:
        snap = self._harness(atype.name, aggregate_id).snapshot
        snap.timers = [t for t in snap.timers if t.get("id") not in set(ids)]
        snap.version += 1

    def state(self, atype: AggregateType[Any], aggregate_id: str) -> Any:
        return self._harness(atype.name, aggregate_id).state

    def aggregates(self) -> list[tuple[str, str]]:
        return sorted(k for k, h in self._h.items() if h.snapshot.state is not None)


class _LostWrite(Exception):
    """Raised before the bulk write: the injected crash of a ``lost_write`` fault."""


class StoreBackend:
    def __init__(self, db: Any, registry: Registry, *, now: datetime) -> None:
        from aggregates.core.settings import AggboxSettings
        from aggregates.store.writer import StoreWriter, utc_now

        self.db = db
        self.registry = registry
        self.now = now
        self._lose = False
        self.writer = StoreWriter(db, registry, settings=AggboxSettings.load(pipeline_depth=1),
                                  clock=lambda: self.now, sleep=lambda _s: None,
                                  before_write=self._before_write,
                                  # TTL fields on the store's clock, not the fixed one: else
                                  # the store expires archive entries at once (issue 33).
                                  store_clock=utc_now)
        self.writer.ensure_indexes()

    def _before_write(self, _ops: Any) -> None:
        if self._lose:
            raise _LostWrite()

    def deliver(self, msg: Message, *, lose_write: bool = False, step: int | None = None
                ) -> tuple[list[Outcome], list[Entry]]:
        unknown = _unknown(self.registry, msg)
        if unknown is not None:
            return [unknown], []
        self._lose = lose_write
        try:
            outcomes = self.writer.process([msg])
        except _LostWrite:
            return [], []
        finally:
            self._lose = False
        ids = {i for o in outcomes for i in o.emitted_ids}
        atype = self.registry.get(msg.aggregate_type)
        emitted = [e for e in self.outbox(atype, msg.aggregate_id) if e.get("id") in ids]
        return outcomes, emitted

    def outbox(self, atype: AggregateType[Any], aggregate_id: str) -> list[Entry]:
        doc = self.db[atype.collection].find_one({"_id": aggregate_id}, {F_OUTBOX: 1})
        return list((doc or {}).get(F_OUTBOX) or [])

    def pull(self, atype: AggregateType[Any], aggregate_id: str, ids: Sequence[str]) -> None:
        # As the dispatcher: exactly these ids, _v untouched (docs/design.md invariant 2).
        self.db[atype.collection].update_one(
            {"_id": aggregate_id}, {"$pull": {F_OUTBOX: {"id": {"$in": list(ids)}}}})

    def timers(self, atype: AggregateType[Any], aggregate_id: str) -> list[Entry]:
        doc = self.db[atype.collection].find_one({"_id": aggregate_id}, {F_TIMERS: 1})
        return list((doc or {}).get(F_TIMERS) or [])

    def pull_timers(self, atype: AggregateType[Any], aggregate_id: str,
                    ids: Sequence[str]) -> None:
        # As the dispatcher (dispatcher/timers/firer.py): these ids, and _v moved on.
        self.db[atype.collection].update_one(
            {"_id": aggregate_id}, {"$pull": {F_TIMERS: {"id": {"$in": list(ids)}}},
                                    "$inc": {F_VERSION: 1}})

    def state(self, atype: AggregateType[Any], aggregate_id: str) -> Any:
        doc = self.db[atype.collection].find_one({"_id": aggregate_id},
                                                 {F_STATE: 1, F_STATE_VERSION: 1})
        if doc is None:
            return atype.load_state(None)
        return atype.load_state(doc.get(F_STATE), doc.get(F_STATE_VERSION, 1))

    def aggregates(self) -> list[tuple[str, str]]:
        found = []
        for atype in self.registry:
            for doc in self.db[atype.collection].find({F_STATE: {"$exists": True}}, {"_id": 1}):
                found.append((atype.name, str(doc["_id"])))
        return sorted(found)
