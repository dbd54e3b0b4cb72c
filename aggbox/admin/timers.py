"""``aggbox timers list`` (see :mod:`aggbox.admin`): the pending timers (docs/design.md
"Timers") per aggregate type — how many documents hold timers, how many are overdue (due
longer ago than ``--overdue-after``: the dispatcher is not firing them) — and the next ones
due, earliest first."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from aggbox.admin._shared import _console, _database, _print_json, _registry, _table
from aggregates.fold.document import F_TIMERS, F_TYPE

__all__ = ["cmd_timers_list", "timer_rows"]

_DUE = f"{F_TIMERS}.due"


def _aware(value: Any) -> Any:
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def timer_rows(atype: str, docs: list[Mapping[str, Any]], *, now: datetime,
               overdue_after: timedelta) -> list[dict[str, Any]]:
    """One record per pending timer of ``docs``, earliest due first (pure)."""
    rows = []
    for d in docs:
        for t in d.get(F_TIMERS) or []:
            if not isinstance(t, Mapping):
                continue
            due = _aware(t.get("due"))
            target = t.get("target") if isinstance(t.get("target"), Mapping) else {}
            late = (now - due).total_seconds() if isinstance(due, datetime) else None
            rows.append({
                "aggregate_type": atype, "aggregate_id": d.get("_id"), "key": t.get("timer"),
                "id": t.get("id"), "type": t.get("type"), "due": due,
                "target": f"{target.get('type')}/{target.get('id')}" if target else None,
                "scheduled_at": _aware(t.get("scheduled_at")),
                "overdue": late is not None and late > overdue_after.total_seconds(),
                "seconds_past_due": max(0.0, late) if late is not None else None,
            })
    far = datetime.max.replace(tzinfo=UTC)
    return sorted(rows, key=lambda r: (r["due"] if isinstance(r["due"], datetime) else far,
                                       str(r["aggregate_id"]), str(r["key"])))


def _stored_types(db: Any) -> list[tuple[str, str]]:
    """``(aggregate type, collection)`` of every collection whose documents hold timers, read
    from the store (no ``--aggregates`` needed): the type is the documents' ``_type``, which
    the writer sets at insert; a document without one is named by its collection."""
    found = []
    for name in sorted(db.list_collection_names()):
        pending = {_DUE: {"$exists": True}}
        if name.startswith("system.") or db[name].find_one(pending, {"_id": 1}) is None:
            continue
        types = sorted(str(t) for t in db[name].distinct(F_TYPE, pending) if t)
        found.append((", ".join(types) or name, name))
    return found


def cmd_timers_list(args: argparse.Namespace) -> int:
    now = datetime.now(UTC)
    overdue_after = timedelta(seconds=args.overdue_after)
    summary: list[dict[str, Any]] = []
    items: list[dict[str, Any]] = []
    with _database(args) as (_settings, db):
        if args.aggregates:
            known = [(t.name, t.collection) for t in _registry(args.aggregates)]
        else:
            known = _stored_types(db)
        for name, collection in known:
            if args.aggregate_type not in (None, name):
                continue
            coll = db[collection]
            pending = coll.count_documents({_DUE: {"$exists": True}})
            overdue = coll.count_documents({_DUE: {"$lt": now - overdue_after}})
            docs = list(coll.find({_DUE: {"$exists": True}}, {F_TIMERS: 1})
                        .sort([(_DUE, 1)]).limit(args.limit))
            rows = timer_rows(name, docs, now=now, overdue_after=overdue_after)
            items.extend(rows)
            summary.append({"aggregate_type": name, "collection": collection,
                            "documents_with_timers": pending, "overdue_documents": overdue,
                            "next_due": rows[0]["due"] if rows else None})
    items = sorted(items, key=lambda r: str(r["due"]))[:args.limit]
    if args.json:
        _print_json({"items": items, "types": summary})
        return 0
    console = _console()
    console.print(_table(
        "Pending timers by aggregate type",
        ("aggregate type", "documents with timers", "overdue documents", "next due"),
        [[s["aggregate_type"], s["documents_with_timers"], s["overdue_documents"],
          s["next_due"] or ""] for s in summary],
        # the hint only when something is overdue (issue 44, item 7)
        caption=(f"Overdue: due more than {args.overdue_after:g} s ago and still pending — "
                 "is a dispatcher running for these partitions? (aggbox dispatch-status)"
                 if any(s["overdue_documents"] for s in summary) else None)))
    console.print(_table(
        f"Next {len(items)} timers, earliest due first",
        ("aggregate", "key", "message", "to", "due", "overdue"),
        [[f"{r['aggregate_type']}/{r['aggregate_id']}", r["key"], r["type"], r["target"],
          r["due"], f"{r['seconds_past_due']:.0f} s" if r["overdue"] else ""] for r in items],
        empty="No pending timers."))
    return 0


def register(sub: Any, *, store_options: Any, aggregates_option: Any, positive: Any,
             formatter: Any, epilog: str, group: Any) -> None:
    """``aggbox timers list``."""
    tm = sub.add_parser("timers", help="list pending timers (overdue ones first to look at)",
                        description="Timers handlers scheduled (Schedule) and the dispatcher "
                        "has not fired yet (docs/concepts.md \"Timers\").", epilog=epilog,
                        formatter_class=formatter)
    group(tm, "timers_action")
    tm_sub = tm.add_subparsers(dest="timers_action", metavar="ACTION")
    p = tm_sub.add_parser(
        "list", help="pending timers per aggregate type and the next ones due",
        epilog=epilog, formatter_class=formatter,
        description="Per aggregate type: documents holding timers and how many of them are "
        "overdue; then the next timers due, earliest first (overdue ones lead).")
    store_options(p)
    aggregates_option(p, required=False, extra="; without it, every collection of the "
                      "database whose documents hold timers")
    p.add_argument("--type", metavar="T", dest="aggregate_type",
                   help="only this aggregate type, e.g. Order")
    p.add_argument("--overdue-after", metavar="SECONDS", type=float, default=60.0,
                   help="a timer due longer ago than this counts as overdue (default 60)")
    p.add_argument("--limit", metavar="N", type=positive, default=50,
                   help="show at most N timers (default 50)")
    p.add_argument("--json", action="store_true",
                   help='print a JSON object {"items": [...], "types": [...]}')
    p.set_defaults(func=cmd_timers_list)
