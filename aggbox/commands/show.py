"""``aggbox show TYPE ID``: one aggregate as the notebook view shows it
(:func:`aggregates.debug.load_aggregate`): state, ``_v``, inbox and high-water marks, the
pending outbox and timers, ``_blocked``, its parked messages — and its dead letters.

``--aggregates MODULE`` is optional, as for ``aggbox parked list`` and ``aggbox deadletters
list``: without it the collection is ``--collection``, else the one the aggregate's parked
messages name, else the type's default (the type in lower case made plural, what
``AggregateType`` uses: ``categories``; else its default before aggbox 0.2, ``categorys``,
when the aggregate is there); the state is then shown as stored (no codec) and the dedup
strategy is read off the document. With it the type's own collection, codec and dedup
strategy are used.

Exit codes: 0 shown; 1 error; 3 no such aggregate (no document, no parked message, no dead
letter): one line naming a few ids the collection has, or saying it has none.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pymongo.database import Database

    from aggregates.domain.aggregate import AggregateType

#: Ids named in the "no such aggregate" line.
_SAMPLE_IDS = 5


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``show`` to the ``aggbox`` command (only argparse is imported here)."""
    from aggbox.admin import _EPILOG, _aggregates_option, _Formatter, _store_options

    p = subparsers.add_parser(
        "show", help="show one aggregate: state, inbox, outbox, timers, parked, dead letters",
        epilog=_EPILOG.replace("Exit codes: 0 ok, 1 error, 2 usage error, 3 ran but left "
                               "messages unsettled.",
                               "Exit codes: 0 shown, 1 error, 2 usage error, 3 no such "
                               "aggregate."),
        formatter_class=_Formatter,
        description="Show one aggregate as the notebook view (load_aggregate) shows it: "
        "its state, version (_v), inbox and high-water marks, pending outbox entries and "
        "timers, whether it is blocked, its parked messages and its dead letters (any "
        "status). Nothing is written. Without --aggregates the collection is --collection, "
        "else the one its parked messages name, else the type's default (the type name in "
        "lower case, plural: orders, categories, boxes), and the state is shown as stored.")
    p.add_argument("aggregate_type", metavar="TYPE", help="aggregate type name, e.g. Order")
    p.add_argument("aggregate_id", metavar="ID", help="aggregate id, e.g. o-1")
    _store_options(p)
    _aggregates_option(p, required=False,
                       extra=" (optional: its codec loads the state, its collection is used)")
    p.add_argument("--collection", metavar="NAME",
                   help="the type's MongoDB collection, when it is not the default and "
                   "--aggregates is not given")
    p.add_argument("--max-rows", metavar="N", type=int, default=20,
                   help="rows shown per table (default 20; --json shows all)")
    p.add_argument("--json", action="store_true",
                   help="print a JSON object: aggregate_type, aggregate_id, collection, "
                   "exists, version, seq, state, inbox, inbox_floor, high_water, outbox, "
                   "timers, blocked, parked, dead_letters")
    p.set_defaults(func=cmd_show)


def cmd_show(args: argparse.Namespace) -> int:
    from aggbox.admin._shared import _database, _print_json, _registry
    from aggregates.debug.listing import dead_letter_record, parked_record
    from aggregates.debug.render import text_table
    from aggregates.debug.view import AggregateView, load_aggregate
    from aggregates.store.deadletters import DeadLetterStore
    from aggregates.store.parking import ParkedStore

    registry = _registry(args.aggregates) if args.aggregates else None
    atype_name, agg_id = args.aggregate_type, args.aggregate_id
    if registry is not None:
        registry.get(atype_name)  # an unknown type: one line naming the known ones
    with _database(args) as (settings, db):
        if registry is not None:
            view = load_aggregate(db, registry, atype_name, agg_id, settings=settings)
        else:
            parked = ParkedStore(db, collection=settings.parked_collection).for_aggregate(
                atype_name, agg_id)
            collection = args.collection or next(
                (str(p["collection"]) for p in parked if p.get("collection")), None)
            atype = _stand_in(atype_name, collection)
            doc = db[atype.collection].find_one({"_id": agg_id})
            if doc is None and atype.former_collection:  # stored before aggbox 0.2
                doc = db[atype.former_collection].find_one({"_id": agg_id})
                atype = _stand_in(atype_name, atype.former_collection) if doc else atype
            atype = _stand_in(atype_name, atype.collection, doc)
            view = AggregateView(atype, agg_id, doc, parked,
                                 archive=atype.dedup.archive(db, atype.collection))
        letters = [dead_letter_record(d) for d in DeadLetterStore(
            db, collection=settings.dead_letter_collection).coll.find(
            {"aggregate_type": atype_name, "aggregate_id": agg_id}).sort("last_seen", -1)]
        if not view.exists and not view.parked and not letters:
            print(f"aggbox show: error: {_missing(db, view.collection, atype_name, agg_id)}",
                  file=sys.stderr)
            return 3
    if args.json:
        _print_json(_as_json(view, letters, [parked_record(p) for p in view.parked]))
        return 0
    print(view.render_text(max_rows=args.max_rows))
    print(f"dead letters: {len(letters)} (any status), newest first:")
    if letters:
        print(text_table(("id", "status", "reason", "message_type", "error", "last_seen"),
                         [[r["id"], r["status"], r["reason"], r["message_type"], r["error"],
                           r["last_seen"]] for r in letters], max_rows=args.max_rows))
    else:
        print("  (none)")
    return 0


def _stand_in(name: str, collection: str | None, doc: Any = None) -> AggregateType[Any]:
    """An aggregate type without its module: the state as stored (a dict), ``collection``
    (``None``: the default), the dedup strategy read off the document's fields (inbox when
    it has none)."""
    from aggregates.dedup import HighWater, Inbox
    from aggregates.domain.aggregate import AggregateType
    from aggregates.fold.document import F_HW, F_INBOX

    has_hw = isinstance(doc, dict) and doc.get(F_HW) and not doc.get(F_INBOX)
    return AggregateType(name, state=dict, collection=collection,
                         dedup=HighWater() if has_hw else Inbox())


def _missing(db: Database[Any], collection: str, atype: str, agg_id: str) -> str:
    ids = [str(d["_id"]) for d in db[collection].find({}, {"_id": 1}).sort("_id", 1)
           .limit(_SAMPLE_IDS + 1)]
    if not ids:
        return (f"no {atype} {agg_id!r}: collection {collection!r} holds no aggregates (wrong "
                "type, --collection or --database?)")
    more = ", …" if len(ids) > _SAMPLE_IDS else ""
    return (f"no {atype} {agg_id!r} in collection {collection!r} (it has "
            f"{', '.join(ids[:_SAMPLE_IDS])}{more})")


def _as_json(view: Any, letters: list[dict[str, Any]],
             parked: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "aggregate_type": view.aggregate_type,
        "aggregate_id": view.aggregate_id,
        "collection": view.collection,
        "exists": view.exists,
        "dedup": view.atype.dedup.name,
        "version": view.version,
        "seq": view.seq,
        "state": view.state_document,
        "inbox": [{"message_id": e.message_id, "occurred_at": e.occurred_at,
                   "payload_hash": e.payload_hash} for e in view.inbox],
        "inbox_floor": view.inbox_floor,
        "high_water": view.high_water,
        "outbox": view.outbox,
        "timers": view.timers,
        "blocked": view.blocked,
        "parked": parked,
        "dead_letters": letters,
    }
