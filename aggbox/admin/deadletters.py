"""``aggbox deadletters list | show | replay | dismiss`` (see :mod:`aggbox.admin`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from aggbox.admin._shared import (
    _OUTCOME_HEADERS,
    EXIT_UNSETTLED,
    _by_reason,
    _cell,
    _console,
    _database,
    _describe,
    _filters,
    _json_default,
    _outcome_rows,
    _print_json,
    _range_error,
    _registry,
    _table,
    _usage_error,
)
from aggregates.core.errors import ConfigurationError


def _record(doc: Mapping[str, Any]) -> dict[str, Any]:
    from aggregates.debug.listing import dead_letter_record

    return {**dead_letter_record(doc), "status_at": doc.get("status_at"),
            "dismissed_at": doc.get("dismissed_at"), "dismiss_note": doc.get("dismiss_note")}


def _cmd_deadletters_list(args: argparse.Namespace) -> int:
    from aggregates.store.deadletters import DeadLetterStore

    if (problem := _range_error(args)) is not None:
        return _usage_error(args, problem)
    status = None if args.status == "all" else args.status
    filtered = any(_filters(args).values()) or status != "open"
    with _database(args) as (settings, db):
        store = DeadLetterStore(db, collection=settings.dead_letter_collection)
        docs = store.list(**_filters(args), status=status, limit=args.limit)
        records = [_record(d) for d in docs]
        counts = store.counts_by_reason()
        matching = store.counts_by_reason(**_filters(args), status=status) if filtered else counts
    if args.json:
        _print_json({"items": records, "total": sum(matching.values())})
        return 0
    rows = [[r["id"], r["reason"], r["message_type"], r["attempts"], r["last_seen"],
             r["status"], r["error"] if r["error"] else r["raw"]] for r in records]
    caption = f"open by reason: {_by_reason(counts)}."
    if filtered:
        caption += f" Matching ({args.status}) by reason: {_by_reason(matching)}."
    caption += " Details: `aggbox deadletters show ID`."
    what = args.status + (f"; {_describe(args)}" if any(_filters(args).values()) else "")
    console = _console()
    console.print(_table(
        f"Dead letters ({what}): {len(rows)} shown of {sum(matching.values())}",
        ("id", "reason", "type", "attempts", "last seen", "status", "error"), rows,
        caption=caption, empty=f"No dead letters ({what})."))
    return 0


def _cmd_deadletters_show(args: argparse.Namespace) -> int:
    from rich.text import Text

    from aggregates.store.deadletters import DeadLetterStore

    with _database(args) as (settings, db):
        store = DeadLetterStore(db, collection=settings.dead_letter_collection)
        records = [_record(d) for d in store.get(args.ids)]
    found = {r["id"] for r in records} | {r["message_id"] for r in records}
    missing = [i for i in args.ids if i not in found]
    if args.json:
        _print_json({"items": records, "missing": missing})
    else:
        console = _console()
        for r in records:
            console.rule(Text(f"dead letter {r['id']}"))
            for key in ("reason", "status", "attempts", "first_seen", "last_seen", "error"):
                console.print(f"{key}: {_cell(r[key], None)}", markup=False, soft_wrap=True)
            for key in ("dismissed_at", "dismiss_note"):
                if r["status"] == "dismissed" and r[key] is not None:
                    console.print(f"{key}: {_cell(r[key], None)}", markup=False,
                                  soft_wrap=True)
            if r["message"] is not None:
                console.print("message:")
                console.print_json(json.dumps(r["message"], default=_json_default))
            if r["raw"] is not None:
                console.print("raw input:")
                console.print(r["raw"], markup=False, soft_wrap=True)
            if r["traceback"]:
                console.print("traceback:")
                console.print(r["traceback"], markup=False, soft_wrap=True)
        for i in missing:
            console.print(f"no dead letter with id or message id {i!r}", markup=False)
    return EXIT_UNSETTLED if missing else 0


def _cmd_deadletters_replay(args: argparse.Namespace) -> int:
    from aggregates.debug.listing import dead_letter_record
    from aggregates.ops.redrive import replay_dead_letters
    from aggregates.store.deadletters import DeadLetterStore

    if not (args.ids or args.reason or args.aggregate_type or args.all_open):
        raise ConfigurationError("say which dead letters to replay: --id ID (repeatable), "
                                 "--reason R, --type T or --all")
    registry = _registry(args.aggregates)
    with _database(args) as (settings, db):
        if args.dry_run:
            store = DeadLetterStore(db, collection=settings.dead_letter_collection)
            docs = (store.get(args.ids) if args.ids else
                    store.list(reason=args.reason, aggregate_type=args.aggregate_type,
                               status="open", limit=args.limit or 0))
            records = [dead_letter_record(d) for d in docs][: args.limit]
            if args.json:
                _print_json({"dry_run": True, "items": records})
            else:
                _console().print(_table(
                    f"Would replay {len(records)} dead letter(s) (dry run)",
                    ("id", "reason", "type", "status"),
                    [[r["id"], r["reason"], r["message_type"], r["status"]] for r in records]))
            return 0
        result = replay_dead_letters(db, registry, args.ids, reason=args.reason,
                                     aggregate_type=args.aggregate_type,
                                     all_open=args.all_open, limit=args.limit,
                                     settings=settings)
    if args.json:
        _print_json({
            "outcomes": [o.to_dict() for o in result.outcomes],
            "status": result.status,
            "skipped": result.skipped,
            "missing": result.missing,
            "ok": result.ok,
        })
        return 0 if result.ok else EXIT_UNSETTLED
    from aggregates.message.outcomes import OutcomeCounts

    console = _console()
    rows = [[lid, o.message_id, o.outcome, o.reason, o.detail, result.status[lid]]
            for lid, o in result.outcome_of.items()]
    rows += [[lid, "", "not replayed", why, "", "open"] for lid, why in result.skipped.items()]
    rows += [[i, "", "not found", "", "", ""] for i in result.missing]
    counts = OutcomeCounts().add(result.outcomes).as_dict()
    console.print(_table(
        f"Replayed {len(result.outcome_of)} dead letter(s)",
        ("dead letter", "message", "outcome", "reason", "detail", "status now"), rows,
        caption="outcomes: " + ", ".join(f"{k} {v}" for k, v in counts.items()),
        empty="No dead letters matched."))
    released = [o for o in result.outcomes if o.from_parked]
    if released:
        console.print(_table("Parked messages released on the way", _OUTCOME_HEADERS,
                             _outcome_rows(released)))
    if "parked" in result.status.values():
        console.print("Parked messages wait in the parked collection and are retried with "
                      "their aggregate; a blocked aggregate needs `aggbox parked release`.",
                      markup=False)
    return 0 if result.ok else EXIT_UNSETTLED


def _cmd_deadletters_dismiss(args: argparse.Namespace) -> int:
    from aggregates.store.deadletters import DeadLetterStore

    if not (args.ids or any(_filters(args).values())):
        return _usage_error(args, "say which dead letters to dismiss: --id ID (repeatable), "
                            "--reason R, --aggregate-type T, --before TIME and/or --since "
                            "TIME; there is no 'dismiss all'")
    if (problem := _range_error(args)) is not None:
        return _usage_error(args, problem)
    missing: list[str] = []
    not_open: dict[str, str] = {}
    with _database(args) as (settings, db):
        store = DeadLetterStore(db, collection=settings.dead_letter_collection)
        if args.ids:
            docs = store.get(args.ids)
            found = {str(d["_id"]) for d in docs} | {str(d.get("message_id")) for d in docs}
            missing = [i for i in args.ids if i not in found]
            not_open = {str(d["_id"]): str(d.get("status")) for d in docs
                        if d.get("status") != "open"}
        by_reason = store.counts_by_reason(ids=args.ids, **_filters(args), status="open")
        count = store.dismiss(ids=args.ids, **_filters(args), note=args.note,
                              dry_run=args.dry_run)
    rc = EXIT_UNSETTLED if missing else 0
    if args.json:
        _print_json({"dry_run": args.dry_run, "matched": count,
                     "dismissed": 0 if args.dry_run else count, "by_reason": by_reason,
                     "not_open": not_open, "missing": missing})
        return rc
    console = _console()
    verb = "Would dismiss" if args.dry_run else "Dismissed"
    console.print(f"{verb} {count} open dead letter(s) ({_describe(args)})"
                  + (f"; by reason: {_by_reason(by_reason)}" if count else "")
                  + (" — dry run, nothing changed." if args.dry_run else "."),
                  markup=False, soft_wrap=True)
    for lid, status in not_open.items():
        console.print(f"{lid} is {status}, not open: left as it is", markup=False)
    for i in missing:
        console.print(f"no dead letter with id or message id {i!r}", markup=False)
    return rc
