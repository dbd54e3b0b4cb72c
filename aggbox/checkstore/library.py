"""The checks that send aggbox's own writes (I/O, in the scratch database only), built by the
library's own code rather than by hand, so a server that ignores an operator the library
relies on fails here:

- **inbox window** — :func:`aggregates.store.update.build_update` with the
  :class:`~aggregates.dedup.inbox.Inbox` strategy's changes: the insert of a new document
  (:func:`~aggregates.store.update.inserted_document`, what ``$setOnInsert`` would write),
  then the conditional update whose ``$push`` keeps the window with ``$slice``; both through
  the writer's unordered bulk (:func:`aggregates.core.bulk.bulk_write_unordered`);
- **$setOnInsert** — :class:`aggregates.store.deadletters.DeadLetterStore` records one dead
  letter twice: ``first_seen`` only on insert, ``last_seen`` and ``attempts`` on both;
- **$pull** — :func:`dispatcher.outbox.pull.pull_entries`, the dispatcher's removal of published
  outbox entries: exactly the ids given, ``_v`` untouched.

:func:`window_outcome` and :func:`pull_outcome` judge what was read back (pure)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from aggbox.checkstore.report import Status

__all__ = ["WINDOW", "inbox_window", "outbox_pull", "pull_outcome", "set_on_insert",
           "window_outcome"]

Outcome = tuple[Status, str, str]

#: The window of the probe type: 2 ids inserted, then 3 more appended → the newest 3 stay.
WINDOW: Final = 3
_T0: Final = datetime(2026, 1, 1, tzinfo=UTC)


def _ids(entries: Any) -> list[str]:
    """The ids of inbox entries (``[id, time, hash]``; a bare id as itself)."""
    return [str(e[0]) if isinstance(e, list | tuple) and e else str(e) for e in entries or []]


def window_outcome(stored: Mapping[str, Any] | None, expected: Mapping[str, Any]) -> Outcome:
    """Compare the document the two writes left with the one aggbox computed (``expected``:
    field → value; for the inbox and the outbox, their ids)."""
    from aggregates.fold.document import F_INBOX, F_OUTBOX

    doc = stored or {}
    got: dict[str, Any] = {
        k: _ids(doc.get(k)) if k == F_INBOX else
        [str(e.get("id")) for e in doc.get(k) or [] if isinstance(e, Mapping)]
        if k == F_OUTBOX else doc.get(k) for k in expected}
    wrong = [k for k, v in expected.items() if got[k] != v]
    want: list[str] = list(expected[F_INBOX])
    if not wrong:
        return (Status.PASS, f"the writer's insert, then its update with $push $each $slice "
                f"-{len(want)}: the inbox keeps the newest {len(want)} ids "
                f"({', '.join(want)}); type, partition and layout as inserted",
                "the inbox stays within its window; older ids move to the archive")
    parts = []
    if F_INBOX in wrong:
        held: list[str] = got[F_INBOX]
        why = " ($slice ignored)" if len(held) > len(want) and held[-len(want):] == want else ""
        parts.append(f"inbox holds {len(held)} ids {held}{why}, expected {want}")
    parts += [f"{k} is {got[k]!r}, expected {expected[k]!r}" for k in wrong if k != F_INBOX]
    return (Status.FAIL, "; ".join(parts),
            "the inbox would grow past its window up to the document size budget, and the "
            "archive's floor would not match what the document holds")


def inbox_window(ctx: Any) -> Outcome:
    from aggbox.checkstore.logic import Probe
    from aggregates import AggregateType, Inbox
    from aggregates.core.bulk import bulk_write_unordered
    from aggregates.core.partitions import partition_of
    from aggregates.dedup.core import DedupRecord
    from aggregates.fold.document import (
        F_INBOX,
        F_LAYOUT_VERSION,
        F_OUTBOX,
        F_PARTITION,
        F_TYPE,
        F_VERSION,
        LAYOUT_VERSION,
        Snapshot,
        snapshot_from_document,
    )
    from aggregates.fold.result import Changes
    from aggregates.store.update import build_update

    inbox = Inbox(window=WINDOW)
    atype = AggregateType("CheckStoreWindow", state=Probe, collection="check_window",
                          dedup=inbox)
    coll = ctx.db["check_window"]
    rec = DedupRecord()
    for i in (1, 2):
        rec.add_inbox([f"m{i}", _T0 + timedelta(seconds=i), f"h{i}"])
    new = build_update(atype, Snapshot("w"),
                       Changes(state={"n": 2}, dedup=inbox.changes(rec), outbox=[{"id": "e1"}]))
    errors = bulk_write_unordered(coll, [new])
    if errors:
        return (Status.FAIL, f"the writer's insert of a new document (inbox entries are "
                f"[id, time, hash] arrays) was refused: code {errors[0].code}: "
                f"{errors[0].message}", "the writer cannot store a new aggregate")
    snap = snapshot_from_document(coll.find_one({"_id": "w"}), "w")
    for i in (3, 4, 5):
        snap.dedup.add_inbox([f"m{i}", _T0 + timedelta(seconds=i), f"h{i}"])
    update = build_update(atype, snap, Changes(state={"n": 5}, dedup=inbox.changes(snap.dedup),
                                               outbox=[{"id": "e2"}]))
    errors = bulk_write_unordered(coll, [update])
    if errors:
        return (Status.FAIL, f"the writer's conditional update was refused: code "
                f"{errors[0].code}: {errors[0].message}", "the writer cannot store a fold")
    expected = {F_VERSION: 2, F_TYPE: atype.name, F_PARTITION: partition_of("w"),
                F_LAYOUT_VERSION: LAYOUT_VERSION, F_INBOX: ["m3", "m4", "m5"],
                F_OUTBOX: ["e1", "e2"]}
    return window_outcome(coll.find_one({"_id": "w"}), expected)


def set_on_insert(ctx: Any) -> Outcome:
    from aggregates.fold.result import DeadLetter
    from aggregates.message.envelope import Message
    from aggregates.store.deadletters import DeadLetterStore, dead_letter_id

    store = DeadLetterStore(ctx.db, collection="check_set_on_insert")
    msg = Message.from_dict({"message_id": "m1", "aggregate_type": "CheckStore",
                             "aggregate_id": "a1", "type": "Probe", "payload": {}})
    letter = DeadLetter(msg, None, "handler_error", "probe")
    first, second = _T0, _T0 + timedelta(minutes=1)
    store.write([letter], now=first)
    store.write([letter], now=second)
    doc = ctx.db["check_set_on_insert"].find_one({"_id": dead_letter_id(letter)}) or {}
    got = (_naive(doc.get("first_seen")), _naive(doc.get("last_seen")), doc.get("attempts"))
    seen = (f"one dead letter recorded twice (an upsert with $setOnInsert first_seen, $set "
            f"last_seen, $inc attempts): first_seen {_show(got[0])}, last_seen "
            f"{_show(got[1])}, attempts {got[2]!r}")
    if got == (_naive(first), _naive(second), 2):
        return (Status.PASS, seen, "dead letters, parked messages and effect attempts keep "
                "when they were first seen")
    return (Status.FAIL, seen + f" (expected {_show(first)}, {_show(second)}, 2)",
            "upserts of side records (dead letters, parked, effect attempts) would lose or "
            "never set what $setOnInsert writes")


def _naive(value: Any) -> Any:
    return value.replace(tzinfo=None) if isinstance(value, datetime) else value


def _show(value: Any) -> str:
    return value.strftime("%H:%M:%S") if isinstance(value, datetime) else repr(value)


def pull_outcome(before: Sequence[str], pulled: Sequence[str], doc: Mapping[str, Any] | None
                 ) -> Outcome:
    """Judge the document after the dispatcher pulled ``pulled`` from ``before`` (``_v`` 7)."""
    doc = doc or {}
    left = [str(e.get("id")) for e in doc.get("outbox") or [] if isinstance(e, Mapping)]
    expected = [i for i in before if i not in pulled]
    seen = (f"outbox {list(before)}, the dispatcher's $pull of {list(pulled)}: left {left}, "
            f"_v {doc.get('_v')!r}")
    if left == expected and doc.get("_v") == 7:
        return (Status.PASS, seen, "published entries leave the outbox (exactly those; _v "
                "untouched, so the writer's appends and the pulls commute)")
    why = " (the $pull removed nothing)" if left == list(before) else ""
    return (Status.FAIL, seen + why, "published entries would stay in the outbox and be "
            "published again and again")


def outbox_pull(ctx: Any) -> Outcome:
    before, pulled = ["e1", "e2", "e3"], ["e1", "e3"]
    ctx.db["check_pull"].insert_one({"_id": "p", "_v": 7,
                                     "outbox": [{"id": i, "topic": "t"} for i in before]})
    asyncio.run(_pull(ctx.uri, ctx.client_options, ctx.db.name, pulled))
    return pull_outcome(before, pulled, ctx.db["check_pull"].find_one({"_id": "p"}))


async def _pull(uri: str, options: Mapping[str, Any], database: str, ids: list[str]) -> None:
    from pymongo import AsyncMongoClient

    from dispatcher.core.timing import REAL_TIME
    from dispatcher.outbox.pull import pull_entries

    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, **options)
    try:
        await pull_entries(client[database]["check_pull"], [("p", ids)], initial_s=0.05,
                           max_s=0.2, timing=REAL_TIME)
    finally:
        await client.close()
