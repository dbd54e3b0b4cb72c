"""``aggbox dispatch --once`` and the partition leases (docs/design.md "The dispatcher",
step 4; issue 44): a run with nothing to publish claims nothing, and every run leaves a
note that ``aggbox dispatch-status`` reads ("no dispatcher running; last --once at …")."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any, Final

from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import PyMongoError

from aggregates.core.keys import join_parts
from aggregates.fold.document import F_OUTBOX, F_TIMERS
from dispatcher.core.errors import check_fatal, describe_store_error

__all__ = ["ONCE_KEY", "note_once", "nothing_to_do"]

log = logging.getLogger("aggbox.dispatcher")

#: The last part of the ``_id`` of a collection's ``--once`` note (members collection).
ONCE_KEY: Final = "--once"


async def nothing_to_do(coll: AsyncCollection[Any]) -> bool:
    """No pending outbox entry and no due timer in the whole collection (every partition:
    whoever holds them, there is nothing to publish), in two indexed reads. A store error
    (but a fatal one, raised): not known — the run goes the usual way."""
    try:
        if await coll.find_one({f"{F_OUTBOX}.0": {"$exists": True}}, {"_id": 1}) is not None:
            return False
        due = {f"{F_TIMERS}.due": {"$lte": datetime.now(UTC)}}
        return await coll.find_one(due, {"_id": 1}) is None
    except PyMongoError as exc:
        check_fatal(exc, coll.name)
        return False


async def note_once(members: AsyncCollection[Any], *, database: str, collection: str,
                    instance: str, now: datetime, published: int, registry: Any) -> None:
    """A ``--once`` run of the collection ended: ``{_id: join_parts(db, collection,
    "--once"), scope, once_at, once_by, published, timers_fired}`` (the timers fired from
    the dispatcher's metrics ``registry``) — no ``member`` field: not an instance (the lease
    rounds and the status read instances by it). A failure is logged (a fatal one
    raised): the run itself went well."""
    fired = registry.get_sample_value("aggbox_dispatcher_timers_fired_total",
                                      {"collection": collection}) or 0
    try:
        await members.update_one(
            {"_id": join_parts(database, collection, ONCE_KEY)},
            {"$set": {"scope": f"{database}.{collection}", "once_at": now,
                      "once_by": instance, "published": published,
                      "timers_fired": int(fired)}}, upsert=True)
    except PyMongoError as exc:
        check_fatal(exc, collection)
        log.warning("%s: could not note the --once run (%s)", collection,
                    describe_store_error(exc), extra={"collection": collection})
