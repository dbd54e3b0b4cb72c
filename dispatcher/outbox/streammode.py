"""Stream mode of a collection worker: open, follow, restart and checkpoint the change
stream (docs/design.md "The dispatcher", steps 1, 3 and 4).

The stream is opened *before* the sweep that accompanies it (from the saved resume token,
else at the server's current time), so nothing written meanwhile is missed. An unusable
token (codes in :data:`~dispatcher.outbox.stream.TOKEN_UNUSABLE`) means a new stream at the current
time and a full sweep; an ``invalidate`` event a new stream ``start_after`` it and a full
sweep at once; a read error a reopen from the last token (rewound before the failed read).
After each published batch with no retry pending, the resume token is saved — once the
batch's ``$pull`` is done. With ``pulls`` (the worker's cycle), that pull runs on while the
next batches are read and published (a document of the pulled batch stays claimed until
its pull is done: its newer entries wait, dispatcher/outbox/inflight.py); each step raises
the error of a pull that failed and saves the token of the last batch whose pull is done
(at most once a second).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import OperationFailure, PyMongoError

from dispatcher.core.errors import describe_store_error
from dispatcher.core.faults import Faults, InjectedInvalidate
from dispatcher.core.timing import Timing
from dispatcher.observe.metrics import Metrics
from dispatcher.outbox.stream import (
    CHANGE_STREAMS_UNSUPPORTED,
    TOKEN_UNUSABLE,
    Checkpoints,
    StreamBatch,
    StreamFollower,
    latest_documents,
    server_time,
)

__all__ = ["Pulls", "StreamMode"]

log = logging.getLogger("aggbox.dispatcher")

_IDLE_CHECKPOINT_S = 1.0
_CHECKPOINT_EVERY_S = 1.0
_REOPEN_ATTEMPTS = 3


class Pulls(Protocol):
    """The pulls of the worker's cycle (:class:`~dispatcher.outbox.cycle.Cycle`)."""

    pulls_started: int
    pulls_done: int

    async def drain(self) -> None: ...

    async def drain_if_done(self) -> None: ...


