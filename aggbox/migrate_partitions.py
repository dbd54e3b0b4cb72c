"""``aggbox migrate partitions``: give aggregate documents without ``_p`` their partition
(docs/design.md "Document layout", :mod:`aggregates.core.partitions`).

The writer stores ``_p = partition_of(_id)`` when it inserts a document and never changes it.
A document inserted by anything else (a seed script, a restore that dropped the field) has
no ``_p``; layout 1 counts it as partition 0 until it is migrated. Moving a document to its
partition while entries of its outbox may be in flight (read by partition 0's dispatcher,
not yet pulled) could publish them from two instances at once, so the write is conditional
on an empty outbox::

    update_one({_id, _p: {$exists: false}, "outbox.0": {$exists: false}}, {$set: {_p}})

Documents whose outbox still has entries are left and counted as pending: run again once
the dispatcher has published them (or pass ``--wait SECONDS``).

``_v`` is not incremented: ``_p`` is layout, not state. The writer's conditional write
filters on ``_id`` and ``_v`` only (and writes ``_p`` only with ``$setOnInsert``), so a
concurrent writer neither conflicts with this ``$set`` nor undoes it.

Pages of :data:`PAGE` documents in ``_id`` order, each a fresh query from the last ``_id``
seen (no cursor held open), and one unordered ``bulk_write`` per page. Idempotent and
resumable: an interrupted run is completed by running it again; a second run changes
nothing.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pymongo import UpdateOne
from pymongo.collection import Collection
from pymongo.database import Database

from aggregates.core.partitions import partition_of
from aggregates.fold.document import F_OUTBOX, F_PARTITION

__all__ = ["PAGE", "PartitionMigration", "migrate_partitions", "register_partitions",
           "report_lines"]

#: Documents read (and updated in one bulk write) per page.
PAGE = 1000

#: Seconds between the passes of ``--wait`` over the pending documents.
WAIT_POLL = 1.0


@dataclass
class PartitionMigration:
    """What ``aggbox migrate partitions`` did to one collection (or, with ``dry_run``, would
    do)."""

    collection: str
    dry_run: bool = False
    scanned: int = 0     # documents read by the first pass
    migrated: int = 0    # documents given their _p (over all passes)
    already: int = 0     # documents that had a _p already
    pending: int = 0     # documents left without _p: their outbox has entries
    passes: int = 0      # passes made (more than 1 with --wait)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def migrate_partitions(
    db: Database[Any],
    collections: Iterable[str],
    *,
    dry_run: bool = False,
    wait: float = 0.0,
    page: int = PAGE,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[PartitionMigration]:
    """Set ``_p`` on the documents of ``collections`` that have none and an empty outbox;
    with ``wait`` > 0, repeat for the pending ones every :data:`WAIT_POLL` seconds until none
    are left or ``wait`` seconds have passed."""
    deadline = clock() + max(wait, 0.0)
    results: list[tuple[PartitionMigration, list[str]]] = []
    for name in dict.fromkeys(collections):
        res = PartitionMigration(collection=name, dry_run=dry_run)
        results.append((res, _first_pass(db[name], res, page)))
    # Nothing changes in a dry run: a second pass would count the same.
    while not dry_run and any(left for _, left in results) and clock() < deadline:
        sleep(max(0.0, min(WAIT_POLL, deadline - clock())))
        results = [(res, _retry(db[res.collection], res, left, page) if left else left)
                   for res, left in results]
    for res, left in results:
        res.pending = len(left)
    return [res for res, _ in results]


def _first_pass(coll: Collection[Any], res: PartitionMigration, page: int) -> list[str]:
    """Read every document (string ``_id``s: aggregate ids), migrate those without ``_p``;
    the ids left pending."""
    res.passes += 1
    pending: list[str] = []
    # ``$gte ""`` then ``$gt last``: only string _ids (every aggregate id is one), in order.
    query: dict[str, Any] = {"_id": {"$gte": ""}}
    while True:
        docs = list(coll.find(query, {F_PARTITION: 1}).sort("_id", 1).limit(page))
        if not docs:
            return pending
        res.scanned += len(docs)
        todo = [d["_id"] for d in docs if F_PARTITION not in d]
        res.already += len(docs) - len(todo)
        if todo:
            pending += _migrate(coll, res, todo)
        query = {"_id": {"$gt": docs[-1]["_id"]}}


def _retry(coll: Collection[Any], res: PartitionMigration, ids: Sequence[str],
           page: int) -> list[str]:
    """Another pass over the pending ``ids``; those still pending."""
    res.passes += 1
    pending: list[str] = []
    for i in range(0, len(ids), page):
        pending += _migrate(coll, res, ids[i:i + page])
    return pending


def _migrate(coll: Collection[Any], res: PartitionMigration, ids: Sequence[str]) -> list[str]:
    """Set ``_p`` on those of ``ids`` (documents read without one) whose outbox is empty;
    the ids left without ``_p`` (a document deleted meanwhile is neither)."""
    if res.dry_run:
        busy = {d["_id"] for d in coll.find(
            {"_id": {"$in": list(ids)}, F_PARTITION: {"$exists": False},
             f"{F_OUTBOX}.0": {"$exists": True}}, {"_id": 1})}
        res.migrated += sum(1 for i in ids if i not in busy)
        return [i for i in ids if i in busy]
    # No _v: see the module docstring (layout, not state; the writer filters on _id, _v).
    ops = [UpdateOne({"_id": i, F_PARTITION: {"$exists": False},
                      f"{F_OUTBOX}.0": {"$exists": False}},
                     {"$set": {F_PARTITION: partition_of(i)}}) for i in ids]
    res.migrated += coll.bulk_write(ops, ordered=False).modified_count
    left = {d["_id"] for d in coll.find({"_id": {"$in": list(ids)},
                                         F_PARTITION: {"$exists": False}}, {"_id": 1})}
    return [i for i in ids if i in left]


# -- command line ------------------------------------------------------------------------------
def register_partitions(
        sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``partitions`` to ``aggbox migrate``."""
    from aggbox.admin import _EPILOG, _Formatter, _store_options

    p = sub.add_parser(
        "partitions", help="give documents without a partition _p theirs (idempotent)",
        epilog=_EPILOG, formatter_class=_Formatter,
        description="Set the partition field _p on the aggregate documents that have none, "
        "because something other than the writer inserted them (the dispatcher counts them "
        "as partition 0 until then). A "
        "document whose outbox still has entries is left pending, so none of its entries "
        "can be published from two partitions: run the command again once the dispatcher "
        "has published them, or pass --wait. Exit status 3 while documents are pending. "
        "Idempotent and resumable. Collections: those of --aggregates MODULE and "
        "--collection.")
    _store_options(p)
    p.add_argument("--aggregates", metavar="MODULE",
                   help="Python module defining the aggregate types: migrate their "
                   "collections")
    p.add_argument("--collection", metavar="NAME", action="append", default=[],
                   help="an aggregate collection to migrate (repeatable)")
    p.add_argument("--wait", metavar="SECONDS", type=float, default=0.0,
                   help="repeat for the pending documents until none are left or SECONDS "
                   "have passed")
    p.add_argument("--dry-run", action="store_true", help="count, change nothing")
    p.add_argument("--json", action="store_true", help="print the counts as JSON")
    p.set_defaults(func=_cmd_partitions)


