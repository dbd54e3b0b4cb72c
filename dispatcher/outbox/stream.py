"""Following a collection's change stream, and the resume-token checkpoints.

Contract with the server (it holds for MongoDB and for mongo-java-server):

- ``full_document="updateLookup"``; we match on ``operationType`` and
  ``fullDocument.outbox`` only, never on ``updateDescription`` (mongo-java-server has none,
  and on MongoDB ``outbox`` vs ``outbox.N`` keys in ``updatedFields`` are not stable);
- the stream is read with ``try_next`` and a ``batch_size``; after an empty read we pause
  ourselves (``pacing``): mongo-java-server's ``getMore`` answers at once instead of
  waiting, so ``async for`` would spin. On MongoDB ``max_await_time_ms`` makes the server
  wait for the same time and no extra pause is added;
- a plain ``watch()`` fails on mongo-java-server ("operationTime missing"), so a new stream
  always gets ``start_at_operation_time`` (from the server, see :func:`server_time`) or
  ``resume_after``. Resume tokens are opaque: stored and handed back, never inspected;
- an ``invalidate`` event (collection dropped or renamed on MongoDB; it passes any ``$match``)
  ends the stream: the server closes the cursor and nothing more arrives. :meth:`read`
  reports it (``StreamBatch.ended`` with the event's token) and the caller opens a new stream
  ``start_after`` that token. mongo-java-server never sends one (its streams survive a drop);
  tests inject it with the fault rule ``stream_read:invalidate``.
"""

from __future__ import annotations

import calendar
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from bson import Timestamp
from pymongo.asynchronous.change_stream import AsyncChangeStream
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import PyMongoError

from aggregates.fold.document import F_OUTBOX, F_PARTITION, F_TYPE
from dispatcher.core.errors import describe_store_error
from dispatcher.core.timing import REAL_TIME, Timing, pause

__all__ = [
    "CHANGE_STREAMS_UNSUPPORTED",
    "PIPELINE",
    "TOKEN_UNUSABLE",
    "Checkpoints",
    "StreamBatch",
    "StreamFollower",
    "latest_documents",
    "pipeline",
    "server_time",
]

log = logging.getLogger("aggbox.dispatcher")

#: Server error codes meaning "this resume token cannot be used any more": history lost
#: (286), fatal change-stream error (280), invalid resume token (260), bad value/parse (2, 9).
TOKEN_UNUSABLE: Final = frozenset({286, 280, 260, 2, 9})
#: "$changeStream is only supported on replica sets" and friends: poll instead (238
#: NotImplemented: FerretDB's '`aggregate` stage "$changeStream" is not implemented yet').
CHANGE_STREAMS_UNSUPPORTED: Final = frozenset({40573, 40324, 115, 238})

PIPELINE: Final[list[dict[str, Any]]] = [
    {"$match": {
        "operationType": {"$in": ["insert", "update", "replace"]},
        f"fullDocument.{F_OUTBOX}.0": {"$exists": True},
    }},
    # Only what the dispatcher reads: the looked-up document's id, type and outbox (its
    # state, dedup record … are neither sent nor decoded), and the event's own fields.
    {"$project": {"operationType": 1, "clusterTime": 1, "fullDocument._id": 1,
                  f"fullDocument.{F_TYPE}": 1, f"fullDocument.{F_OUTBOX}": 1,
                  f"fullDocument.{F_PARTITION}": 1}},
]


def pipeline(where: Mapping[str, Any]) -> list[dict[str, Any]]:
    """:data:`PIPELINE` with ``where`` added to its ``$match``."""
    if not where:
        return PIPELINE
    return [{"$match": {**PIPELINE[0]["$match"], **where}}, *PIPELINE[1:]]


