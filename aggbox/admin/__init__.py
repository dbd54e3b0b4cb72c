"""Operator commands: ``aggbox deadletters …``, ``aggbox parked …``, ``aggbox effects …``,
``aggbox timers …``, ``aggbox indexes``.

They work on the MongoDB named by ``AGGBOX_MONGODB_URI`` (or ``mongodb_uri`` in the
``[aggbox]`` section of ``--config FILE``) and never start a throwaway local server: an
operator must act on the real store. Tables are printed with ``rich``; ``--json`` prints
machine-readable output instead.

Exit codes: 0 success; 1 error (bad configuration, server unreachable, unknown aggregate
type, …); 2 usage error; 3 the action ran but did not settle everything (a replayed message
was dead-lettered or parked again, a requested id does not exist, a parked message still
waits).

``aggbox deadletters dismiss`` marks open dead letters ``dismissed`` (never deletes them): for
ones an operator decided need no replay, e.g. ``beyond_dedup_horizon`` duplicates.

This module holds the argument tables and ``aggbox indexes``; the commands are in
:mod:`aggbox.admin.deadletters` and :mod:`aggbox.admin.parked`, what they share (settings,
URI check, database, output) in :mod:`aggbox.admin._shared`.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable
from datetime import UTC, datetime

from aggbox.admin._shared import (
    EXIT_UNSETTLED,
    _console,
    _database,
    _registry,
    _table,
    check_mongodb_uri,
    mongodb_uri_source,
)
from aggbox.admin.deadletters import (
    _cmd_deadletters_dismiss,
    _cmd_deadletters_list,
    _cmd_deadletters_replay,
    _cmd_deadletters_show,
)
from aggbox.admin.effects import STATES, cmd_effects_list
from aggbox.admin.parked import _cmd_parked_list, _cmd_parked_release
from aggbox.admin.timers import register as register_timers
from aggregates.core.uri import redact_uri
from dispatcher.effects.attempts import DEFAULT_COLLECTION

Handler = Callable[[argparse.Namespace], int]


_EPILOG = """\
The MongoDB URI comes from AGGBOX_MONGODB_URI (or mongodb_uri in the [aggbox] section of the
config file); the database from AGGBOX_DATABASE / database (default "aggbox"). Admin commands
never start a local server.

