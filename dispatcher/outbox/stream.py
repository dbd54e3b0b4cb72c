"""Following a collection's change stream, and the resume-token checkpoints.

Contract with the server (it holds for MongoDB and for mongo-java-server run by aggbox's
launchers; docs/design.md "How stream mode finds new entries"):

- no full-document lookup: an update event is read for its ``documentKey._id`` and its
  ``updateDescription`` (:mod:`dispatcher.outbox.changes` says what it tells and when the
  document is read instead, in one batched ``find`` per read). The pipeline
  (:func:`~dispatcher.outbox.changes.delta_pipeline`) drops the ``$pull`` that empties an
  outbox and leaves out of each event the fields the dispatcher never reads (the state,
  the dedup record, the timers);
- a server whose update events name no document (mongo-java-server's own oplog: its
  ``documentKey`` is the update, it has no ``updateDescription``) is detected at its first
  such event (:class:`~dispatcher.outbox.changes.NoDocumentKey`): the stream is reopened from
  before that read with ``full_document="updateLookup"`` (:data:`LOOKUP_PIPELINE`: matched on
  ``operationType`` and ``fullDocument.outbox``), and stays so;
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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from bson import Timestamp
from pymongo.asynchronous.change_stream import AsyncChangeStream
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import PyMongoError

from dispatcher.core.errors import describe_store_error
from dispatcher.core.timing import REAL_TIME, Timing, pause
from dispatcher.outbox.changes import (
    FETCH_PROJECTION,
    LOOKUP_PIPELINE,
    PIPELINE,
    ChangeSet,
    DocMeta,
    NoDocumentKey,
    delta_pipeline,
    pipeline,
    selected,
)
from dispatcher.publishers.native import pending, scan

__all__ = [
    "CHANGE_STREAMS_UNSUPPORTED",
    "LOOKUP_PIPELINE",
    "PIPELINE",
    "TOKEN_UNUSABLE",
    "Checkpoints",
    "StreamBatch",
    "StreamFollower",
    "delta_pipeline",
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

async def server_time(db: AsyncDatabase[Any], *, round_up: bool = False) -> Timestamp:
    """The server's position: a start point for a new stream, taken *before* the sweep that
    accompanies it, or (``round_up``) the time after which every event is newer than now.

    The ``operationTime`` of a ``ping`` when the server reports one (replica sets, and
    aggbox's launchers of mongo-java-server); else the server's ``localTime`` rounded down
    to the second — replaying a few events rather than missing one — or, ``round_up``, to
    the next second."""
    reply = await db.client.admin.command("ping")
    op_time = reply.get("operationTime")
    if isinstance(op_time, Timestamp):
        return op_time
    hello = await db.client.admin.command("isMaster")
    local = hello.get("localTime")
    seconds = (calendar.timegm(local.utctimetuple()) if isinstance(local, datetime)
               else int(time.time()))
    return Timestamp(seconds + 1 if round_up else seconds, 0)


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
    #: views of the documents the events showed (one per document, in order of its last
    #: event; :mod:`dispatcher.outbox.changes`)
    documents: list[Mapping[str, Any]]
    events: int
    newest: Timestamp | None
    #: the stream is over (an ``invalidate`` event, or the server closed the cursor): open
    #: a new one ``start_after`` :attr:`end_token`
    ended: bool = False
    end_token: Mapping[str, Any] | None = None
    #: documents to read (:meth:`StreamFollower.fetch`) before publishing
    to_read: list[Any] = field(default_factory=list)
    #: the server's events name no document: reopen (with lookup) from before this read
    reopen: bool = False


class StreamFollower:
    """An open change stream on one collection, read in paced batches."""

    def __init__(self, coll: AsyncCollection[Any], *, batch_size: int, pacing_s: float,
                 timing: Timing = REAL_TIME,
                 where: Callable[[], Mapping[str, Any]] = dict,
                 partitions: Callable[[], frozenset[int] | None] = lambda: None,
                 read_coll: AsyncCollection[Any] | None = None) -> None:
        self.coll = coll
        #: the collection documents are read from (raw BSON for the native builder)
        self.read_coll = read_coll if read_coll is not None else coll
        #: extra ``$match`` conditions on the event (the worker's partitions), read at open
        self._where = where
        #: the partitions held (``None``: all), for the documents of update events
        self._partitions = partitions
        #: ``_type`` and ``_p`` of the documents seen
        self.meta = DocMeta()
        #: full-document lookup per event (the fallback for a server whose update events
        #: name no document); set at the first such event, kept
        self.lookup = False
        #: the server's time when the stream was opened: older events are not viewed
        self.fresh_after: Timestamp | None = None
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
        if self.lookup:
            kwargs["full_document"] = "updateLookup"
        self._stream = await self.coll.watch(
            pipeline(self._where(), lookup=self.lookup), batch_size=self.batch_size,
            max_await_time_ms=max(1, int(self.pacing_s * 1000)), **kwargs)
        # Events up to now may show entries a previous owner (or this instance, before)
        # has pulled since: their documents are read, not viewed (changes.py).
        self.fresh_after = await server_time(self.coll.database, round_up=True)

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
        changes = ChangeSet(self.meta, self._partitions, fresh_after=self.fresh_after,
                            looked_up=self.lookup)
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
            try:
                changes.add(event)
            except NoDocumentKey:
                return self._fall_back(start_token)
            if _batch_used_up(self._stream, event):
                break  # the server's batch is used up: publish it now, no extra getMore
            if self.timing.monotonic() - first_at >= self.pacing_s:
                # Without a postBatchResumeToken (mongo-java-server) the end of the batch is
                # not known: reading on until a getMore comes back empty never ends under a
                # steady load, and the batch grew to batch_size (issue 35: 500 events, p50
                # 354 ms at 1,000 entries/s). What came within pacing_s goes out now.
                break
        docs, to_read = changes.resolve()
        if ended:
            self._ended = StreamBatch([], 0, None, ended=True,
                                      end_token=end_token or self._stream.resume_token)
            return StreamBatch(docs, n, newest, ended=True, end_token=self._ended.end_token,
                               to_read=to_read)
        if n == 0:
            await pause(self.timing, self.pacing_s - (self.timing.monotonic() - started))
        return StreamBatch(docs, n, newest, to_read=to_read)

    def _fall_back(self, start_token: Mapping[str, Any] | None) -> StreamBatch:
        """An update event named no document (mongo-java-server's own change events): from
        now on the stream looks documents up; the caller reopens it from before this read
        (the events read so far in it are read again)."""
        self.lookup = True
        if start_token is not None:
            self._rewind = start_token
        log.info("%s: the server's update events name no document (documentKey without "
                 "_id: mongo-java-server's own oplog?); the change stream looks each "
                 "document up instead", self.coll.name, extra={"collection": self.coll.name})
        return StreamBatch([], 1, None, reopen=True)

    async def fetch(self, keys: list[Any]) -> list[Mapping[str, Any]]:
        """The documents ``keys`` (one ``find`` on ``_id`` alone, which any server answers
        from its ``_id`` index), those with pending entries in the partitions held, in the
        order of ``keys``."""
        if not keys:
            return []
        found = {d["_id"]: d for d in (scan(x) for x in await self.read_coll.find(
            {"_id": {"$in": keys}}, FETCH_PROJECTION).to_list())}
        parts = self._partitions()
        out: list[Mapping[str, Any]] = []
        for key in keys:
            doc = found.get(key)
            if doc is None:
                continue
            self.meta.learn(doc)
            if pending(doc) and selected(doc, parts):
                out.append(doc)
        return out

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
