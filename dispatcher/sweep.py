"""Sweeps: find every document with a pending outbox and publish it.

Used at start-up (after the change stream is open, so nothing written meanwhile is missed),
after the stream lost its history, periodically as a safety net, and as the whole loop in
polling mode. Pages by ``_id`` (aggregate ids are strings), so a sweep over a large
collection holds no cursor open while it publishes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection

from aggregates.document import F_OUTBOX, F_TYPE
from dispatcher.cycle import Cycle, CycleResult

__all__ = ["PENDING", "SweepResult", "sweep"]

#: Documents whose outbox has at least one entry (the writer indexes ``outbox.0``).
PENDING: dict[str, Any] = {f"{F_OUTBOX}.0": {"$exists": True}}


@dataclass(slots=True)
class SweepResult:
    documents: int = 0
    cycle: CycleResult = field(default_factory=CycleResult)
    #: every pending document was handled (no retryable failure, lease kept, not stopped)
    complete: bool = True


async def sweep(coll: AsyncCollection[Any], cycle: Cycle, *, page_size: int,
                stop: asyncio.Event | None = None) -> SweepResult:
    out = SweepResult()
    last: Any = None
    try:
        while True:
            query = dict(PENDING)
            if last is not None:
                query["_id"] = {"$gt": last}
            page = await coll.find(query, {F_OUTBOX: 1, F_TYPE: 1}).sort("_id", 1).limit(
                page_size).to_list()
            if not page:
                break
            out.documents += len(page)
            # The page's pull overlaps with reading and publishing the next page.
            res = await cycle.run(page, wait=False)
            out.cycle.add(res)
            if res.retry or res.lease_lost:
                out.complete = False
                break
            if stop is not None and stop.is_set():
                out.complete = False
                break
            if len(page) < page_size:
                break
            last = page[-1]["_id"]
    finally:
        await cycle.drain()
    return out
