"""``aggbox parked list | release`` (see :mod:`aggbox.admin`)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from aggbox.admin._shared import (
    _OUTCOME_HEADERS,
    EXIT_UNSETTLED,
    _console,
    _database,
    _outcome_rows,
    _print_json,
    _registry,
    _table,
)
from aggregates.core.errors import ConfigurationError


# -- parked ------------------------------------------------------------------------------------
def _cmd_parked_list(args: argparse.Namespace) -> int:
    from aggregates.debug.listing import parked_record
    from aggregates.fold.document import F_BLOCKED
    from aggregates.store.parking import ParkedStore

    registry = _registry(args.aggregates) if args.aggregates else None
    with _database(args) as (settings, db):
        store = ParkedStore(db, collection=settings.parked_collection)
        if args.aggregate:
            docs = store.for_aggregate(*args.aggregate)[: args.limit]
        else:
            docs = store.list(aggregate_type=args.aggregate_type, reason=args.reason,
                              limit=args.limit)
        records = [parked_record(d) for d in docs
                   if not args.reason or d.get("reason") == args.reason]
        total = store.count()
        blocked: list[dict[str, Any]] = []
        for atype in registry or ():
            if args.aggregate_type and atype.name != args.aggregate_type:
                continue
            if args.aggregate and atype.name != args.aggregate[0]:
                continue
            query: dict[str, Any] = {F_BLOCKED: {"$exists": True}}
            if args.aggregate:
                query["_id"] = args.aggregate[1]
            for doc in db[atype.collection].find(query, {F_BLOCKED: 1}).limit(args.limit):
                blocked.append({"aggregate_type": atype.name, "aggregate_id": doc["_id"],
                                "blocked": doc.get(F_BLOCKED)})
    if args.json:
        _print_json({"items": records, "total": total, "blocked": blocked})
        return 0
    console = _console()
    rows = [[f"{r['aggregate_type']}/{r['aggregate_id']}", r["message_id"], r["message_type"],
             r["reason"], r["detail"], r["parked_at"], r["attempts"]] for r in records]
    console.print(_table(
        f"Parked messages: {len(rows)} shown of {total}",
        ("aggregate", "message", "type", "reason", "detail", "parked at", "attempts"), rows,
        caption="Release a blocked aggregate: `aggbox parked release --aggregate TYPE/ID "
        "--aggregates MODULE`.", empty="No parked messages."))
    if registry is not None:
        brows = [[f"{b['aggregate_type']}/{b['aggregate_id']}",
                  (b["blocked"] or {}).get("message_id"), (b["blocked"] or {}).get("error"),
                  (b["blocked"] or {}).get("at")] for b in blocked]
        console.print(_table(f"Blocked aggregates: {len(brows)}",
                             ("aggregate", "failed message", "error", "since"), brows,
                             empty="No blocked aggregates."))
    return 0


def _cmd_parked_release(args: argparse.Namespace) -> int:
    from aggregates.ops.release import ReleaseResult, clear_block, release_aggregate
    from aggregates.store.parking import ParkedStore

    registry = _registry(args.aggregates) if args.aggregates else None
    results: list[ReleaseResult] = []
    still: dict[str, int] = {}
    with _database(args) as (settings, db):
        parking = ParkedStore(db, collection=settings.parked_collection)
        for atype_name, agg_id in args.aggregates_to_release:
            if registry is not None:
                res = release_aggregate(db, registry, atype_name, agg_id, settings=settings)
            else:
                coll = _collection_of(args, parking.for_aggregate(atype_name, agg_id),
                                      atype_name)
                res = ReleaseResult(atype_name, agg_id, clear_block(db, coll, agg_id))
            results.append(res)
            still[f"{atype_name}/{agg_id}"] = len(parking.for_aggregate(atype_name, agg_id))
    if args.json:
        _print_json({"items": [
            {"aggregate": f"{r.aggregate_type}/{r.aggregate_id}", "cleared": r.cleared,
             "outcomes": [o.to_dict() for o in r.outcomes],
             "still_parked": still[f"{r.aggregate_type}/{r.aggregate_id}"]}
            for r in results]})
        return 0 if not any(still.values()) else EXIT_UNSETTLED
    console = _console()
    for r in results:
        ref = f"{r.aggregate_type}/{r.aggregate_id}"
        if r.cleared is None:
            console.print(f"{ref}: was not blocked", markup=False)
        else:
            console.print(f"{ref}: block cleared (failed message "
                          f"{r.cleared.get('message_id')!r}: {r.cleared.get('error')})",
                          markup=False, soft_wrap=True)
            console.print(f"  the failed message is dead letter {r.blocking_dead_letter!r}; "
                          "after fixing the handler: aggbox deadletters replay --id "
                          f"{r.blocking_dead_letter} --aggregates MODULE", markup=False,
                          soft_wrap=True)
        if registry is None:
            console.print("  parked messages not retried (no --aggregates); they are retried "
                          "with the aggregate's next message", markup=False)
        elif r.outcomes:
            console.print(_table(f"{ref}: parked messages retried", _OUTCOME_HEADERS,
                                 _outcome_rows(r.outcomes)))
        console.print(f"  still parked: {still[ref]}", markup=False)
    return 0 if not any(still.values()) else EXIT_UNSETTLED


def _collection_of(args: argparse.Namespace, parked: Sequence[Mapping[str, Any]],
                   atype: str) -> str:
    if args.collection:
        return str(args.collection)
    for p in parked:
        if p.get("collection"):
            return str(p["collection"])
    raise ConfigurationError(
        f"cannot tell the collection of aggregate type {atype!r}: pass --aggregates MODULE "
        "(also retries its parked messages) or --collection NAME"
    )
