"""The ``$pull`` of published entries from the outbox (docs/design.md "The dispatcher",
step 3; invariant 2: appends by the writer and these pulls commute)."""

from __future__ import annotations

import logging
from typing import Any, Final

from pymongo import UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import PyMongoError

from aggregates.core.backoff import Backoff
from aggregates.core.storeerrors import is_fatal
from aggregates.fold.document import F_OUTBOX
from dispatcher.core.errors import describe_store_error
from dispatcher.core.timing import Timing, pause

__all__ = ["PULL_ATTEMPTS", "pull_entries"]

log = logging.getLogger("aggbox.dispatcher")

#: Attempts of one ``$pull`` before its error is raised (a fatal error: at once).
PULL_ATTEMPTS: Final = 6


async def pull_entries(coll: AsyncCollection[Any], pulls: list[tuple[Any, list[str]]], *,
                       initial_s: float, max_s: float, timing: Timing) -> None:
    """``$pull`` exactly these ids per document; never touches ``_v``. Retried a few
    times: the entries were published, failing here means publishing them again."""
    if not pulls:
        return
    ops = [UpdateOne({"_id": key}, {"$pull": {F_OUTBOX: {"id": {"$in": ids}}}})
           for key, ids in pulls]
    backoff = Backoff(initial_s, max_s, random=timing.random)
    while True:
        try:
            await coll.bulk_write(ops, ordered=False)
            return
        except PyMongoError as exc:
            if is_fatal(exc) or backoff.attempt + 1 >= PULL_ATTEMPTS:
                raise
            delay = backoff.next()
            log.warning("pull from %s failed (%s); retrying in %.2fs", coll.name,
                        describe_store_error(exc), delay, extra={"collection": coll.name})
            await pause(timing, delay)