async def server_time(db: AsyncDatabase[Any]) -> Timestamp:
    """A start point for a new stream, taken *before* the sweep that accompanies it.

    The ``operationTime`` of a ``ping`` when the server reports one (replica sets); else
    (mongo-java-server) the server's ``localTime`` rounded down to the second — replaying a
    few events rather than missing one."""
    reply = await db.client.admin.command("ping")
    op_time = reply.get("operationTime")
    if isinstance(op_time, Timestamp):
        return op_time
    hello = await db.client.admin.command("isMaster")
    local = hello.get("localTime")
    if isinstance(local, datetime):
        return Timestamp(calendar.timegm(local.utctimetuple()), 0)
    return Timestamp(int(time.time()), 0)


class Checkpoints:
    """Resume tokens in ``aggbox_dispatcher_checkpoints``, one document per collection."""

    def __init__(self, coll: AsyncCollection[Any], key: str | None) -> None:
        self.coll = coll
        #: ``None``: nothing is stored (a worker publishing a share of the partitions)
        self.key = key
        self._last: Any = None

    async def load(self) -> Mapping[str, Any] | None:
        if self.key is None:
            self._last = None
            return None
        doc = await self.coll.find_one({"_id": self.key})
        token = doc.get("token") if doc else None
        self._last = token
        return token if isinstance(token, Mapping) else None

    async def save(self, token: Mapping[str, Any] | None, *, owner: str) -> bool:
        """Persist ``token`` unless it is the one saved last. ``True`` when written."""
        if token is None or token == self._last:
            return False
        if self.key is None:
            self._last = dict(token)
            return False
        await self.coll.update_one(
            {"_id": self.key},
            {"$set": {"token": dict(token), "owner": owner, "updated_at": datetime.now(UTC)}},
            upsert=True,
        )
        self._last = dict(token)
        return True

    async def clear(self) -> None:
        if self.key is not None:
            await self.coll.delete_one({"_id": self.key})
        self._last = None


@dataclass(slots=True)
class StreamBatch:
    documents: list[Mapping[str, Any]]
    events: int
    newest: Timestamp | None
    #: the stream is over (an ``invalidate`` event, or the server closed the cursor): open
    #: a new one ``start_after`` :attr:`end_token`
    ended: bool = False
    end_token: Mapping[str, Any] | None = None


