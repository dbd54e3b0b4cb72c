"""Partition leases and member heartbeats of one collection, as stored (docs/design.md
"Scale-out: partitions and leases"; the rule deciding what to claim or release is
:mod:`dispatcher.balance`).

Two collections, one document per (collection, partition) and per (collection, instance):

- leases ``{_id: join_parts(db, collection, str(p)), scope, partition, owner (None once
  released), expires_at, epoch, since, previous, handover, handed_at}``: ``epoch`` is
  incremented by every claim — the fencing token that publishes carry;
- members ``{_id: join_parts(db, collection, instance), scope, instance, host, pid,
  started_at, heartbeat_at, expires_at, partitions, published, effects}`` (``effects``: the
  effect types the instance executes, dispatcher/effects/guard.py).

Every write that gives or keeps a lease is one atomic conditional write per document, so
the store never has two owners for one partition: a claim matches only a free lease
(``owner`` None or ``expires_at`` at or before the claimer's clock), a renewal only the
holder's own. The holder counts a lease as held until ``ttl`` after it *sent* the renewal,
minus a margin (:func:`dispatcher.balance.valid_until`), so it stops before a claimer may
take it over. A lease taken over after expiry (not released) is published only
``grace_s`` after the claim: time for whatever the previous holder had already handed to
its producer to settle.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError

from aggregates.keys import join_parts
from aggregates.partitions import PARTITIONS
from dispatcher.balance import LeaseView, valid_until

__all__ = ["Claimed", "PartitionLeases", "default_instance_id"]

log = logging.getLogger("aggbox.dispatcher.lease")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _aware(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return None


@dataclass(frozen=True, slots=True)
class Claimed:
    """One partition this instance just took: from whom and how."""

    partition: int
    epoch: int
    #: ``new`` (never owned), ``released`` (given up gracefully) or ``expired``
    handover: str
    previous: str | None


class PartitionLeases:
    """The leases of one collection's partitions, from the point of view of ``owner``."""

    def __init__(self, leases: AsyncCollection[Any], members: AsyncCollection[Any], *,
                 database: str, collection: str, owner: str, ttl_s: float,
                 grace_s: float = 0.0, margin: float = 0.2, partitions: int = PARTITIONS,
                 clock: Callable[[], datetime] = _utc_now,
                 monotonic: Callable[[], float] = time.monotonic,
                 effect_types: Iterable[str] = ()) -> None:
        self.leases = leases
        #: the effect types this instance executes, announced in its heartbeat
        self.effect_types = frozenset(effect_types)
        #: from the last :meth:`read`: instance → (heartbeat expiry, its effect types)
        self.member_effects: dict[str, tuple[datetime, frozenset[str]]] = {}
        self.members = members
        self.database = database
        self.collection = collection
        self.scope = f"{database}.{collection}"
        self.owner = owner
        self.ttl_s = ttl_s
        self.grace_s = grace_s
        self.margin = margin
        self.partitions = partitions
        self._clock = clock
        self._monotonic = monotonic
        #: partition → until when it counts as held (monotonic)
        self.held: dict[int, float] = {}
        #: partition → not published before (monotonic): takeovers after expiry
        self.not_before: dict[int, float] = {}
        #: partition → lease epoch of our claim (the fencing token)
        self.epochs: dict[int, int] = {}
        self.started_at = clock()
        self._ensured = False

    def key(self, partition: int) -> str:
        return join_parts(self.database, self.collection, str(partition))

    def _member_key(self) -> str:
        return join_parts(self.database, self.collection, self.owner)

    # -- what may be published now ---------------------------------------------------------
    def publishable(self) -> frozenset[int]:
        """Partitions held now and past their takeover grace."""
        now = self._monotonic()
        return frozenset(p for p, until in self.held.items()
                         if until > now and self.not_before.get(p, 0.0) <= now)

    def holds(self, partitions: Iterable[int]) -> bool:
        now = self._monotonic()
        held = self.held
        return all(held.get(p, 0.0) > now for p in partitions)

    def next_grace_end(self) -> float | None:
        now = self._monotonic()
        ends = [t for t in self.not_before.values() if t > now]
        return min(ends) if ends else None

    # -- store round trips -------------------------------------------------------------------
    async def ensure(self) -> None:
        """Create the lease documents that do not exist yet (free). Idempotent; racing
        instances collide on ``_id`` harmlessly."""
        if self._ensured:
            return
        docs = [{"_id": self.key(p), "scope": self.scope, "partition": p, "owner": None,
                 "expires_at": _EPOCH, "epoch": 0} for p in range(self.partitions)]
        existing = {d["_id"] async for d in self.leases.find({"scope": self.scope}, {"_id": 1})}
        missing = [d for d in docs if d["_id"] not in existing]
        if missing:
            try:
                await self.leases.insert_many(missing, ordered=False)
            except BulkWriteError as exc:
                if any(e.get("code") != 11000 for e in exc.details.get("writeErrors", [])):
                    raise
        self._ensured = True

    async def heartbeat(self, *, published: int = 0) -> None:
        now = self._clock()
        await self.members.update_one(
            {"_id": self._member_key()},
            {"$set": {"scope": self.scope, "instance": self.owner, "host": socket.gethostname(),
                      "pid": os.getpid(), "heartbeat_at": now,
                      "expires_at": now + timedelta(seconds=self.ttl_s),
                      "partitions": sorted(self.held), "published": published,
                      "effects": sorted(self.effect_types)},
             "$setOnInsert": {"started_at": self.started_at}},
            upsert=True)

    async def renew(self) -> float:
        """Extend every lease this instance owns in the store. Returns the monotonic time the
        renewal was sent (what :meth:`confirm` counts validity from)."""
        sent = self._monotonic()
        now = self._clock()
        await self.leases.update_many(
            {"scope": self.scope, "owner": self.owner},
            {"$set": {"expires_at": now + timedelta(seconds=self.ttl_s)}})
        return sent

    async def read(self) -> tuple[dict[str, datetime], dict[int, LeaseView]]:
        """Live-or-not members (instance → heartbeat expiry) and every lease of the scope."""
        members: dict[str, datetime] = {}
        effects: dict[str, tuple[datetime, frozenset[str]]] = {}
        async for m in self.members.find({"scope": self.scope},
                                         {"instance": 1, "expires_at": 1, "effects": 1}):
            exp = _aware(m.get("expires_at"))
            if isinstance(m.get("instance"), str) and exp is not None:
                members[m["instance"]] = exp
                types = m.get("effects")
                effects[m["instance"]] = (exp, frozenset(
                    t for t in types if isinstance(t, str)) if isinstance(types, list)
                    else frozenset())
        self.member_effects = effects
        leases: dict[int, LeaseView] = {}
        async for d in self.leases.find({"scope": self.scope},
                                        {"partition": 1, "owner": 1, "expires_at": 1,
                                         "epoch": 1}):
            p = d.get("partition")
            if isinstance(p, int) and 0 <= p < self.partitions:
                owner = d.get("owner")
                leases[p] = LeaseView(p, owner if isinstance(owner, str) else None,
                                      _aware(d.get("expires_at")), int(d.get("epoch") or 0))
        return members, leases

    def confirm(self, leases: Mapping[int, LeaseView], sent: float) -> set[int]:
        """After :meth:`renew` (sent at ``sent``) and :meth:`read`: the leases the store
        says are ours are held until ``valid_until(sent)``; the others are dropped.
        Returns the partitions lost since the last round."""
        ours = {p for p, v in leases.items() if v.owner == self.owner}
        lost = set(self.held) - ours
        until = valid_until(sent, self.ttl_s, self.margin)
        self.held = {p: until for p in ours}
        for p in lost:
            self.not_before.pop(p, None)
            self.epochs.pop(p, None)
        for p in ours:
            self.epochs[p] = leases[p].epoch
        return lost

    async def claim(self, wanted: Iterable[int], seen: Mapping[int, LeaseView]
                    ) -> list[Claimed]:
        """Try to take the free ones among ``wanted`` (one conditional update for all; each
        document is matched atomically). ``seen`` is the lease state they were chosen from
        (it tells how each was handed over)."""
        ids = {self.key(p): p for p in wanted}
        if not ids:
            return []
        sent = self._monotonic()
        now = self._clock()
        await self.leases.update_many(
            {"_id": {"$in": list(ids)},
             "$or": [{"owner": None}, {"expires_at": {"$lte": now}}]},
            {"$set": {"owner": self.owner, "expires_at": now + timedelta(seconds=self.ttl_s),
                      "since": now, "handed_at": now},
             "$inc": {"epoch": 1}})
        got: list[Claimed] = []
        until = valid_until(sent, self.ttl_s, self.margin)
        async for d in self.leases.find({"_id": {"$in": list(ids)}, "owner": self.owner},
                                        {"partition": 1, "epoch": 1}):
            p = int(d["partition"])
            before = seen.get(p)
            if before is None or (before.owner is None and before.epoch == 0):
                kind, previous = "new", None
            elif before.owner is None:
                kind, previous = "released", None
            else:
                kind, previous = "expired", before.owner
            got.append(Claimed(p, int(d.get("epoch") or 0), kind, previous))
            self.held[p] = until
            self.epochs[p] = int(d.get("epoch") or 0)
            if kind == "expired" and self.grace_s > 0:
                self.not_before[p] = sent + self.grace_s
        if got:
            await self.leases.bulk_write(
                [UpdateOne({"_id": self.key(c.partition), "owner": self.owner,
                            "epoch": c.epoch},
                           {"$set": {"handover": c.handover, "previous": c.previous}})
                 for c in got], ordered=False)
        return got

    async def release(self, partitions: Iterable[int]) -> None:
        """Give these up at once (the worker stopped publishing them first): a claimer need
        not wait for them to expire."""
        parts = list(partitions)
        self.forget_some(parts)
        if parts:
            await self.leases.update_many(
                {"_id": {"$in": [self.key(p) for p in parts]}, "owner": self.owner},
                {"$set": {"owner": None, "expires_at": _EPOCH,
                          "released_at": self._clock()}})

    async def leave(self) -> None:
        """Graceful stop: release everything and remove the heartbeat."""
        self.forget_some(list(self.held))
        await self.leases.update_many({"scope": self.scope, "owner": self.owner},
                                      {"$set": {"owner": None, "expires_at": _EPOCH,
                                                "released_at": self._clock()}})
        await self.members.delete_one({"_id": self._member_key()})

    def forget_some(self, partitions: Iterable[int]) -> None:
        """Stop counting these as held (a release that failed: they expire by themselves)."""
        for p in partitions:
            self.held.pop(p, None)
            self.not_before.pop(p, None)
            self.epochs.pop(p, None)

    def now(self) -> datetime:
        """The wall clock leases are written and compared with."""
        return self._clock()
