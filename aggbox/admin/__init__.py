"""Operator commands: ``aggbox deadletters …``, ``aggbox parked …``, ``aggbox indexes``.

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
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from aggregates.errors import AggboxError, ConfigurationError

if TYPE_CHECKING:
    from pymongo.database import Database
    from rich.console import Console

    from aggregates.aggregate import Registry
    from aggregates.outcomes import Outcome
    from aggregates.settings import AggboxSettings

#: Exit status when an action ran but left messages unsettled.
EXIT_UNSETTLED = 3

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
    """Add ``deadletters``, ``parked`` and ``indexes`` to the ``aggbox`` command."""
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
                   help="print a JSON array of dead letters (with message and traceback)")
    p.set_defaults(func=_cmd_deadletters_list)

    p = dl_sub.add_parser(
        "show", help="show one dead letter in full (message, error, traceback)",
        epilog=_EPILOG, formatter_class=fmt,
        description="Show dead letters in full: message envelope, error and traceback.")
    _store_options(p)
    p.add_argument("ids", nargs="+", metavar="ID",
                   help="dead-letter id (<type>/<aggregate id>/<message id>) or message id")
    p.add_argument("--json", action="store_true", help="print a JSON array")
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
                   help='print a JSON object {"parked": [...], "blocked": [...]}; "blocked" '
                   "lists blocked aggregates with --aggregates, and is empty without it")
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
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_cmd_parked_release)

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
    p.add_argument("--timeout", metavar="SECONDS", type=float, default=10.0,
                   help="how long to wait for the MongoDB server (default 10)")


def _aggregates_option(p: argparse.ArgumentParser, *, required: bool, extra: str = "") -> None:
    p.add_argument("--aggregates", metavar="MODULE", required=required,
                   help="Python module defining the aggregate types (a `registry` or "
                   f"AggregateType objects), e.g. examples.orders{extra}")


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


def _aggregate_ref(text: str) -> tuple[str, str]:
    atype, sep, agg_id = text.partition("/")
    if not sep or not atype or not agg_id:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not TYPE/ID (aggregate type, a slash, the aggregate id), e.g. "
            "Order/o-17")
    return atype, agg_id


# -- connection ------------------------------------------------------------------------------
def _settings(args: argparse.Namespace) -> AggboxSettings:
    from pydantic import ValidationError

    from aggregates.settings import AggboxSettings

    overrides: dict[str, Any] = {}
    if getattr(args, "database", None):
        overrides["database"] = args.database
    try:
        return AggboxSettings.load(config_file=args.config, **overrides)
    except ValidationError as exc:
        raise ConfigurationError(f"invalid settings: {exc}") from None


def redact_uri(uri: str) -> str:
    """The URI without its password (safe for messages and logs), also when the password
    holds unescaped ``/``, ``@`` or ``?`` (then rather too much is hidden than too little)."""
    scheme, sep, rest = uri.partition("://")
    userinfo, at, hosts = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return uri
    return f"{scheme}://{userinfo.partition(':')[0]}:***@{hosts}"


def mongodb_uri_source(option: str | None = None) -> str:
    """Where ``mongodb_uri`` came from, for messages: the option (when given), else
    ``AGGBOX_MONGODB_URI`` when set, else the config file."""
    if option:
        return option
    if any(k.upper() == "AGGBOX_MONGODB_URI" for k in os.environ):
        return "AGGBOX_MONGODB_URI"
    return "mongodb_uri in the [aggbox] section of the config file"


def check_mongodb_uri(uri: str, source: str) -> None:
    """Raise :class:`ConfigurationError` (one line naming ``source``, never the password)
    when pymongo would reject ``uri``. ``mongodb+srv`` URIs are only checked up to their
    DNS lookup."""
    from pymongo.errors import PyMongoError
    from pymongo.uri_parser import parse_uri

    shown = redact_uri(uri)
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme not in ("mongodb", "mongodb+srv"):
        raise ConfigurationError(
            f"{source} {shown!r} is not a MongoDB URI: it must start with mongodb:// or "
            "mongodb+srv://, e.g. mongodb://USER:PASSWORD@HOST:27017")
    hosts, _, path = rest.partition("/")
    if "@" not in hosts and "@" in path.partition("?")[0]:
        raise ConfigurationError(
            f"{source} {shown!r}: the user name or password contains an unescaped '/'; "
            "percent-encode them with urllib.parse.quote_plus ('/' is %2F)")
    if scheme == "mongodb+srv":
        return
    try:
        parse_uri(uri)
    except (PyMongoError, ValueError) as exc:
        reason = str(exc).rstrip(".")
        password = rest.rpartition("@")[0].partition(":")[2]
        if password:
            reason = reason.replace(password, "***")
        raise ConfigurationError(f"{source} {shown!r} is not a valid MongoDB URI: {reason}. "
                                 f"Fix {source}") from None


@contextmanager
def _database(args: argparse.Namespace) -> Iterator[tuple[AggboxSettings, Database[Any]]]:
    from pymongo import MongoClient
    from pymongo.errors import PyMongoError

    from aggbox.servers import local_mongodb_uri

    settings = _settings(args)
    uri = settings.mongodb_uri or local_mongodb_uri()  # `aggbox local start`'s server, if up
    if not uri:
        raise ConfigurationError(
            "no MongoDB configured: set AGGBOX_MONGODB_URI (or mongodb_uri in the [aggbox] "
            "section of --config FILE) to the server that holds the aggregates; admin "
            "commands never start a local server"
        )
    check_mongodb_uri(uri, mongodb_uri_source() if settings.mongodb_uri else "the local "
                      "server's URI (aggbox local)")
    client: Any = MongoClient(uri, serverSelectionTimeoutMS=int(args.timeout * 1000),
                              tz_aware=True, appname="aggbox-admin")
    try:
        try:
            client.admin.command("ping")
        except PyMongoError as exc:
            raise AggboxError(f"cannot reach MongoDB at {redact_uri(uri)}: {exc}. Check "
                              "AGGBOX_MONGODB_URI and that the server is up.") from None
        try:
            yield settings, client[settings.database]
        except PyMongoError as exc:
            raise AggboxError(f"MongoDB error ({redact_uri(uri)}, database "
                              f"{settings.database!r}): {exc}") from None
    finally:
        client.close()


def _registry(module: str) -> Registry:
    from aggregates.aggregate import Registry

    return Registry.from_module(module)


def _console() -> Console:
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 160  # piped into a file or a log: no terminal width to respect
    return console


# -- output helpers ----------------------------------------------------------------------------
def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


def _print_json(value: Any) -> None:
    print(json.dumps(value, default=_json_default, ensure_ascii=False, indent=2))


def _cell(value: Any, width: int | None = 60) -> str:
    from aggregates.debug.render import compact

    return compact(value, width)


#: Free-text columns: they take the space left by the others.
_WRAPPING = frozenset({"error", "detail"})


def _table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]],
           *, caption: str | None = None, empty: str | None = None) -> Any:
    from rich.table import Table
    from rich.text import Text

    if not rows:
        return Text((empty or f"{title}: none") + (f"\n{caption}" if caption else ""))
    # Cells are Text, not markup strings: stored values are untrusted and may contain "[".
    table = Table(title=Text(title), caption=Text(caption) if caption else None,
                  title_justify="left", caption_justify="left")
    for h in headers:
        if h in _WRAPPING:
            table.add_column(h, overflow="fold", ratio=1, min_width=10)
        else:
            table.add_column(h, overflow="fold")
    widths = [240 if h in _WRAPPING else 80 for h in headers]
    for r in rows:
        table.add_row(*[Text(_cell(c, w)) for c, w in zip(r, widths, strict=True)])
    return table


def _outcome_rows(outcomes: Sequence[Outcome]) -> list[list[Any]]:
    return [[o.message_id, f"{o.aggregate_type}/{o.aggregate_id}", o.outcome, o.reason,
             o.detail, len(o.emitted_ids), "yes" if o.from_parked else ""] for o in outcomes]


_OUTCOME_HEADERS = ("message", "aggregate", "outcome", "reason", "detail", "emitted",
                    "released")


# -- deadletters -------------------------------------------------------------------------------
def _usage_error(args: argparse.Namespace, message: str) -> int:
    """Print a one-line usage error (exit status 2), before touching any server."""
    action = getattr(args, "deadletters_action", None)
    print(f"aggbox deadletters {action}: error: {message}", file=sys.stderr)
    return 2


def _range_error(args: argparse.Namespace) -> str | None:
    if args.before is not None and args.since is not None and args.since >= args.before:
        return (f"--since {args.since.isoformat()} is not earlier than --before "
                f"{args.before.isoformat()}: nothing can match; swap them")
    return None


def _filters(args: argparse.Namespace) -> dict[str, Any]:
    return {"reason": args.reason, "aggregate_type": args.aggregate_type,
            "before": args.before, "since": args.since}


def _describe(args: argparse.Namespace) -> str:
    parts = [f"id {i!r}" for i in getattr(args, "ids", None) or ()]
    if args.reason:
        parts.append(f"reason {args.reason}")
    if args.aggregate_type:
        parts.append(f"aggregate type {args.aggregate_type}")
    if args.since is not None:
        parts.append(f"last seen at or after {args.since.isoformat()}")
    if args.before is not None:
        parts.append(f"last seen before {args.before.isoformat()}")
    return ", ".join(parts)


def _by_reason(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "none"


def _record(doc: Mapping[str, Any]) -> dict[str, Any]:
    from aggregates.debug.listing import dead_letter_record

    return {**dead_letter_record(doc), "status_at": doc.get("status_at"),
            "dismissed_at": doc.get("dismissed_at"), "dismiss_note": doc.get("dismiss_note")}


def _cmd_deadletters_list(args: argparse.Namespace) -> int:
    from aggregates.deadletters import DeadLetterStore

    if (problem := _range_error(args)) is not None:
        return _usage_error(args, problem)
    status = None if args.status == "all" else args.status
    filtered = any(_filters(args).values()) or status != "open"
    with _database(args) as (settings, db):
        store = DeadLetterStore(db, collection=settings.dead_letter_collection)
        docs = store.list(**_filters(args), status=status, limit=args.limit)
        records = [_record(d) for d in docs]
        if args.json:
            _print_json(records)
            return 0
        counts = store.counts_by_reason()
        matching = store.counts_by_reason(**_filters(args), status=status) if filtered else counts
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

    from aggregates.deadletters import DeadLetterStore

    with _database(args) as (settings, db):
        store = DeadLetterStore(db, collection=settings.dead_letter_collection)
        records = [_record(d) for d in store.get(args.ids)]
    found = {r["id"] for r in records} | {r["message_id"] for r in records}
    missing = [i for i in args.ids if i not in found]
    if args.json:
        _print_json(records)
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
    from aggregates.deadletters import DeadLetterStore
    from aggregates.debug.listing import dead_letter_record
    from aggregates.debug.redrive import replay_dead_letters

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
                _print_json(records)
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
    from aggregates.outcomes import OutcomeCounts

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
    from aggregates.deadletters import DeadLetterStore

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


# -- parked ------------------------------------------------------------------------------------
def _cmd_parked_list(args: argparse.Namespace) -> int:
    from aggregates.debug.listing import parked_record
    from aggregates.document import F_BLOCKED
    from aggregates.parking import ParkedStore

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
        _print_json({"parked": records, "blocked": blocked})
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
    from aggregates.debug.release import ReleaseResult, clear_block, release_aggregate
    from aggregates.parking import ParkedStore

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
        _print_json([{"aggregate": f"{r.aggregate_type}/{r.aggregate_id}",
                      "cleared": r.cleared, "outcomes": [o.to_dict() for o in r.outcomes],
                      "still_parked": still[f"{r.aggregate_type}/{r.aggregate_id}"]}
                     for r in results])
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


# -- indexes -----------------------------------------------------------------------------------
def _cmd_indexes(args: argparse.Namespace) -> int:
    from aggregates.writer import StoreWriter

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
