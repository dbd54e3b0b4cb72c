"""Partition leases and member heartbeats of one collection, as stored (docs/design.md
"Scale-out: partitions and leases"; the rule deciding what to claim or release is
:mod:`dispatcher.leases.balance`).

Two collections, one document per (collection, partition) and per (collection, member):

- members ``{_id: join_parts(db, collection, member), scope, instance, member, host, pid,
  started_at, heartbeat_at, expires_at, partitions, published, effects}``: the heartbeat,
  and the validity of every lease the member holds. ``member`` is the instance id, with
  ``#<n>`` appended for the n-th incarnation (n ≥ 2) after a heartbeat lapsed;
  ``effects``: the effect types the instance executes (dispatcher/effects/guard.py);
- leases ``{_id: join_parts(db, collection, str(p)), scope, partition, owner (a member;
  None once released), epoch, since, previous, handover, handed_at, released_by,
  released_at}``: ``epoch`` is incremented by every claim — the fencing token that
  publishes carry. A lease is live while its owner's heartbeat is.

A renewal round writes one document — the heartbeat — however many partitions the member
holds; a lease document is written only when it changes hands (claim, release, takeover).
The heartbeat is extended only while it still has more than ``margin · ttl`` to run on the
member's own clock (a conditional update); once it lapsed, the member never extends it
again, drops every lease and starts over under a new member name, so the leases of the
lapsed name stay free for anyone. A claim is a compare-and-set on the lease's (owner,
epoch) as read, made only when the owner is not a live member: as long as the hosts'
clocks agree within ``margin · ttl``, a member whose heartbeat a claimer saw expired can no
longer extend it (docs/design.md gives the argument), so the store never has two live
owners for one partition. The holder counts its leases as held until ``ttl`` after it
*sent* its last successful heartbeat, minus the margin (:func:`dispatcher.leases.balance.
valid_until`), so it stops before a claimer may take them over. A lease taken over from a
member whose heartbeat expired (not released) is published only ``grace_s`` after the
claim: time for whatever the previous holder had already handed to its producer to settle.
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
from pymongo.errors import BulkWriteError, OperationFailure

from aggregates.core.keys import join_parts
from aggregates.core.partitions import F_PARTITION, PARTITIONS
from dispatcher.leases.balance import LeaseView, valid_until

__all__ = ["CLAIM_INDEX", "Claimed", "HeartbeatLapsed", "PartitionLeases", "default_instance_id"]

#: The name of the claim index on the lease collection (:meth:`PartitionLeases.ensure`).
CLAIM_INDEX = "aggbox_lease_claim"

log = logging.getLogger("aggbox.dispatcher.lease")

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


@dataclass(frozen=True, slots=True)
class HeartbeatLapsed:
    """The heartbeat could not be extended: it had (nearly) expired. Every lease of
    ``member`` is gone; the instance continues as ``rejoined``."""

    member: str
    rejoined: str
    #: seconds since the last successful heartbeat was sent (None: never sent one)
    since_last_s: float | None
    held: int


#: How long a member document stays after its heartbeat expired (so ``aggbox
#: dispatch-status`` shows a killed instance as DEAD for a while), at least.
DEAD_MEMBER_RETENTION_S = 300.0


class PartitionLeases:
    """The leases of one collection's partitions, from the point of view of one instance.

    ``owner`` is the name the instance holds leases under (its current incarnation)."""

    def __init__(self, leases: AsyncCollection[Any], members: AsyncCollection[Any], *,
                 database: str, collection: str, owner: str, ttl_s: float,
                 grace_s: float = 0.0, margin: float = 0.2, partitions: int = PARTITIONS,
                 clock: Callable[[], datetime] = _utc_now,
                 monotonic: Callable[[], float] = time.monotonic,
                 effect_types: Iterable[str] = ()) -> None:
        self.leases = leases
        #: the effect types this instance executes, announced in its heartbeat
        self.effect_types = frozenset(effect_types)
        #: from the last :meth:`read`: member → (heartbeat expiry, its effect types)
        self.member_effects: dict[str, tuple[datetime, frozenset[str]]] = {}
        self.members = members
        self.database = database
        self.collection = collection
        self.scope = f"{database}.{collection}"
        #: the instance id as configured; ``owner`` adds the incarnation
        self.instance = owner
        self.incarnation = 1
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
        #: partition → who released it last (from the last :meth:`read`)
        self.released_by: dict[int, str] = {}
        self.started_at = clock()
        #: monotonic time the last successful heartbeat was sent; None before the first
        self.last_heartbeat_sent: float | None = None
        #: round trip of the last successful heartbeat (seconds)
        self.last_round_trip_s: float | None = None
        self.retention_s = max(DEAD_MEMBER_RETENTION_S, 10 * ttl_s)
        self._registered = False
        self._ensured = False

    def key(self, partition: int) -> str:
        return join_parts(self.database, self.collection, str(partition))

    def _member_key(self, member: str | None = None) -> str:
        return join_parts(self.database, self.collection, member or self.owner)

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

    def fence(self, doc: Mapping[str, Any], scope: str) -> str | None:
        """The ``fence`` header of a document's records (:mod:`aggregates.wire.fence`):
        ``scope`` (``<database>.<collection>``), the document's partition (0 without ``_p``)
        and the epoch of our lease on it — ``None`` unless that lease counts as held right
        now (the cycle compares it again before the ``$pull``)."""
        p = doc.get(F_PARTITION, 0)
        if not isinstance(p, int) or not self.holds((p,)):
            return None
        epoch = self.epochs.get(p)
        return None if epoch is None else f"{scope}/{p}:{epoch}"

    def next_grace_end(self) -> float | None:
        now = self._monotonic()
        ends = [t for t in self.not_before.values() if t > now]
        return min(ends) if ends else None

    def lease_valid_until(self) -> float | None:
        """Until when (monotonic) the leases held count, from the last heartbeat."""
        if self.last_heartbeat_sent is None:
            return None
        return valid_until(self.last_heartbeat_sent, self.ttl_s, self.margin)

    # -- store round trips -------------------------------------------------------------------
    async def ensure(self) -> None:
        """Create the lease documents that do not exist yet (free). Idempotent; racing
        instances collide on ``_id`` harmlessly."""
        if self._ensured:
            return
        docs = [{"_id": self.key(p), "scope": self.scope, "partition": p, "owner": None,
                 "epoch": 0} for p in range(self.partitions)]
        await self._claim_index()
        existing = {d["_id"] async for d in self.leases.find({"scope": self.scope}, {"_id": 1})}
        missing = [d for d in docs if d["_id"] not in existing]
        if missing:
            try:
                await self.leases.insert_many(missing, ordered=False)
            except BulkWriteError as exc:
                if any(e.get("code") != 11000 for e in exc.details.get("writeErrors", [])):
                    raise
        self._ensured = True

    async def _claim_index(self) -> None:
        """The unique index ``{_id, owner, epoch}`` (a claim's filter, which mongo-java-server
        otherwise answers by scanning: issue 44); redundant on MongoDB; refused: left."""
        try:
            await self.leases.create_index([("_id", 1), ("owner", 1), ("epoch", 1)],
                                           unique=True, name=CLAIM_INDEX)
        except OperationFailure as exc:
            log.debug("%s: no claim index (%s)", self.scope, exc)

    def _heartbeat_fields(self, now: datetime, published: int) -> dict[str, Any]:
        return {"scope": self.scope, "instance": self.instance, "member": self.owner,
                "host": socket.gethostname(), "pid": os.getpid(), "heartbeat_at": now,
                "expires_at": now + timedelta(seconds=self.ttl_s),
                "partitions": sorted(self.held), "published": published,
                "effects": sorted(self.effect_types)}

    async def heartbeat(self, *, published: int = 0) -> HeartbeatLapsed | None:
        """Extend this member's heartbeat — the validity of every lease it holds — with one
        conditional write. Returns what happened when it had lapsed (the instance then
        continues under a new member name, holding nothing)."""
        sent = self._monotonic()
        now = self._clock()
        fields = self._heartbeat_fields(now, published)
        lapsed: HeartbeatLapsed | None = None
        if self._registered:
            # Only while more than the margin is left on our own clock: a claimer that saw
            # the heartbeat expired on its clock (at most margin·ttl ahead) can then be sure
            # it is never extended again (docs/design.md "Scale-out").
            result = await self.members.update_one(
                {"_id": self._member_key(), "member": self.owner,
                 "expires_at": {"$gt": now + timedelta(seconds=self.margin * self.ttl_s)}},
                {"$set": fields})
            if result.matched_count == 1:
                self._renewed(sent)
                return None
            lapsed = self._rejoin(sent)
            fields = self._heartbeat_fields(now, published)
        await self.members.update_one(
            {"_id": self._member_key()},
            {"$set": fields, "$setOnInsert": {"started_at": self.started_at}}, upsert=True)
        self._registered = True
        self._renewed(sent)
        return lapsed

    def _renewed(self, sent: float) -> None:
        self.last_heartbeat_sent = sent
        self.last_round_trip_s = max(0.0, self._monotonic() - sent)

    def _rejoin(self, sent: float) -> HeartbeatLapsed:
        """The heartbeat lapsed: drop everything, continue as the next incarnation."""
        before = self.owner
        since = None if self.last_heartbeat_sent is None else sent - self.last_heartbeat_sent
        held = len(self.held)
        self.forget_some(list(self.held))
        self.incarnation += 1
        self.owner = f"{self.instance}#{self.incarnation}"
        self.last_heartbeat_sent = None
        log.debug("%s: heartbeat of %s lapsed; continuing as %s", self.scope, before,
                  self.owner)
        return HeartbeatLapsed(before, self.owner, since, held)

    async def read(self) -> tuple[dict[str, datetime], dict[int, LeaseView]]:
        """Members (member → heartbeat expiry, live or not) and every lease of the scope,
        each lease's expiry being its owner's heartbeat expiry (None: no such member).
        Member documents expired for longer than the retention are removed (a write only
        when there are some)."""
        members: dict[str, datetime] = {}
        effects: dict[str, tuple[datetime, frozenset[str]]] = {}
        now = self._clock()
        stale: list[Any] = []
        async for m in self.members.find({"scope": self.scope},
                                         {"instance": 1, "member": 1, "expires_at": 1,
                                          "effects": 1}):
            exp = _aware(m.get("expires_at"))
            name = m.get("member", m.get("instance"))
            if not isinstance(name, str) or exp is None:
                continue
            if exp + timedelta(seconds=self.retention_s) < now and name != self.owner:
                stale.append(m["_id"])
                continue
            members[name] = exp
            types = m.get("effects")
            effects[name] = (exp, frozenset(t for t in types if isinstance(t, str))
                             if isinstance(types, list) else frozenset())
        self.member_effects = effects
        leases: dict[int, LeaseView] = {}
        released: dict[int, str] = {}
        async for d in self.leases.find({"scope": self.scope},
                                        {"partition": 1, "owner": 1, "epoch": 1,
                                         "released_by": 1}):
            p = d.get("partition")
            if isinstance(p, int) and 0 <= p < self.partitions:
                owner = d.get("owner")
                owner = owner if isinstance(owner, str) else None
                leases[p] = LeaseView(p, owner, members.get(owner) if owner else None,
                                      int(d.get("epoch") or 0))
                if isinstance(d.get("released_by"), str):
                    released[p] = d["released_by"]
        self.released_by = released
        if stale:
            await self.members.delete_many(
                {"_id": {"$in": stale},
                 "expires_at": {"$lt": now - timedelta(seconds=self.retention_s)}})
        return members, leases

    def confirm(self, leases: Mapping[int, LeaseView]) -> set[int]:
        """After :meth:`heartbeat` and :meth:`read`: the leases the store says are ours are
        held until the heartbeat's validity ends; the others are dropped. Returns the
        partitions lost since the last round."""
        ours = {p for p, v in leases.items() if v.owner == self.owner}
        lost = set(self.held) - ours
        until = self.lease_valid_until()
        self.held = {p: until for p in ours} if until is not None else {}
        for p in lost:
            self.not_before.pop(p, None)
            self.epochs.pop(p, None)
        for p in ours:
            self.epochs[p] = leases[p].epoch
        return lost

    async def claim(self, wanted: Iterable[int], seen: Mapping[int, LeaseView]
                    ) -> list[Claimed]:
        """Try to take ``wanted`` (free as of ``seen``: no owner, or an owner whose heartbeat
        expired): one compare-and-set per lease on the (owner, epoch) read, all in one
        unordered bulk write; then read back which succeeded."""
        until = self.lease_valid_until()
        if until is None or until <= self._monotonic():
            return []  # no heartbeat to hold them under
        chosen: dict[int, Claimed] = {}
        ops = []
        now = self._clock()
        for p in wanted:
            before = seen.get(p)
            if before is None:
                continue  # no lease document (ensure() creates them all): next round
            if before.owner is None:
                kind = "new" if before.epoch == 0 else "released"
                previous = self.released_by.get(p) if kind == "released" else None
            else:
                kind, previous = "expired", before.owner
            chosen[p] = Claimed(p, before.epoch + 1, kind, previous)
            ops.append(UpdateOne(
                {"_id": self.key(p), "owner": before.owner, "epoch": before.epoch},
                {"$set": {"owner": self.owner, "since": now, "handed_at": now,
                          "handover": kind, "previous": previous},
                 "$inc": {"epoch": 1}}))
        if not ops:
            return []
        sent = self._monotonic()
        await self.leases.bulk_write(ops, ordered=False)
        got: list[Claimed] = []
        async for d in self.leases.find({"_id": {"$in": [self.key(p) for p in chosen]},
                                         "owner": self.owner}, {"partition": 1, "epoch": 1}):
            p = int(d["partition"])
            c = chosen.get(p)
            if c is None or int(d.get("epoch") or 0) != c.epoch:
                continue
            got.append(c)
            self.held[p] = until
            self.epochs[p] = c.epoch
            if c.handover == "expired" and self.grace_s > 0:
                self.not_before[p] = sent + self.grace_s
        return got

    async def release(self, partitions: Iterable[int]) -> None:
        """Give these up at once (the worker stopped publishing them first): a claimer need
        not wait for them to expire."""
        parts = list(partitions)
        self.forget_some(parts)
        if parts:
            await self.leases.update_many(
                {"_id": {"$in": [self.key(p) for p in parts]}, "owner": self.owner},
                {"$set": {"owner": None, "released_by": self.owner,
                          "released_at": self._clock()}})

    async def leave(self) -> None:
        """Graceful stop: release everything and remove the heartbeat."""
        self.forget_some(list(self.held))
        await self.leases.update_many({"scope": self.scope, "owner": self.owner},
                                      {"$set": {"owner": None, "released_by": self.owner,
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
