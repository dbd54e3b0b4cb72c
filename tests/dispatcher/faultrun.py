"""Test-only entry point: the dispatcher daemon with fault injection, as a process.

    python -m tests.dispatcher.faultrun RULES [aggbox dispatch options]

``RULES`` as in :meth:`dispatcher.core.faults.Faults.parse` (e.g. ``after_publish:kill@2``).
Production code never reads fault rules; this wrapper hands them to every
:class:`~dispatcher.daemon.Dispatcher` the command creates, then runs the ordinary command
line (``aggbox.commands.dispatch``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import dispatcher.daemon as daemon
from dispatcher.core.faults import Faults


def main(argv: Sequence[str]) -> int:
    rules, rest = argv[0], list(argv[1:])
    faults = Faults.parse(rules)
    production = daemon.Dispatcher

    class WithFaults(production):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["faults"] = faults
            super().__init__(*args, **kwargs)

    daemon.Dispatcher = WithFaults  # type: ignore[misc]
    from aggbox.commands.dispatch import main as dispatch_main

    return dispatch_main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
