"""The change-stream checks, through the dispatcher's own stream code
(:class:`dispatcher.outbox.stream.StreamFollower`: its ``$match``/``$project`` pipeline, the
events' own outbox or one read of the documents they name, the ``updateLookup`` fallback
where events name no document — docs/design.md "How stream mode finds new entries"; paced
``try_next`` reads; :class:`dispatcher.outbox.stream.Checkpoints` for the stored resume
token). I/O, in the scratch database only.

1. **change stream**: a stream opened at the server's time sees an insert of a document
   with an outbox, then an update that appends to the outbox — the document's outbox, as
   the dispatcher would publish it after that event, holds both entries (only the update's
   event can lead there).
2. **resume**: the token after the insert is stored as the dispatcher stores it, the stream
   closed, one more update made; a stream resumed from the loaded token sees it.

A server that refuses ``$changeStream`` (codes 40573, 40324, 115: standalone, no oplog;
238: not implemented, FerretDB) makes both UNSUPPORTED — the dispatcher in mode ``auto``
polls there."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from pymongo import AsyncMongoClient
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import OperationFailure

from aggbox.checkstore.report import CHANGE_STREAM, CheckResult, Status
from dispatcher.core.errors import describe_store_error
from dispatcher.outbox.stream import (
    CHANGE_STREAMS_UNSUPPORTED,
    TOKEN_UNUSABLE,
    Checkpoints,
    StreamFollower,
    server_time,
)

__all__ = ["EVENT_WAIT_S", "RESUME", "stream_checks"]

RESUME: Final = "resume"
STREAM_TITLE: Final = "change stream (the dispatcher's)"
RESUME_TITLE: Final = "resume after a stored token"
#: How long to wait for an event that should arrive at once.
EVENT_WAIT_S: Final = 15.0
_POLLING: Final = ("dispatcher will poll (mode auto falls back): sweep, publish, pause "
                   "poll_interval_ms — the same guarantees with more latency")


def _result(check: str, status: Status, seen: str, aggbox: str) -> CheckResult:
    title = STREAM_TITLE if check == CHANGE_STREAM else RESUME_TITLE
    return CheckResult(check, title, status, seen, aggbox)


async def stream_checks(uri: str, client_options: Mapping[str, Any], database: str,
                        *, wait_s: float = EVENT_WAIT_S) -> list[CheckResult]:
    """The two change-stream lines (see the module docstring)."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, **client_options)
    try:
        return await _checks(client, database, wait_s)
    finally:
        await client.close()


async def _checks(client: AsyncMongoClient[dict[str, Any]], database: str, wait_s: float
                  ) -> list[CheckResult]:
    db = client[database]
    coll = db["check_stream"]
    await coll.insert_one({"_id": "warm-up"})  # the collection exists before the stream
    follower = StreamFollower(coll, batch_size=100, pacing_s=0.05)
    try:
        await follower.open(start_at=await server_time(db))
        # The first read is where a server without change streams refuses (the open only
        # sends the aggregate on some servers).
        await follower.read()
    except OperationFailure as exc:
        await follower.close()
        if exc.code in CHANGE_STREAMS_UNSUPPORTED:
            seen = f"$changeStream refused: {describe_store_error(exc)}"
            return [_result(CHANGE_STREAM, Status.UNSUPPORTED, seen, _POLLING),
                    _result(RESUME, Status.UNSUPPORTED, "no change streams",
                            "nothing to resume: the dispatcher polls")]
        raise
    try:
        return await _follow(coll, db, follower, wait_s)
    finally:
        await follower.close()