Exit codes: 0 ok, 1 error, 2 usage error, 3 ran but left messages unsettled."""


# -- registration ----------------------------------------------------------------------------
class _Formatter(argparse.HelpFormatter):
    """Wraps descriptions and epilogs paragraph by paragraph (blank lines are kept)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n\n".join(textwrap.fill(" ".join(par.split()), width, initial_indent=indent,
                                         subsequent_indent=indent)
                           for par in text.split("\n\n"))


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``deadletters``, ``parked``, ``effects``, ``timers`` and ``indexes`` to the
    ``aggbox`` command."""
    fmt = _Formatter

    dl = subparsers.add_parser(
        "deadletters", help="list, show, replay and dismiss dead letters",
        description="Dead letters: messages that could not be applied, with the reason.",
        epilog=_EPILOG, formatter_class=fmt)
    _group(dl, "deadletters_action")
    dl_sub = dl.add_subparsers(dest="deadletters_action", metavar="ACTION")

    p = dl_sub.add_parser(
        "list", help="list dead letters, newest first", epilog=_EPILOG, formatter_class=fmt,
        description="List dead letters, newest first (by last_seen, when they were last "
        "dead-lettered), with counts of open ones by reason, and of the matching ones by "
        "reason when filters are given.")
    _store_options(p)
    _filter_options(p, "only")
    p.add_argument("--status", default="open", choices=_STATUSES,
                   help="open (default): not settled yet; replayed: settled by a replay; "
                   "superseded: a high-water duplicate the mark moved past; parked: a replay "
                   "parked them; dismissed: an operator dismissed them; all: any status")
    p.add_argument("--limit", metavar="N", type=_positive, default=50,
                   help="show at most N (default 50)")
    p.add_argument("--json", action="store_true",
                   help='print a JSON object {"items": [...], "total": N}: the dead '
                   "letters (with message and traceback) and how many match")
    p.set_defaults(func=_cmd_deadletters_list)

    p = dl_sub.add_parser(
        "show", help="show one dead letter in full (message, error, traceback)",
        epilog=_EPILOG, formatter_class=fmt,
        description="Show dead letters in full: message envelope, error and traceback.")
    _store_options(p)
    p.add_argument("ids", nargs="+", metavar="ID",
                   help="dead-letter id (<type>/<aggregate id>/<message id>) or message id")
    p.add_argument("--json", action="store_true",
                   help='print a JSON object {"items": [...], "missing": [ids]}')
    p.set_defaults(func=_cmd_deadletters_show)

    p = dl_sub.add_parser(
        "replay", help="re-submit dead letters through the store writer",
        epilog=_EPILOG, formatter_class=fmt,
        description="Re-submit dead-lettered messages through the store writer, in the order "
        "they occurred. Dedup still applies, so a replay is safe: a message applied meanwhile "
        "comes back 'duplicate'. Dead letters that end applied/duplicate are marked "
        "'replayed' ('superseded' for a high-water duplicate that was never applied: the mark "
        "moved past it), parked ones 'parked'; dead-lettered again, they stay open with the "
        "new reason. Select them with --id, or --reason/--type among the open ones, or --all.")
    _store_options(p)
    _aggregates_option(p, required=True)
    p.add_argument("--id", dest="ids", action="append", metavar="ID",
                   help="dead-letter id or message id; repeat for several (any status)")
    p.add_argument("--reason", metavar="R", help="all open dead letters with this reason")
    p.add_argument("--type", "--aggregate-type", metavar="T", dest="aggregate_type",
                   help="all open dead letters of this aggregate type")
    p.add_argument("--all", dest="all_open", action="store_true",
                   help="all open dead letters (dismissed ones are not open)")
    p.add_argument("--limit", metavar="N", type=_positive, default=None,
                   help="replay at most N of the selected dead letters")
    p.add_argument("--dry-run", action="store_true",
                   help="only list what would be replayed; change nothing")
    p.add_argument("--json", action="store_true", help="print the outcomes as JSON")
    p.set_defaults(func=_cmd_deadletters_replay)

    p = dl_sub.add_parser(
        "dismiss", help="mark open dead letters 'dismissed' in bulk (never deletes them)",
        epilog=_EPILOG, formatter_class=fmt,
        description="Mark the matching open dead letters 'dismissed' (with dismissed_at and "
        "an optional note) and print how many; nothing is deleted or re-submitted. Use it for "
        "dead letters that need no replay, e.g. beyond_dedup_horizon ones found to be old "
        "duplicates. Filters combine (all must match); at least one of --id, --reason, "
        "--aggregate-type, --before or --since is required. Running it again dismisses "
        "nothing more. Dismissed ones leave the default list (--status dismissed shows them) "
        "and replays by --reason/--type/--all; `replay --id ID` can still re-submit one. A "
        "dismissed message that is dead-lettered again is open again.")
    _store_options(p)
    p.add_argument("--id", dest="ids", action="append", metavar="ID",
                   help="dead-letter id or message id; repeat for several")
    _filter_options(p, "only")
    p.add_argument("--note", metavar="TEXT",
                   help="why they were dismissed (stored as dismiss_note)")
    p.add_argument("--dry-run", action="store_true",
                   help="only print how many would be dismissed, by reason; change nothing")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_cmd_deadletters_dismiss)

    pk = subparsers.add_parser(
        "parked", help="list parked messages, release blocked aggregates",
        description="Parked messages wait for something (a sequence gap, a full outbox, a "
        "blocked aggregate); they are retried whenever their aggregate is processed again.",
        epilog=_EPILOG, formatter_class=fmt)
    _group(pk, "parked_action")
    pk_sub = pk.add_subparsers(dest="parked_action", metavar="ACTION")

    p = pk_sub.add_parser(
        "list", help="list parked messages, oldest first", epilog=_EPILOG, formatter_class=fmt,
        description="List parked messages, oldest first. With --aggregates, also list "
        "aggregates blocked by a failed handler (they may have nothing parked yet).")
    _store_options(p)
    p.add_argument("--reason", metavar="R", help="only this reason (e.g. sequence_gap)")
    p.add_argument("--type", metavar="T", dest="aggregate_type",
                   help="only messages for this aggregate type")
    p.add_argument("--aggregate", metavar="TYPE/ID", type=_aggregate_ref,
                   help="only messages for this aggregate")
    p.add_argument("--limit", metavar="N", type=_positive, default=50,
                   help="show at most N (default 50)")
    _aggregates_option(p, required=False,
                       extra=" (to also list blocked aggregates of its types)")
    p.add_argument("--json", action="store_true",
                   help='print a JSON object {"items": [...], "total": N, "blocked": '
                   '[...]}; "blocked" lists blocked aggregates with --aggregates, and is '
                   "empty without it")
    p.set_defaults(func=_cmd_parked_list)

    p = pk_sub.add_parser(
        "release", help="unblock aggregates and retry their parked messages",
        epilog=_EPILOG, formatter_class=fmt,
        description="Clear _blocked on each aggregate ($unset with $inc _v, so a concurrent "
        "writer conflicts instead of overwriting), then retry its parked messages with the "
        "store writer and print the outcomes. Without --aggregates only the block is "
        "cleared (the collection comes from --collection or the parked entries); the parked "
        "messages are then retried with the aggregate's next message. The message that "
        "blocked the aggregate stays a dead letter: fix the handler and replay it.")
    _store_options(p)
    p.add_argument("--aggregate", metavar="TYPE/ID", type=_aggregate_ref, action="append",
                   required=True, dest="aggregates_to_release",
                   help="the aggregate to release, e.g. Order/o-17; repeat for several")
    _aggregates_option(p, required=False, extra=" (needed to retry the parked messages now)")
    p.add_argument("--collection", metavar="NAME",
                   help="the aggregates' collection, when --aggregates is not given")
    p.add_argument("--json", action="store_true",
                   help='print a JSON object {"items": [one per aggregate]}')
    p.set_defaults(func=_cmd_parked_release)

    ef = subparsers.add_parser(
        "effects", help="list the side effects' attempt records",
        description="Every effect entry the dispatcher executes (docs/side-effects.md) has an "
        "attempt record: attempting (called, or about to be; no result recorded yet), "
        "succeeded or failed.", epilog=_EPILOG, formatter_class=fmt)
    _group(ef, "effects_action")
    ef_sub = ef.add_subparsers(dest="effects_action", metavar="ACTION")
    p = ef_sub.add_parser(
        "list", help="list attempt records, oldest last attempt first", epilog=_EPILOG,
        formatter_class=fmt,
        description="List attempt records, oldest last attempt first. The default shows the "
        "effects still attempting: called with no result recorded (a crash, a timeout, a "
        "dropped response) or failing and being retried; --older-than finds the stuck ones.")
    _store_options(p)
    p.add_argument("--state", choices=STATES, default="attempting",
                   help="which records (default: attempting)")
    p.add_argument("--type", metavar="T", dest="effect_type",
                   help="only this effect (message) type, e.g. BookShipment")
    p.add_argument("--aggregate", metavar="TYPE/ID", type=_aggregate_ref,
                   help="only the effects of this aggregate, e.g. Order/o-17")
    p.add_argument("--older-than", metavar="MINUTES", type=_minutes,
                   help="only records whose last attempt is older than MINUTES")
    p.add_argument("--collection", metavar="NAME",
                   help="the attempt records' collection (default: effect_collection of the "
                   f"[dispatcher] settings, {DEFAULT_COLLECTION} unless changed)")
    p.add_argument("--limit", metavar="N", type=_positive, default=50,
                   help="show at most N (default 50)")
    p.add_argument("--json", action="store_true",
                   help='print a JSON object {"items": [...], "total": N}')
    p.set_defaults(func=cmd_effects_list)

    register_timers(subparsers, store_options=_store_options, aggregates_option=_aggregates_option,
                    positive=_positive, formatter=fmt, epilog=_EPILOG, group=_group)

    p = subparsers.add_parser(
        "indexes", help="create the indexes the writer needs (idempotent)",
        epilog=_EPILOG, formatter_class=fmt,
        description="Create the writer's indexes on every aggregate collection of the "
        "module, and on the dead-letter and parked collections. Safe to run repeatedly.")
    _store_options(p)
    _aggregates_option(p, required=True)
    p.set_defaults(func=_cmd_indexes)


def _group(parser: argparse.ArgumentParser, dest: str) -> None:
    def show_help(args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(func=show_help)


def _store_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE",
                   help="TOML config file (section [aggbox]); default: $AGGBOX_CONFIG")
    p.add_argument("--database", metavar="NAME",
                   help="database name (default: AGGBOX_DATABASE or the config file)")
    p.add_argument("--timeout", metavar="SECONDS", type=float, default=5.0,
                   help="how long to wait for the MongoDB server (default 5)")


def _aggregates_option(p: argparse.ArgumentParser, *, required: bool, extra: str = "") -> None:
    p.add_argument("--aggregates", metavar="MODULE", required=required,
                   help="Python module defining the aggregate types (a `registry` or "
                   f"AggregateType objects), e.g. aggbox.examples.orders{extra}")


#: ``--status`` choices of ``deadletters list``.
_STATUSES = ("open", "replayed", "superseded", "parked", "dismissed", "all")


def _filter_options(p: argparse.ArgumentParser, which: str) -> None:
    """``--reason``, ``--type``/``--aggregate-type``, ``--before``, ``--since``."""
    p.add_argument("--reason", metavar="R",
                   help=f"{which} this reason code (e.g. beyond_dedup_horizon)")
    p.add_argument("--aggregate-type", "--type", metavar="T", dest="aggregate_type",
                   help=f"{which} dead letters of this aggregate type")
    p.add_argument("--before", metavar="TIME", type=_iso_time,
                   help=f"{which} dead letters last dead-lettered before TIME (ISO 8601, e.g. "
                   "2024-05-01 or 2024-05-01T12:00:00+02:00; UTC without an offset)")
    p.add_argument("--since", metavar="TIME", type=_iso_time,
                   help=f"{which} dead letters last dead-lettered at or after TIME (ISO 8601)")


def _iso_time(text: str) -> datetime:
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 time; write e.g. 2024-05-01, 2024-05-01T12:00:00Z "
            "or 2024-05-01T12:00:00+02:00 (UTC when no offset is given)") from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be ≥ 1, got {value}")
    return value


def _minutes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of minutes") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number ≥ 0, got {text!r}")
    return value


def _aggregate_ref(text: str) -> tuple[str, str]:
    atype, sep, agg_id = text.partition("/")
    if not sep or not atype or not agg_id:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not TYPE/ID (aggregate type, a slash, the aggregate id), e.g. "
            "Order/o-17")
    return atype, agg_id


# -- indexes -----------------------------------------------------------------------------------
def _cmd_indexes(args: argparse.Namespace) -> int:
    from aggregates.store.writer import StoreWriter

    registry = _registry(args.aggregates)
    with _database(args) as (settings, db):
        StoreWriter(db, registry, settings=settings).ensure_indexes()
    rows = [[t.name, t.collection] for t in registry]
    rows += [["(dead letters)", settings.dead_letter_collection],
             ["(parked)", settings.parked_collection]]
    _console().print(_table(f"Indexes ensured in database {settings.database!r}",
                            ("aggregate type", "collection"), rows))
    return 0


__all__ = ["EXIT_UNSETTLED", "check_mongodb_uri", "mongodb_uri_source", "redact_uri",
           "register"]
