"""What the operator commands share: settings and the MongoDB URI check, the database
connection (never a throw-away local server), the aggregates module, and output (``rich``
tables, ``--json``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from aggbox.commands.preflight import mongodb_uri_source as mongodb_uri_source
from aggregates.core.errors import AggboxError, ConfigurationError
from aggregates.core.uri import redact_uri

if TYPE_CHECKING:
    from pymongo.database import Database
    from rich.console import Console

    from aggregates.core.settings import AggboxSettings
    from aggregates.domain.aggregate import Registry
    from aggregates.message.outcomes import Outcome

#: Exit status when an action ran but left messages unsettled.
EXIT_UNSETTLED = 3


# -- connection ------------------------------------------------------------------------------
def _settings(args: argparse.Namespace) -> AggboxSettings:
    from pydantic import ValidationError

    from aggregates.core.settings import AggboxSettings

    overrides: dict[str, Any] = {}
    if getattr(args, "database", None):
        overrides["database"] = args.database
    try:
        return AggboxSettings.load(config_file=args.config, **overrides)
    except ValidationError as exc:
        raise ConfigurationError(f"invalid settings: {exc}") from None


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

    from aggbox.commands.preflight import ping, store_problem
    from aggbox.servers import local_mongodb_uri
    from dispatcher.core.errors import describe_store_error

    settings = _settings(args)
    uri = settings.mongodb_uri or local_mongodb_uri()  # `aggbox local start`'s server, if up
    if not uri:
        raise ConfigurationError(
            "no MongoDB configured: set AGGBOX_MONGODB_URI (or mongodb_uri in the [aggbox] "
            "section of --config FILE) to the server that holds the aggregates; admin "
            "commands never start a local server"
        )
    source = (mongodb_uri_source() if settings.mongodb_uri
              else "the local server's URI (aggbox local)")
    check_mongodb_uri(uri, source)
    client: Any = MongoClient(uri, serverSelectionTimeoutMS=int(args.timeout * 1000),
                              tz_aware=True, appname="aggbox-admin")
    try:
        ping(client, uri, source=source)  # unreachable: the dispatcher's one line
        try:
            yield settings, client[settings.database]
        except PyMongoError as exc:
            message = store_problem(uri, exc, timeout_s=args.timeout, source=source)
            raise AggboxError(message or f"MongoDB error ({redact_uri(uri)}, database "
                              f"{settings.database!r}): {describe_store_error(exc)}") from None
    finally:
        client.close()


def _registry(module: str) -> Registry:
    from aggregates.domain.aggregate import Registry

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
