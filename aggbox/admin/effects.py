"""``aggbox effects list`` (see :mod:`aggbox.admin`): the effect runner's attempt records
(dispatcher/effects/attempts.py), for the operator who must find the calls whose outcome is
unknown, the ones that keep failing and the ones that failed for good."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from aggbox.admin._shared import _console, _database, _print_json, _table
from aggregates.core.errors import ConfigurationError

__all__ = ["STATES", "cmd_effects_list", "effects_query"]

#: ``--state`` choices.
STATES: Final = ("attempting", "succeeded", "failed", "all")
_FIELDS: Final = ("_id", "collection", "aggregate_type", "aggregate_id", "type", "entry_id",
                  "state", "attempts", "first_at", "last_at", "finished_at", "last_reason",
                  "last_error", "reason", "error", "result")


def effects_query(*, state: str, effect_type: str | None,
                  aggregate: tuple[str, str] | None, older_than: float | None,
                  now: datetime) -> dict[str, Any]:
    """The ``find`` filter of ``aggbox effects list`` (pure)."""
    query: dict[str, Any] = {}
    if state != "all":
        query["state"] = state
    if effect_type:
        query["type"] = effect_type
    if aggregate is not None:
        query["aggregate_type"], query["aggregate_id"] = aggregate
    if older_than is not None:
        query["last_at"] = {"$lt": now - timedelta(minutes=older_than)}
    return query


def _collection(args: argparse.Namespace) -> str:
    """``--collection``, else the dispatcher's ``effect_collection`` (``[dispatcher]`` of
    ``--config``, ``AGGBOX_DISPATCHER_EFFECT_COLLECTION``), else its default."""
    if args.collection:
        return str(args.collection)
    from pydantic import ValidationError

    from dispatcher.core.settings import DispatcherSettings

    try:
        return DispatcherSettings.load(config_file=args.config).effect_collection
    except ValidationError as exc:
        raise ConfigurationError(f"invalid [dispatcher] settings: {exc}; or pass "
                                 "--collection NAME") from None


def cmd_effects_list(args: argparse.Namespace) -> int:
    args.collection = _collection(args)
    now = datetime.now(UTC)
    query = effects_query(state=args.state, effect_type=args.effect_type,
                          aggregate=args.aggregate, older_than=args.older_than, now=now)
    with _database(args) as (_settings, db):
        coll = db[args.collection]
        total = coll.count_documents(query)
        docs = list(coll.find(query, dict.fromkeys(_FIELDS, 1))
                    .sort([("last_at", 1), ("_id", 1)]).limit(args.limit))
    records = [{f: d.get(f) for f in _FIELDS if f != "_id"} | {"key": d["_id"]}
               for d in docs]
    if args.json:
        _print_json({"items": records, "total": total})
        return 0
    rows = []
    for r in records:
        final = r["state"] != "attempting"
        rows.append([r["type"], f"{r['aggregate_type']}/{r['aggregate_id']}", r["entry_id"],
                     r["state"], r["attempts"], r["last_at"],
                     (r["reason"] if final else r["last_reason"]) or "",
                     (r["error"] if final else r["last_error"]) or ""])
    caption = ("An attempting effect with attempts ≥ 1 was called and its result is not "
               "recorded: the dispatcher settles it (query or call again) when it next "
               "handles the entry. Failed effects were dead-lettered: aggbox deadletters list "
               "--reason R.")
    _console().print(_table(
        f"Effects ({args.state}): {len(rows)} shown of {total}, oldest first",
        ("effect", "aggregate", "entry", "state", "attempts", "last at", "reason", "error"),
        rows, caption=caption, empty=f"No effects ({args.state}) in {args.collection!r}."))
    return 0