class StreamFollower:
    """An open change stream on one collection, read in paced batches."""

    def __init__(self, coll: AsyncCollection[Any], *, batch_size: int, pacing_s: float,
                 timing: Timing = REAL_TIME,
                 where: Callable[[], Mapping[str, Any]] = dict) -> None:
        self.coll = coll
        #: extra ``$match`` conditions on the event (the worker's partitions), read at open
        self._where = where
        self.batch_size = batch_size
        self.pacing_s = pacing_s
        self.timing = timing
        self._stream: AsyncChangeStream[Any] | None = None
        self._rewind: Mapping[str, Any] | None = None  # token to resume from after a failed read
        self._ended: StreamBatch | None = None  # set once the stream is over
        self.reads = 0  #: calls of :meth:`read` (tests check the pacing with it)

    @property
    def is_open(self) -> bool:
        return self._stream is not None

    async def open(self, *, resume_after: Mapping[str, Any] | None = None,
                   start_after: Mapping[str, Any] | None = None,
                   start_at: Timestamp | None = None) -> None:
        await self.close()
        self._rewind = None
        self._ended = None
        kwargs: dict[str, Any] = {}
        if start_after is not None:
            kwargs["start_after"] = start_after
        elif resume_after is not None:
            kwargs["resume_after"] = resume_after
        else:
            kwargs["start_at_operation_time"] = start_at
        self._stream = await self.coll.watch(
            pipeline(self._where()), full_document="updateLookup", batch_size=self.batch_size,
            max_await_time_ms=max(1, int(self.pacing_s * 1000)), **kwargs)

    @property
    def resume_token(self) -> Mapping[str, Any] | None:
        if self._rewind is not None:
            return self._rewind
        return self._stream.resume_token if self._stream is not None else None

    async def read(self) -> StreamBatch:
        """Up to ``batch_size`` events — what one ``getMore`` returned, not more (a server
        that does not say where its batch ends: what came within ``pacing_s`` of the first
        event, see below); waits at most about ``pacing_s`` when there are none (never
        spins)."""
        assert self._stream is not None, "open() first"
        self.reads += 1
        started = self.timing.monotonic()
        if self._ended is not None:  # nothing more will come (never spin on it either)
            await pause(self.timing, self.pacing_s)
            return self._ended
        docs: list[Mapping[str, Any]] = []
        newest: Timestamp | None = None
        n = 0
        start_token = self._stream.resume_token
        end_token: Mapping[str, Any] | None = None
        ended = False
        first_at = 0.0
        while n < self.batch_size:
            try:
                event = await self._stream.try_next()
            except Exception:
                # The events read so far in this batch are dropped with the exception: make
                # the next open() resume from before them, so none is skipped.
                if n and start_token is not None:
                    self._rewind = start_token
                raise
            if event is None:
                ended = not self._stream.alive  # the server closed the cursor
                break
            n += 1
            if n == 1:
                first_at = self.timing.monotonic()
            ct = event.get("clusterTime")
            if isinstance(ct, Timestamp):
                newest = ct
            if event.get("operationType") == "invalidate":
                ended = True
                token = event.get("_id")
                end_token = token if isinstance(token, Mapping) else None
                break
            doc = event.get("fullDocument")
            if isinstance(doc, Mapping) and doc.get(F_OUTBOX):
                docs.append(doc)
            if _batch_used_up(self._stream, event):
                break  # the server's batch is used up: publish it now, no extra getMore
            if self.timing.monotonic() - first_at >= self.pacing_s:
                # Without a postBatchResumeToken (mongo-java-server) the end of the batch is
                # not known: reading on until a getMore comes back empty never ends under a
                # steady load, and the batch grew to batch_size (issue 35: 500 events, p50
                # 354 ms at 1,000 entries/s). What came within pacing_s goes out now.
                break
        if ended:
            self._ended = StreamBatch([], 0, None, ended=True,
                                      end_token=end_token or self._stream.resume_token)
            return StreamBatch(docs, n, newest, ended=True, end_token=self._ended.end_token)
        if n == 0:
            await pause(self.timing, self.pacing_s - (self.timing.monotonic() - started))
        return StreamBatch(docs, n, newest)

    def end(self) -> StreamBatch:
        """Make the stream behave as after an ``invalidate`` event at its current position
        (fault injection: mongo-java-server never invalidates)."""
        token = self.resume_token
        self._ended = StreamBatch([], 0, None, ended=True, end_token=token)
        return StreamBatch([], 1, None, ended=True, end_token=token)

    async def close(self) -> None:
        self._ended = None
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                await stream.close()
            except PyMongoError as exc:  # a broken cursor must not mask the error
                log.info("closing a change stream failed (%s); the server drops it by "
                         "itself", describe_store_error(exc))


def _batch_used_up(stream: AsyncChangeStream[Any], event: Mapping[str, Any]) -> bool:
    """``True`` when ``event`` was the last one of the server's batch (known only when the
    server sends a ``postBatchResumeToken``, as MongoDB does).

    Reading on after the batch is used up costs a ``getMore`` that, on MongoDB, waits up to
    ``max_await_time_ms`` for nothing — latency for every entry of the batch. The change
    streams specification (and ``ChangeStream.resume_token``'s documentation) says the
    cached token is the event's own ``_id`` while events of the batch remain, and the
    batch's ``postBatchResumeToken`` once its last event was returned: a token other than
    the event's ``_id`` means nothing more is buffered. When the two happen to be equal (or
    the server sends none, as mongo-java-server), reading goes on: one ``getMore`` more."""
    token = event.get("_id")
    return token is not None and stream.resume_token is not None \
        and stream.resume_token != token


def latest_documents(docs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One document per ``_id``, the last one seen, in order of last appearance."""
    by_id: dict[Any, Mapping[str, Any]] = {}
    for d in docs:
        key = d.get("_id")
        by_id.pop(key, None)
        by_id[key] = d
    return list(by_id.values())
