"""``aggbox check-store``: run aggbox's store contract against a MongoDB (the package
:mod:`aggbox.checkstore`) and say whether aggbox's guarantees hold there.

The URI is ``--uri``, else ``AGGBOX_MONGODB_URI`` (or ``mongodb_uri`` in the ``[aggbox]``
section of ``--config``), else the server of ``aggbox local start``; a server is never
started. Exit status: 0 usable (UNSUPPORTED lines have a fallback), 1 a check aggbox needs
failed or the server could not be reached (or is not a MongoDB server), 2 a usage error (no
MongoDB given, a bad URI or database name, a database that is not empty, a config file that
is missing, not TOML or holds an unknown section or an invalid setting). With ``--json``,
stdout is one JSON object in every case: the report, or ``{"error": …, "exit_status": …}``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["register", "run"]

#: :data:`aggbox.checkstore.report.EXIT_USAGE` (not imported here: ``aggbox --help`` stays
#: light).
EXIT_USAGE_STATUS = 2

_DESCRIPTION = """\
Check that a MongoDB deployment does what aggbox relies on: conditional updates on
{_id, _v}, per-operation errors (E11000) in unordered bulk writes and upsert races,
Decimal128/UUID/datetime round trips, the writer's and the archive's indexes (TTL
included), documents at the size budget and the 16 MiB limit, change streams with
updateLookup and resuming from a stored token, retryable writes. Each check is one line:
PASS, FAIL, or UNSUPPORTED (aggbox falls back, and says how); then a verdict.

Everything happens in a scratch database that the command creates and drops
(aggbox_check_<random>, or --database NAME, which must be empty); no other database is
touched. The URI comes from --uri, else AGGBOX_MONGODB_URI (or mongodb_uri in the [aggbox]
section of the config file), else the server of `aggbox local start`; a server is never
started. Exit status 0 when aggbox can run here, 1 when a check it needs fails or the
server cannot be reached, 2 for usage errors.
"""

_EPILOG = """\
examples:
  aggbox check-store --uri 'mongodb://user:secret@db1,db2,db3/?replicaSet=rs0'
  aggbox check-store --json --timeout 10
"""


def register(subparsers: Any) -> None:
    """Add ``aggbox check-store`` to the ``aggbox`` command."""
    p = subparsers.add_parser(
        "check-store", help="check that a MongoDB does what aggbox relies on (scratch "
                            "database, created and dropped)",
        description=_DESCRIPTION, epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--uri", metavar="URI",
                   help="the MongoDB to check (default: AGGBOX_MONGODB_URI, the config "
                        "file's mongodb_uri, else the server of `aggbox local start`)")
    p.add_argument("--config", metavar="FILE",
                   help="TOML config file ([aggbox]: mongodb_uri, max_document_bytes); "
                        "default: $AGGBOX_CONFIG")
    p.add_argument("--database", metavar="NAME",
                   help="scratch database to create and drop (default: aggbox_check_<random>);"
                        " refused unless empty")
    p.add_argument("--timeout", metavar="SECONDS", type=float,
                   help="server selection timeout (default: the URI's "
                        "serverSelectionTimeoutMS, else 5)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (checks, verdict) on stdout")
    p.set_defaults(func=run, config_error_status=EXIT_USAGE_STATUS)


def _error(message: str, status: int, as_json: bool = False, uri: str | None = None) -> int:
    """One line on stderr; with ``--json`` also the one object on stdout (``| jq`` always
    gets one)."""
    line = " ".join(message.split())
    print(f"aggbox check-store: error: {line}", file=sys.stderr)
    if as_json:
        import json

        from aggregates.core.uri import redact_uri

        print(json.dumps({"uri": redact_uri(uri) if uri else None, "error": line,
                          "checks": [], "usable": False, "exit_status": status},
                         ensure_ascii=False))
    return status


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from aggbox.admin._shared import check_mongodb_uri, mongodb_uri_source
    from aggbox.checkstore import NotEmpty, Target, Unreachable, check_store
    from aggbox.checkstore.logic import database_problem, scratch_name
    from aggbox.checkstore.report import EXIT_FAILED, EXIT_USAGE
    from aggregates.core.errors import ConfigurationError
    from aggregates.core.settings import AggboxSettings

    if args.timeout is not None and not args.timeout > 0:
        return _error(f"--timeout {args.timeout:g}: give a number of seconds > 0", EXIT_USAGE,
                      args.json)
    database = args.database if args.database is not None else scratch_name()
    problem = database_problem(database)
    if problem:
        return _error(f"--database: {problem}", EXIT_USAGE, args.json)
    try:
        settings = AggboxSettings.load(config_file=args.config)
    except ValidationError as exc:  # a usage error, as every problem of the config file
        return _error(f"invalid settings: {exc}", EXIT_USAGE, args.json)
    except ConfigurationError as exc:  # a config file that does not exist, is not TOML, …
        return _error(str(exc), EXIT_USAGE, args.json)
    uri, source = _resolve(args.uri, settings.mongodb_uri, mongodb_uri_source)
    if uri is None:
        return _error("no MongoDB to check: pass --uri, set AGGBOX_MONGODB_URI (or "
                      "mongodb_uri in the [aggbox] section of --config FILE), or run "
                      "`aggbox local start`; check-store never starts a server", EXIT_USAGE,
                      args.json)
    try:
        check_mongodb_uri(uri, source)
    except ConfigurationError as exc:
        return _error(str(exc), EXIT_USAGE, args.json)  # the URI itself is not shown
    try:
        report = check_store(Target(uri, source, database, args.timeout), settings)
    except Unreachable as exc:  # NotMongoDB included
        return _error(str(exc), EXIT_FAILED, args.json, uri)
    except NotEmpty as exc:
        return _error(str(exc), EXIT_USAGE, args.json, uri)
    if args.json:
        import json

        print(json.dumps(report.as_dict(), ensure_ascii=False, indent=2))
    else:
        _print(report)
    return report.exit_status


def _resolve(option: str | None, configured: str | None, configured_source: Any
             ) -> tuple[str | None, str]:
    if option:
        return option, "--uri"
    if configured:
        return configured, str(configured_source())
    from aggbox.servers import local_mongodb_uri

    local = local_mongodb_uri()  # `aggbox local start`'s server, if it answers
    return local, "the URI of `aggbox local start`'s server"


def _print(report: Any) -> None:
    from aggbox.admin._shared import _console
    from aggbox.checkstore.report import header_lines, render_table

    console = _console()
    for line in header_lines(report):
        console.print(line, markup=False, highlight=False)
    console.print(render_table(report))
    # soft_wrap: the verdict is the last line, whole, whatever the width (a pipe, COLUMNS)
    console.print(report.verdict, markup=False, highlight=False, soft_wrap=True,
                  style="bold red" if report.failed else "bold")
