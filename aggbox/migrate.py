"""``aggbox migrate``: rewrite stored data in place, for a change of the document layout
(docs/design.md "Compatibility").

Each migration is an ``ACTION`` of this command in its own module, registered here. A
migration is idempotent and resumable (an interrupted run is completed by running it again;
a second run changes nothing), never conflicts with a running writer (it filters on what it
changes and does not increment ``_v`` unless it changes state the writer reads), and has a
``--dry-run``. A migration to a new layout version also raises ``_lv`` on the documents it
rewrote (:data:`aggregates.fold.document.LAYOUT_VERSION`).

Today: ``partitions`` (:mod:`aggbox.migrate_partitions`) gives documents without ``_p``
their partition.
"""

from __future__ import annotations

import argparse

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``aggbox migrate`` and its actions."""
    from aggbox.admin import _EPILOG, _Formatter, _group
    from aggbox.migrate_partitions import register_partitions

    mg = subparsers.add_parser(
        "migrate", help="rewrite stored aggregate documents in place (layout changes)",
        description="Rewrite stored aggregate documents in place, for a change of the "
        "document layout. Every action is idempotent and resumable.",
        epilog=_EPILOG, formatter_class=_Formatter)
    _group(mg, "migrate_action")
    sub = mg.add_subparsers(dest="migrate_action", metavar="ACTION")
    register_partitions(sub)  # ``aggbox migrate partitions``, in its own module