async def _follow(coll: AsyncCollection[dict[str, Any]], db: Any, follower: StreamFollower,
                  wait_s: float) -> list[CheckResult]:
    await coll.insert_one({"_id": "s1", "_v": 1, "_type": "CheckStore", "state": {"n": 1},
                           "outbox": [{"id": "e1"}]})
    if not await _until(follower, lambda d: _ids(d) == ["e1"], wait_s):
        return _broken("the insert of a document with an outbox was not seen within "
                       f"{wait_s:g}s")
    token = follower.resume_token
    saved = Checkpoints(db["check_checkpoints"], key="check_stream")
    await saved.save(token, owner="aggbox-check-store")
    await coll.update_one({"_id": "s1"}, {"$inc": {"_v": 1},
                                          "$push": {"outbox": {"id": "e2"}}})
    if not await _until(follower, lambda d: _ids(d) == ["e1", "e2"], wait_s):
        return _broken("the update appending to the outbox was not seen (the document's "
                       f"outbox e1, e2 after its event) within {wait_s:g}s")
    stream = _result(CHANGE_STREAM, Status.PASS,
                     "insert seen; update seen, the document's outbox (e1, e2) after it, "
                     "through the dispatcher's pipeline ("
                     + ("updateLookup: this server's events name no document)"
                        if follower.lookup else "no lookup per event)"),
                     "the dispatcher follows the stream (mode auto), sweeping only at start "
                     "and every sweep_interval_s")
    await follower.close()
    await coll.update_one({"_id": "s1"}, {"$inc": {"_v": 1},
                                          "$push": {"outbox": {"id": "e3"}}})
    loaded = await Checkpoints(db["check_checkpoints"], key="check_stream").load()
    if loaded is None:
        return [stream, _result(RESUME, Status.FAIL, "the stored resume token could not be "
                                "read back", "the dispatcher cannot keep its checkpoint")]
    try:
        await follower.open(resume_after=loaded)
        resumed = await _until(follower, lambda d: _ids(d) == ["e1", "e2", "e3"], wait_s)
    except OperationFailure as exc:
        if exc.code in TOKEN_UNUSABLE:
            return [stream, _result(
                RESUME, Status.UNSUPPORTED, f"resume refused: {describe_store_error(exc)}",
                "the dispatcher opens a new stream at the current time and sweeps every "
                "pending outbox (slower after a restart; nothing is lost)")]
        raise
    if not resumed:
        return [stream, _result(
            RESUME, Status.UNSUPPORTED, "resumed from the stored token, but the update made "
            f"while the stream was closed was not seen within {wait_s:g}s",
            "the dispatcher sweeps every pending outbox at start, so nothing is lost; "
            "only slower after a restart")]
    return [stream, _result(RESUME, Status.PASS, "token stored as the dispatcher stores its "
                            "checkpoint, loaded, resumed: the update made while the stream "
                            "was closed was seen",
                            "after a restart the dispatcher resumes from its checkpoint")]


def _broken(seen: str) -> list[CheckResult]:
    return [_result(CHANGE_STREAM, Status.FAIL, seen,
                    "in mode auto the dispatcher would follow a stream that misses outboxes "
                    "until its next sweep: set [dispatcher] mode = \"poll\""),
            _result(RESUME, Status.UNSUPPORTED, "not checked: the stream itself failed",
                    "with mode = \"poll\" nothing is resumed")]


def _ids(doc: Mapping[str, Any]) -> list[str]:
    return [str(e.get("id")) for e in doc.get("outbox") or [] if isinstance(e, Mapping)]


async def _until(follower: StreamFollower, wanted: Callable[[Mapping[str, Any]], bool],
                 wait_s: float) -> bool:
    """Read the stream as the dispatcher's stream mode does until a document of ``s1`` it
    would publish from satisfies ``wanted``: the events' views, then one read of the
    documents they name (``to_read``); a server whose events name no document makes the
    follower reopen with ``updateLookup`` from before that read (``reopen``)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        batch = await follower.read()
        if batch.reopen:
            await follower.open(resume_after=follower.resume_token)
            continue
        docs: Sequence[Mapping[str, Any]] = batch.documents
        if batch.to_read:
            docs = [*docs, *await follower.fetch(batch.to_read)]
        if any(d.get("_id") == "s1" and wanted(d) for d in docs):
            return True
        if batch.ended:
            return False
    return False


def stream_failure(seen: str) -> list[CheckResult]:
    """Both lines when the stream checks failed with an unexpected error (``seen``: what
    was seen, one line)."""
    return [_result(CHANGE_STREAM, Status.FAIL, seen,
                    "the dispatcher in mode auto would fail here: set [dispatcher] mode = "
                    "\"poll\", or fix the cause"),
            _result(RESUME, Status.UNSUPPORTED, "not checked: the stream itself failed",
                    "with mode = \"poll\" nothing is resumed")]
