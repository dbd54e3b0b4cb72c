"""``aggbox migrate keys``: rewrite keys written before :mod:`aggregates.core.keys` in place.

Before, parked and dead-letter ``_id``s and ``hw`` keys joined user strings with ``/``, so
``"x/y" + "z"`` and ``"x" + "y/z"`` shared one key. Now each part is escaped
(docs/design.md "Document layout"). A key whose parts contain no ``/`` or ``%`` is the same
in both encodings; this command rewrites the others:

- **dead letters** of a message: ``_id`` recomputed from the stored message; dead letters
  of a raw input line (old ``_id`` = ``raw_message_id(repr(line))``): ``_id`` =
  ``raw_message_id(line)`` and ``message_id`` = the line's identity, as its outcome reports
  it (:func:`aggregates.store.deadletters.raw_line_id`). A line stored truncated (over 64 KiB)
  cannot be recomputed and is left as it is (counted).
- **parked messages**: ``_id`` recomputed from ``collection``, ``aggregate_id`` and
  ``message_id``.
- **hw keys** with several ``/`` (ambiguous): replaced by a mark for each source they may
  stand for (:func:`aggregates.core.keys.read_hw`, the same reading the writer does on
  unmigrated documents), in a write conditional on ``_v`` that increments it.

An ``_id`` cannot change in place: the document is copied to the new ``_id`` (recording
the old one in ``migrated_from``) and the old one deleted. If a document with the new
``_id`` exists already (written since the upgrade), the old one is merged into it once
(``attempts`` added, earliest first time, latest ``last_seen``; ``migrated_from`` makes a
rerun skip the merge). Every step is idempotent: an interrupted run is resumed by running
it again; a second run changes nothing.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import DuplicateKeyError

from aggregates.core.ids import raw_message_id
from aggregates.core.keys import dead_letter_key, parked_key, read_hw
from aggregates.fold.document import F_HW, F_VERSION
from aggregates.store.deadletters import raw_line_id

#: Field of a moved document: the ``_id``s it was moved (or merged) from.
MOVED = "migrated_from"

#: Conditional ``hw`` writes retried this often when a writer changes the document meanwhile.
HW_RETRIES = 5


@dataclass
class KeyMigration:
    """What ``aggbox migrate keys`` changed (or, with ``dry_run``, would change)."""

    dry_run: bool = False
    dead_letters: int = 0            # dead letters of messages re-keyed
    raw_dead_letters: int = 0        # dead letters of raw input lines re-keyed
    raw_left: int = 0                # raw dead letters whose text is truncated: left as is
    parked: int = 0                  # parked messages re-keyed
    merged: int = 0                  # ... of which merged into a document with the new _id
    hw_documents: int = 0            # aggregate documents whose hw map was rewritten
    hw_legacy_keys: int = 0          # ambiguous hw keys replaced
    hw_conflicts: int = 0            # documents skipped: kept changing (run again)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def migrate_keys(
    db: Database[Any],
    *,
    dead_letter_collection: str = "aggbox_dead_letters",
    parked_collection: str = "aggbox_parked",
    collections: Iterable[str] = (),
    dry_run: bool = False,
) -> KeyMigration:
    """Rewrite old-format keys; ``collections``: aggregate collections whose ``hw`` maps to
    check."""
    out = KeyMigration(dry_run=dry_run)
    _dead_letters(db[dead_letter_collection], out)
    _parked(db[parked_collection], out)
    for name in dict.fromkeys(collections):
        _high_water(db[name], out)
    return out


# -- dead letters ------------------------------------------------------------------------------
def _dead_letters(coll: Collection[Any], out: KeyMigration) -> None:
    for doc in coll.find({}, {"message": 1, "raw": 1, "message_id": 1}):
        old, msg, raw = doc["_id"], doc.get("message"), doc.get("raw")
        if isinstance(msg, Mapping):
            try:
                new = dead_letter_key(str(msg["aggregate_type"]), str(msg["aggregate_id"]),
                                      str(msg["message_id"]))
            except KeyError:
                continue
            if new != old and _move(coll, old, new, {}, "first_seen", out):
                out.dead_letters += 1
        elif doc.get("message_id") is None and isinstance(raw, str):
            if old == raw_message_id(repr(raw)):  # the full line, keyed by its repr
                if _move(coll, old, raw_message_id(raw), {"message_id": raw_line_id(raw)},
                         "first_seen", out):
                    out.raw_dead_letters += 1
            elif old != raw_message_id(raw):  # not a repr-stored value: truncated text
                out.raw_left += 1


# -- parked ------------------------------------------------------------------------------------
def _parked(coll: Collection[Any], out: KeyMigration) -> None:
    for doc in coll.find({}, {"collection": 1, "aggregate_id": 1, "message_id": 1}):
        try:
            new = parked_key(str(doc["collection"]), str(doc["aggregate_id"]),
                             str(doc["message_id"]))
        except KeyError:
            continue
        if new != doc["_id"] and _move(coll, doc["_id"], new, {}, "parked_at", out):
            out.parked += 1


def _move(coll: Collection[Any], old: Any, new: str, extra: Mapping[str, Any], first: str,
          out: KeyMigration) -> bool:
    """Move the document ``old`` to ``_id`` ``new`` (merging it into an existing one);
    ``False`` if it is gone meanwhile."""
    if out.dry_run:
        if coll.count_documents({"_id": new}, limit=1):
            out.merged += 1
        return True
    doc = coll.find_one({"_id": old})
    if doc is None:
        return False
    try:
        coll.insert_one({**doc, **extra, "_id": new, MOVED: [old]})
    except DuplicateKeyError:
        out.merged += 1
        update: dict[str, Any] = {"$inc": {"attempts": int(doc.get("attempts") or 0)},
                                  "$addToSet": {MOVED: old}}
        if doc.get(first) is not None:
            update["$min"] = {first: doc[first]}
        if doc.get("last_seen") is not None:
            update["$max"] = {"last_seen": doc["last_seen"]}
        # Merged at most once, however often the run is repeated.
        coll.update_one({"_id": new, MOVED: {"$ne": old}}, update)
    coll.delete_one({"_id": old})
    return True


# -- hw ----------------------------------------------------------------------------------------
def _high_water(coll: Collection[Any], out: KeyMigration) -> None:
    for doc in coll.find({F_HW: {"$exists": True}}, {F_HW: 1, F_VERSION: 1}):
        for _ in range(HW_RETRIES):
            hw = {str(k): v for k, v in (doc.get(F_HW) or {}).items()}
            legacy = [k for k in hw if k.count("/") > 1]
            if not legacy:
                break
            new = read_hw(hw)
            if out.dry_run:
                done = True
            else:
                update: dict[str, Any] = {
                    "$unset": {f"{F_HW}.{k}": "" for k in legacy},
                    "$inc": {F_VERSION: 1},
                }
                changed = {f"{F_HW}.{k}": v for k, v in new.items() if hw.get(k) != v}
                if changed:
                    update["$set"] = changed
                filt = {"_id": doc["_id"], F_VERSION: doc.get(F_VERSION)}
                done = coll.update_one(filt, update).modified_count == 1
            if done:
                out.hw_documents += 1
                out.hw_legacy_keys += len(legacy)
                break
            doc = coll.find_one({"_id": doc["_id"]}, {F_HW: 1, F_VERSION: 1}) or {}
        else:
            out.hw_conflicts += 1


# -- command line ------------------------------------------------------------------------------
def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``aggbox migrate keys`` and ``aggbox migrate partitions``."""
    from aggbox.admin import _EPILOG, _Formatter, _group, _store_options
    from aggbox.migrate_partitions import register_partitions

    mg = subparsers.add_parser(
        "migrate", help="rewrite stored data written by older aggbox versions",
        description="Rewrite stored data written by older aggbox versions, in place.",
        epilog=_EPILOG, formatter_class=_Formatter)
    _group(mg, "migrate_action")
    sub = mg.add_subparsers(dest="migrate_action", metavar="ACTION")
    p = sub.add_parser(
        "keys", help="re-key parked messages, dead letters and hw marks (idempotent)",
        epilog=_EPILOG, formatter_class=_Formatter,
        description="Rewrite the parked and dead-letter ids and the hw keys written before "
        "ids and keys escaped '/' inside their parts (where two messages or two sources "
        "could share one key), and give the dead letters of raw input lines the id their "
        "outcome reports. Idempotent and resumable: run it again after an interruption. "
        "hw maps are checked in the collections of --aggregates MODULE and --collection.")
    _store_options(p)
    p.add_argument("--aggregates", metavar="MODULE",
                   help="Python module defining the aggregate types: check their hw maps")
    p.add_argument("--collection", metavar="NAME", action="append", default=[],
                   help="an aggregate collection whose hw maps to check (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="count, change nothing")
    p.add_argument("--json", action="store_true", help="print the counts as JSON")
    p.set_defaults(func=_cmd_keys)
    register_partitions(sub)  # ``aggbox migrate partitions``, in its own module


def _cmd_keys(args: argparse.Namespace) -> int:
    from aggbox.admin._shared import EXIT_UNSETTLED, _database, _print_json, _registry

    collections: list[str] = list(args.collection)
    if args.aggregates:
        collections += [t.collection for t in _registry(args.aggregates)]
    with _database(args) as (settings, db):
        res = migrate_keys(db, dead_letter_collection=settings.dead_letter_collection,
                           parked_collection=settings.parked_collection,
                           collections=collections, dry_run=args.dry_run)
    rc = EXIT_UNSETTLED if res.hw_conflicts else 0
    if args.json:
        _print_json({**res.as_dict(), "hw_collections": collections})
        return rc
    for line in report_lines(res, collections):
        print(line)
    return rc


def report_lines(res: KeyMigration, collections: Sequence[str]) -> list[str]:
    """The human-readable summary of ``res``."""
    done = "would be re-keyed" if res.dry_run else "re-keyed"
    lines = [
        f"dead letters {done}: {res.dead_letters} of messages, {res.raw_dead_letters} of raw "
        "input lines",
        f"parked messages {done}: {res.parked}",
        f"of these, merged into an existing document with the new id: {res.merged}",
    ]
    if res.raw_left:
        lines.append(f"raw dead letters left as they are (text stored truncated, the id "
                     f"cannot be recomputed): {res.raw_left}")
    if collections:
        verb = "would be replaced" if res.dry_run else "replaced"
        lines.append(f"hw: {res.hw_legacy_keys} ambiguous key(s) in {res.hw_documents} "
                     f"document(s) {verb} by a mark per possible source "
                     f"(collections: {', '.join(collections)})")
        if res.hw_conflicts:
            lines.append(f"hw: {res.hw_conflicts} document(s) kept changing: run it again")
    else:
        lines.append("hw maps not checked: pass --aggregates MODULE or --collection NAME")
    if res.dry_run:
        lines.append("dry run: nothing changed")
    return lines
