"""``aggbox trace AUDIT MESSAGE_ID``: a message's causation chain through the outcome audit
log (:func:`aggregates.debug.trace`) — the text tree, and with ``--svg FILE`` the chain as a
sequence diagram (issue 44, item 9). ``aggbox outcomes AUDIT``: the audit log's outcomes by
reason per run, and with ``--svg FILE`` as a bar chart (:func:`aggregates.debug.outcome_chart`).

AUDIT is the Parquet directory (or file) ``aggbox run --outcomes DIR`` writes, one
``run_id=…`` directory per run. Both only read; both need pandas and pyarrow (the ``spark``
extra).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``trace`` and ``outcomes`` to the ``aggbox`` command (only argparse here)."""
    p = subparsers.add_parser(
        "trace", help="follow a message through the audit log: its causes and effects "
        "(--svg: a sequence diagram)",
        description="Follow a message through the outcome audit log (aggbox run --outcomes "
        "DIR): the messages that caused it, back to the input, and those it caused, as a "
        "tree; with --svg FILE also as a sequence diagram, one lane per aggregate, one arrow "
        "per message. Nothing is written but FILE.")
    p.add_argument("audit", metavar="AUDIT",
                   help="the audit log: the Parquet directory (or file) of aggbox run "
                   "--outcomes")
    p.add_argument("message_id", metavar="MESSAGE_ID", help="the message to trace")
    p.add_argument("--svg", metavar="FILE", help="write the chain as a sequence diagram (SVG)")
    p.add_argument("--max-depth", metavar="N", type=int, default=100,
                   help="levels followed each way (default 100)")
    p.set_defaults(func=_trace)

    p = subparsers.add_parser(
        "outcomes", help="count the audit log's outcomes by reason per run (--svg: a bar "
        "chart)",
        description="Count the outcome audit log's rows (aggbox run --outcomes DIR) by run, "
        "outcome and reason; with --svg FILE also as a bar chart.")
    p.add_argument("audit", metavar="AUDIT",
                   help="the audit log: the Parquet directory (or file) of aggbox run "
                   "--outcomes")
    p.add_argument("--svg", metavar="FILE", help="write the counts as a bar chart (SVG)")
    p.add_argument("--json", action="store_true",
                   help="print a JSON object: bars (run, outcome, reason, count)")
    p.set_defaults(func=_outcomes)


def _trace(args: argparse.Namespace) -> int:
    from aggregates.debug import trace

    t = trace(args.audit, args.message_id, max_depth=args.max_depth)
    print(t.tree)
    if args.svg:
        written = t.diagram().save(args.svg)
        print(f"sequence diagram: {written}")
    return 0


def _outcomes(args: argparse.Namespace) -> int:
    from aggregates.debug import outcome_chart

    chart = outcome_chart(args.audit)
    rows: list[dict[str, Any]] = [{"run": b.run, "outcome": b.outcome, "reason": b.reason,
                                   "count": b.count} for b in chart.bars]
    if args.svg:
        chart.save(args.svg)
    if args.json:
        print(json.dumps({"bars": rows, "svg": args.svg}))
        return 0
    width = max((len(r["run"]) for r in rows), default=3)
    for r in rows:
        reason = f" / {r['reason']}" if r["reason"] else ""
        print(f"{r['run']:<{width}}  {r['count']:>10,}  {r['outcome']}{reason}")
    if args.svg:
        print(f"bar chart: {args.svg}")
    return 0
