"""Entries of effects this instance does not have wait instead of being published
(docs/design.md "Side effects").

Every dispatcher instance writes the effect types it executes into its heartbeat; each lease
round, an instance learns the types that *other live instances* of the collection execute
and it does not (:meth:`FleetEffects.update`). An entry of such a type in one of its
partitions is not published as a record — which would end the effect without ever executing
it — but reported retryable (``effect_not_configured``), and so are the later entries of its
document (per-aggregate order). It waits in the outbox until the configuration matches
(this instance restarted with the effect) or its partition moves to an instance that has it.
An effect configured on no live instance cannot be told from an ordinary message: every
instance must have the same effects (docs/operations.md)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from aggregates.core.reasons import Reason
from dispatcher.publishers.base import Publisher, PublishResult
from dispatcher.publishers.record import OutboundRecord

__all__ = ["EffectGuard", "FleetEffects"]

log = logging.getLogger("aggbox.dispatcher")


class FleetEffects:
    """Per collection: the effect types live instances execute and this one does not."""

    def __init__(self, local: Iterable[str]) -> None:
        self.local = frozenset(local)
        self.missing: dict[str, frozenset[str]] = {}

    def update(self, collection: str, members: Mapping[str, tuple[datetime, frozenset[str]]],
               *, me: str, now: datetime) -> frozenset[str]:
        """Learn from the members read in a lease round (instance → (heartbeat expiry,
        effect types)); returns the types missing here."""
        elsewhere: set[str] = set()
        owners: set[str] = set()
        for instance, (expires, types) in members.items():
            if instance != me and expires > now and types - self.local:
                elsewhere |= types
                owners.add(instance)
        missing = frozenset(elsewhere - self.local)
        if missing != self.missing.get(collection, frozenset()):
            if missing:
                log.error("%s: instance(s) %s execute effect(s) %s that this instance does not "
                          "have: their entries wait here (not published) until this instance "
                          "runs with the same effects (--aggregates module and "
                          "[dispatcher.effects.*] tables)", collection,
                          ", ".join(sorted(owners)), ", ".join(sorted(missing)),
                          extra={"collection": collection})
            else:
                log.info("%s: every live instance has this instance's effects again",
                         collection, extra={"collection": collection})
        self.missing[collection] = missing
        return missing


class EffectGuard:
    """A :class:`~dispatcher.publishers.base.Publisher` around the configured one: entries of
    :attr:`FleetEffects.missing` types (and what follows them in their document) are
    reported retryable instead of being published."""

    def __init__(self, inner: Publisher, fleet: FleetEffects) -> None:
        self.inner = inner
        self.fleet = fleet
        self.name = inner.name

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)  # e.g. the effect router's is_effect

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    async def publish(self, records: Sequence[OutboundRecord]) -> list[PublishResult]:
        missing = self.fleet.missing
        if not any(missing.values()):
            return await self.inner.publish(records)
        held: dict[int, PublishResult] = {}
        blocked: set[tuple[str, str]] = set()
        for i, r in enumerate(records):
            doc = (r.collection, repr(r.document_id))
            etype = str(r.envelope.get("type"))
            if doc in blocked:
                held[i] = _AFTER
            elif etype in missing.get(r.collection, ()):
                blocked.add(doc)
                held[i] = PublishResult.retryable(
                    f"effect {etype} is executed by other instances and is not configured "
                    "on this one; configure the same effects on every instance",
                    Reason.EFFECT_NOT_CONFIGURED)
        send = [r for i, r in enumerate(records) if i not in held]
        results = await self.inner.publish(send) if send else []
        if len(results) != len(send):
            raise RuntimeError(f"publisher {self.inner.name} returned {len(results)} results "
                               f"for {len(send)} records")
        sent = iter(results)
        return [held[i] if i in held else next(sent) for i in range(len(records))]


_AFTER = PublishResult.retryable("waits for an earlier entry of its aggregate",
                                 Reason.EFFECT_NOT_CONFIGURED)
