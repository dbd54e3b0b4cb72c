"""``aggbox local start|status|stop``: one local MongoDB for several commands.

Without ``AGGBOX_MONGODB_URI`` every ``aggbox`` command would start its own throw-away
MongoDB and lose its results when it exits. ``aggbox local start`` starts one server in the
background that outlives the command; ``aggbox run``, ``aggbox dispatch``, ``aggbox
deadletters`` … find it by themselves (no variable to export) until ``aggbox local stop``.

The server is mongo-java-server with its H2 backend: data on disk in ``$AGGBOX_HOME/mongodb``
(default ``~/.aggbox/mongodb``), kept across ``stop``/``start`` (``stop --delete-data``
removes it). See :mod:`aggbox.servers.persistent`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

#: Exit status of ``aggbox local status`` when no local server runs.
EXIT_NOT_RUNNING = 3

_EPILOG = """\
State: $AGGBOX_HOME (default ~/.aggbox)/local-mongodb.json; data and log: .../mongodb/.
AGGBOX_MONGODB_URI, when set, takes precedence over the local server in every command.

Exit codes: 0 ok (status: running), 1 error, 3 status: not running."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "local",
        help="start/stop one local MongoDB that outlives commands",
        description=__doc__,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = p.add_subparsers(dest="local_command", metavar="ACTION", required=True)
    start = actions.add_parser("start", help="start the local server (no-op if it runs)")
    start.add_argument("--timeout", type=float, default=120.0,
                       help="seconds to wait for the server to answer (default: 120)")
    start.set_defaults(func=_start)
    status = actions.add_parser("status", help="is it running? (exit 0 yes, 3 no)")
    status.add_argument("--json", action="store_true", help="print the state as JSON")
    status.set_defaults(func=_status)
    stop = actions.add_parser("stop", help="stop the local server (no-op if none runs)")
    stop.add_argument("--delete-data", action="store_true",
                      help="also delete its data directory")
    stop.add_argument("--timeout", type=float, default=30.0,
                      help="seconds to wait before SIGKILL (default: 30)")
    stop.set_defaults(func=_stop)


def _fail(message: str) -> int:
    print(f"aggbox: error: {message}", file=sys.stderr)
    return 1


def _start(args: argparse.Namespace) -> int:
    from aggbox.servers import ServerError
    from aggbox.servers.persistent import start_persistent_mongodb

    try:
        state, started = start_persistent_mongodb(timeout=args.timeout)
    except ServerError as exc:
        return _fail(str(exc))
    print(("started" if started else "already running") + f" local MongoDB ({state.kind}), "
          f"pid {state.pid}")
    print(f"uri:  {state.uri}")
    print(f"data: {state.data} (kept until `aggbox local stop --delete-data`)")
    print(f"log:  {state.log}")
    print("aggbox commands use it automatically (AGGBOX_MONGODB_URI, when set, wins); "
          "stop it with `aggbox local stop`")
    return 0


def _status(args: argparse.Namespace) -> int:
    from aggbox.servers.persistent import running_local_server

    state = running_local_server()
    if args.json:
        doc: dict[str, Any] = {"running": state is not None}
        if state is not None:
            doc.update(vars(state), uptime_seconds=round(state.uptime_seconds()))
        print(json.dumps(doc))
    elif state is None:
        print("not running (start it with `aggbox local start`)")
    else:
        print(f"running: local MongoDB ({state.kind}), pid {state.pid}, "
              f"up {_duration(state.uptime_seconds())}")
        print(f"uri:  {state.uri}")
        print(f"data: {state.data}")
        print(f"log:  {state.log}")
    return 0 if state is not None else EXIT_NOT_RUNNING


def _stop(args: argparse.Namespace) -> int:
    from aggbox.servers import ServerError
    from aggbox.servers.persistent import stop_persistent_mongodb

    try:
        state = stop_persistent_mongodb(timeout=args.timeout, delete_data=args.delete_data)
    except ServerError as exc:
        return _fail(str(exc))
    if state is None:
        print("no local MongoDB running")
    else:
        print(f"stopped local MongoDB (pid {state.pid})")
    if args.delete_data:
        print("deleted its data")
    elif state is not None:
        print(f"data kept in {state.data} (`aggbox local start` reopens it)")
    return 0


def _duration(seconds: float) -> str:
    s = int(seconds)
    hours, rest = divmod(s, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"