class StreamMode:
    """The change stream of one collection, for a worker that holds the lease.

    ``request_sweep(reason)`` asks the worker for a full sweep; ``publish(docs)`` publishes
    documents (and raises when the lease is lost); ``retry_pending()`` says whether some
    documents still wait for a retry (then no checkpoint moves past them)."""

    def __init__(self, db: AsyncDatabase[Any], follower: StreamFollower,
                 checkpoints: Checkpoints, *, name: str, owner: str, faults: Faults,
                 metrics: Metrics, timing: Timing,
                 request_sweep: Callable[[str], None],
                 publish: Callable[[list[Mapping[str, Any]]], Awaitable[None]],
                 retry_pending: Callable[[], bool],
                 on_contact: Callable[[], None],
                 pulls: Pulls | None = None) -> None:
        self.db = db
        self.follower = follower
        self.checkpoints = checkpoints
        self.name = name
        self.owner = owner
        self.faults = faults
        self.metrics = metrics
        self._monotonic = timing.monotonic
        self._request_sweep = request_sweep
        self._publish = publish
        self._retry_pending = retry_pending
        self._contact = on_contact
        self._pulls = pulls
        #: (the pull that carries the batch, the batch's token), oldest first (with pulls)
        self._unsaved: list[tuple[int, Mapping[str, Any]]] = []
        #: the newest token whose batch's pull is done, not saved yet
        self._saveable: Mapping[str, Any] | None = None
        self._last_save = float("-inf")
        #: events read since a token was last remembered
        self._events = 0
        self.restarts = 0
        self.invalidations = 0
        self._start_after: Mapping[str, Any] | None = None
        self._last_idle_checkpoint = 0.0

    # -- opening ------------------------------------------------------------------------
    async def choose(self, setting: str) -> str:
        """The worker's mode: ``stream`` when the change stream opens; ``poll`` when the
        server has none and ``setting`` is ``auto`` (or when it is ``poll``)."""
        if setting not in ("auto", "stream"):
            return "poll"
        try:
            await self.start()
            return "stream"
        except OperationFailure as exc:
            if exc.code not in CHANGE_STREAMS_UNSUPPORTED or setting == "stream":
                raise
            log.warning("%s: the server has no change streams (%s); polling mode",
                        self.name, exc, extra={"collection": self.name})
            return "poll"

    async def start(self) -> None:
        """Open from the checkpoint when there is one (else at the current time) and ask for
        the start-up sweep. Raises ``OperationFailure`` with a code of
        :data:`CHANGE_STREAMS_UNSUPPORTED` on servers without change streams."""
        token = await self.checkpoints.load()
        if token is not None:
            try:
                self.faults.hit("stream_open")
                await self.follower.open(resume_after=token)
                self._request_sweep("startup")
                return
            except OperationFailure as exc:
                if exc.code in CHANGE_STREAMS_UNSUPPORTED:
                    raise
                await self._restart(exc)
                return
        await self._open_at_now("startup")

    async def _open_at_now(self, reason: str) -> None:
        start = await server_time(self.db)
        self.faults.hit("stream_open")
        await self.follower.open(start_at=start)
        self._request_sweep(reason)

    async def _restart(self, exc: OperationFailure) -> None:
        """The token cannot be used: a new stream from now and a full sweep."""
        reason = "history_lost" if exc.code == 286 else "invalid_token"
        self.restarts += 1
        self.metrics.stream_restarts.labels(self.name, reason).inc()
        log.warning("%s: change stream cannot resume (%s, code %s); new stream from now and a "
                    "full sweep", self.name, exc, exc.code,
                    extra={"collection": self.name, "reason": reason})
        await self.follower.close()
        for _ in range(_REOPEN_ATTEMPTS):
            try:
                await self._open_at_now(reason)
                return
            except OperationFailure as again:
                if again.code in CHANGE_STREAMS_UNSUPPORTED:
                    raise
                log.warning("%s: opening a new stream failed: %s", self.name,
                            describe_store_error(again), extra={"collection": self.name})
        await self._open_at_now(reason)

    async def _reopen(self) -> None:
        """After a read error: reopen from the in-memory token (or the saved one). A store
        error is left to the next step (after the backoff)."""
        token = self.follower.resume_token
        try:
            if token is not None:
                await self.follower.open(resume_after=token)
            else:
                await self.start()
        except OperationFailure as exc:
            if exc.code in TOKEN_UNUSABLE:
                await self._restart(exc)
        except PyMongoError:
            pass  # retried after the backoff by the next read

    # -- following ----------------------------------------------------------------------
    async def step(self) -> bool:
        """Read one batch and publish it. ``True`` when events arrived (or the stream had
        to be reopened first)."""
        if not self.follower.is_open:  # reopening failed (store error): try again
            if self._start_after is not None:
                await self._reopen_after_invalidate()
            else:
                await self.start()  # from the checkpoint, with a sweep
            return True
        batch = await self._read()
        if batch is None:
            return True
        if batch.reopen:  # the server's events name no document: look them up from now on
            await self.follower.close()
            await self._reopen()
            return True
        self._observe(batch)
        await self._settle()
        docs = batch.documents
        if batch.to_read:
            docs = [*docs, *await self.follower.fetch(batch.to_read)]
            self._contact()
        self._events += batch.events
        if docs:
            # An event shows the document as it was then (dispatcher/outbox/changes.py) and
            # a read one may predate our last pull: entries published already are
            # recognised by the in-flight set (pulled again, not republished).
            await self._publish(latest_documents(docs))
            if not batch.ended:
                self._events = 0
                await self._remember(self.follower.resume_token)
        elif (self._events and not batch.ended
              and self._monotonic() - self._last_idle_checkpoint > _IDLE_CHECKPOINT_S):
            # Events that published nothing (other partitions, other fields): past them. An
            # idle stream's token moves too (the server's postBatchResumeToken), but saving
            # it would write a checkpoint every second for nothing.
            self._last_idle_checkpoint = self._monotonic()
            self._events = 0
            await self._remember(self.follower.resume_token)
        if batch.ended:
            await self._invalidated(batch.end_token)
        return batch.events > 0

    async def _read(self) -> StreamBatch | None:
        """The next batch; ``None`` after a restart for an unusable token."""
        try:
            self.faults.hit("stream_read")
            return await self.follower.read()
        except InjectedInvalidate:
            return self.follower.end()
        except OperationFailure as exc:
            if exc.code in TOKEN_UNUSABLE:
                await self._restart(exc)
                return None
            await self._reopen()  # the cursor is dead after a server error
            raise
        except PyMongoError:
            await self._reopen()
            raise

    def _observe(self, batch: StreamBatch) -> None:
        if not batch.ended:
            self._contact()
        if batch.newest is not None:
            lag = max(0.0, time.time() - batch.newest.time)
            self.metrics.stream_lag.labels(self.name).set(lag)
        elif batch.events == 0:
            self.metrics.stream_lag.labels(self.name).set(0)

    async def _invalidated(self, token: Mapping[str, Any] | None) -> None:
        """The stream is over (``invalidate``: the collection was dropped or renamed, or the
        server closed the cursor): a new stream after it, and a full sweep at once."""
        self.invalidations += 1
        self.metrics.stream_invalidations.labels(self.name).inc()
        log.warning("%s: change stream invalidated (collection dropped or renamed?); new "
                    "stream after it and a full sweep", self.name,
                    extra={"collection": self.name, "reason": "invalidated"})
        await self.follower.close()
        self._start_after = token
        self._request_sweep("invalidated")
        await self._reopen_after_invalidate()

    async def _reopen_after_invalidate(self) -> None:
        """``start_after`` the invalidate event's token (MongoDB ≥ 4.2; mongo-java-server
        treats it like ``resume_after``); if the server refuses it, or there is no token, a
        new stream at the current time — the sweep that follows covers the gap. A store
        error propagates (backoff); the next step tries again."""
        token = self._start_after
        if token is not None:
            try:
                self.faults.hit("stream_open")
                await self.follower.open(start_after=token)
                self._start_after = None
                self._contact()
                return
            except OperationFailure as exc:
                if exc.code in CHANGE_STREAMS_UNSUPPORTED:
                    raise
                log.warning("%s: cannot start a stream after the invalidate event (%s, code "
                            "%s); new stream from now", self.name, exc, exc.code,
                            extra={"collection": self.name})
        await self._open_at_now("invalidated")
        self._start_after = None
        self._contact()

    # -- checkpoints --------------------------------------------------------------------
    async def _remember(self, token: Mapping[str, Any] | None) -> None:
        """This batch's token, saved once the pulls started so far are done (at once without
        ``pulls``)."""
        if token is None:
            return
        if self._pulls is None:
            if not self._retry_pending():
                await self._save(token)
            return
        self._unsaved.append((self._pulls.pulls_started, token))
        await self._save_pulled()

    async def _settle(self, *, wait: bool = False) -> None:
        """Save the token of the last batch whose pull is done, and raise the error of a
        pull that failed (``wait``: wait for the running one first)."""
        if self._pulls is None:
            return
        try:
            if wait:
                await self._pulls.drain()
            else:
                await self._pulls.drain_if_done()
        finally:
            await self._save_pulled()

    async def _save_pulled(self) -> None:
        """Save the token of the last batch whose pull is done — at most once a second (it
        bounds what a restart reads again; each save is a write to the server)."""
        assert self._pulls is not None
        done = self._pulls.pulls_done
        while self._unsaved and self._unsaved[0][0] <= done:
            self._saveable = self._unsaved.pop(0)[1]
        if (self._saveable is not None and not self._retry_pending()
                and self._monotonic() - self._last_save >= _CHECKPOINT_EVERY_S):
            token, self._saveable = self._saveable, None
            self._last_save = self._monotonic()
            await self._save(token)

    async def checkpoint(self) -> None:
        await self._save(self.follower.resume_token)

    async def _save(self, token: Mapping[str, Any] | None) -> None:
        if await self.checkpoints.save(token, owner=self.owner):
            self._contact()
            self.faults.hit("after_checkpoint")

    async def final_checkpoint(self, *, sweep_pending: bool) -> None:
        """On leaving stream mode: save the token unless a retry or a sweep is pending."""
        try:
            await self._settle(wait=True)
        except PyMongoError as exc:
            log.warning("%s: pull before the final checkpoint failed: %s", self.name,
                        describe_store_error(exc), extra={"collection": self.name})
            return
        if self._retry_pending() or sweep_pending:
            return
        try:
            await self.checkpoint()
        except PyMongoError as exc:
            log.warning("%s: final checkpoint failed: %s", self.name,
                        describe_store_error(exc), extra={"collection": self.name})

    async def close(self) -> None:
        self._unsaved = []  # a later activation never saves a token of this one
        self._saveable = None
        await self.follower.close()
