"""The publisher that executes effect entries and publishes the rest (docs/design.md
"Side effects").

The dispatcher hands every batch to its publisher; with effects registered that publisher
is an :class:`EffectRouter` around the configured one (Kafka, JSON Lines, stdout). Records
whose ``type`` has an effect go to the :class:`~dispatcher.effects.runner.EffectRunner`,
the others to the broker — so effects share everything publishing has: partitions and
leases (an entry is executed by the instance holding its partition), per-aggregate order,
retries with backoff, dead letters and the ``$pull`` after success.

Order per aggregate is kept: a document's records are handled in outbox order, and once one
fails retryably the rest of that document is reported retryable without being touched (the
dispatcher retries the document from there). Documents without an effect record go to the
broker in one batch; documents with one are handled concurrently, at most
``concurrency`` at a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

from aggregates.core.reasons import Reason
from aggregates.domain.effects import Effects
from dispatcher.effects.runner import EffectRunner
from dispatcher.publishers.base import Publisher, PublishResult
from dispatcher.publishers.record import OutboundRecord

__all__ = ["EffectRouter"]


class EffectRouter:
    """A :class:`~dispatcher.publishers.base.Publisher` (see the module documentation)."""

    def __init__(self, inner: Publisher, runner: EffectRunner, effects: Effects, *,
                 concurrency: int = 16) -> None:
        self.inner = inner
        self.runner = runner
        self.effects = effects
        self.name = f"{inner.name}+effects"
        self._slots = asyncio.Semaphore(max(1, concurrency))

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    def is_effect(self, record: OutboundRecord) -> bool:
        return record.envelope.get("type") in self.effects

    async def publish(self, records: Sequence[OutboundRecord]) -> list[PublishResult]:
        results: list[PublishResult | None] = [None] * len(records)
        groups: dict[tuple[str, str], list[int]] = {}
        for i, r in enumerate(records):
            groups.setdefault((r.collection, repr(r.document_id)), []).append(i)
        plain: list[int] = []
        mixed: list[list[int]] = []
        for idx in groups.values():
            if any(self.is_effect(records[i]) for i in idx):
                mixed.append(idx)
            else:
                plain.extend(idx)
        plain.sort()

        async def publish_plain() -> None:
            if plain:
                for i, res in zip(plain, await self._inner([records[i] for i in plain]),
                                  strict=True):
                    results[i] = res

        await asyncio.gather(publish_plain(), *(self._document(records, idx, results)
                                                for idx in mixed))
        return [r if r is not None else _NOT_DONE for r in results]

    async def _document(self, records: Sequence[OutboundRecord], idx: list[int],
                        results: list[PublishResult | None]) -> None:
        """One document's records, in order; stops at the first retryable failure."""
        async with self._slots:
            pos = 0
            while pos < len(idx):
                rec = records[idx[pos]]
                if self.is_effect(rec):
                    effect = self.effects.get(str(rec.envelope.get("type")))
                    done = [idx[pos]]
                    outcome = [replace(await self.runner.execute(rec, effect), effect=True)]
                else:
                    end = pos
                    while end < len(idx) and not self.is_effect(records[idx[end]]):
                        end += 1
                    done = idx[pos:end]
                    outcome = await self._inner([records[i] for i in done])
                for i, res in zip(done, outcome, strict=True):
                    results[i] = res
                pos += len(done)
                if any(res.status == "retryable" for res in outcome):
                    for i in idx[pos:]:
                        results[i] = _BLOCKED
                    return

    async def _inner(self, records: list[OutboundRecord]) -> list[PublishResult]:
        try:
            out = await self.inner.publish(records)
        except Exception as exc:  # the interface: raising = the whole batch is retryable
            return [PublishResult.retryable(f"{type(exc).__name__}: {exc}")] * len(records)
        if len(out) != len(records):
            return [PublishResult.retryable(
                f"publisher {self.inner.name} returned {len(out)} results for "
                f"{len(records)} records")] * len(records)
        return out


_BLOCKED = PublishResult.retryable("waits for an earlier entry of its aggregate",
                                   Reason.EFFECT_RETRYABLE)
_NOT_DONE = PublishResult.retryable("not handled", Reason.EFFECT_RETRYABLE)