def _cmd_partitions(args: argparse.Namespace) -> int:
    from aggbox.admin._shared import EXIT_UNSETTLED, _database, _print_json, _registry
    from aggregates.core.errors import ConfigurationError

    collections: list[str] = list(args.collection)
    if args.aggregates:
        collections += [t.collection for t in _registry(args.aggregates)]
    if not collections:
        raise ConfigurationError("no collection to migrate: pass --aggregates MODULE or "
                                 "--collection NAME")
    with _database(args) as (_, db):
        results = migrate_partitions(db, collections, dry_run=args.dry_run, wait=args.wait)
    rc = EXIT_UNSETTLED if any(r.pending for r in results) else 0
    if args.json:
        _print_json({"dry_run": args.dry_run, "items": [r.as_dict() for r in results]})
        return rc
    for line in report_lines(results):
        print(line)
    return rc


def report_lines(results: Sequence[PartitionMigration]) -> list[str]:
    """The human-readable summary: one line per collection."""
    lines: list[str] = []
    for r in results:
        done = "would be migrated" if r.dry_run else "migrated"
        lines.append(f"{r.collection}: scanned {r.scanned}, {done} {r.migrated}, already "
                     f"{r.already}, pending {r.pending}")
    pending = sum(r.pending for r in results)
    if pending:
        lines.append(f"pending: {pending} documents still have unpublished entries; run "
                     "again once the dispatcher has published them")
    if results and results[0].dry_run:
        lines.append("dry run: nothing changed")
    return lines
