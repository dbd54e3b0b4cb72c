"""``aggbox dispatch-status``: the dispatcher instances of each collection, the partitions
each holds, the lag per partition (oldest pending entry) and the last hand-over
(:mod:`dispatcher.status.report`; docs/operations.md, "Dispatcher status").

Like the admin commands it reads the MongoDB of ``AGGBOX_MONGODB_URI`` (or ``mongodb_uri``
in the ``[aggbox]`` section of ``--config``), else the server of ``aggbox local start``, and
never starts a server. The collections are resolved as ``aggbox dispatch`` resolves them
(``--collection``/``--aggregates``, else ``[dispatcher]`` ``collections``/``aggregates``).
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register", "run"]

_DESCRIPTION = """\
Show, for each dispatched collection: the dispatcher instances (live or not, heartbeat age,
the partitions whose live lease each holds, as ranges), the partitions nobody holds, the
partitions with the oldest pending outbox entries, the last hand-over of a partition from
one instance to another, and whether the partitions are spread fairly (every partition held,
live instances within one partition of each other). Read-only; exit status 0.

The MongoDB URI comes from AGGBOX_MONGODB_URI (or mongodb_uri in the [aggbox] section of the
config file), else the server of `aggbox local start`; a server is never started.
"""

_EPILOG = """\
examples:
  aggbox dispatch-status --aggregates aggbox.examples.orders
  aggbox dispatch-status --collection orders --collection customers --json
"""


def register(subparsers: Any) -> None:
    """Add ``aggbox dispatch-status`` to the ``aggbox`` command."""
    p = subparsers.add_parser(
        "dispatch-status",
        help="show dispatcher instances, their partitions, lag per partition and the last "
             "hand-over",
        description=_DESCRIPTION, epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="FILE",
                   help="TOML config file (sections [dispatcher] and [aggbox]); default: "
                        "$AGGBOX_CONFIG")
    p.add_argument("--database", metavar="NAME",
                   help="database name (default: AGGBOX_DATABASE or the config file)")
    p.add_argument("--timeout", metavar="SECONDS", type=float, default=10.0,
                   help="how long to wait for the MongoDB server (default 10)")
    p.add_argument("--collection", dest="collections", action="append", metavar="NAME",
                   help="a dispatched collection; repeat for several (default: as `aggbox "
                        "dispatch`: the dispatcher setting `collections`, else the "
                        "collections of --aggregates)")
    p.add_argument("--aggregates", metavar="MODULE",
                   help="Python module defining the aggregate types, e.g. "
                        "aggbox.examples.orders: their collections (unless --collection "
                        "is given; the configured `collections` do not apply then)")
    p.add_argument("--json", action="store_true",
                   help='print a JSON object {"items": [one per collection]}')
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from aggbox.admin._shared import _database, _print_json
    from dispatcher.core.settings import DispatcherSettings
    from dispatcher.daemon import resolve_collections
    from dispatcher.status.report import format_status, read_status

    overrides: dict[str, Any] = {}
    if args.collections:
        overrides["collections"] = args.collections
    if args.aggregates:
        overrides["aggregates"] = args.aggregates
        if not args.collections:
            overrides["collections"] = []  # the module's collections, not the config's
    settings = DispatcherSettings.load(config_file=args.config, **overrides)
    names = [name for name, _ in resolve_collections(settings)]
    with _database(args) as (_, db):
        statuses = [read_status(db, name, partition_collection=settings.partition_collection,
                                member_collection=settings.member_collection)
                    for name in names]
    if args.json:
        _print_json({"items": [s.as_dict() for s in statuses]})
    else:
        print("\n\n".join(format_status(s) for s in statuses))
    return 0
