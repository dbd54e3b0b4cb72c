"""What ``aggbox run`` and ``aggbox stream`` report besides the tables (:mod:`aggbox.commands.run`):
the verdict (exit status and ``"ok"``, docs/operations.md "Exit status"), the dead-lettered
and parked records by reason with a sample and the command that lists them, the ``by_type``
rows of the JSON summary, the ``--metrics-file``, and the one line of a job that failed
because the handlers cannot run there (docs/design.md, "Deployment errors")."""

from __future__ import annotations

import re
import shlex
from datetime import datetime
from typing import Any

__all__ = ["EXIT_DEAD_LETTERS", "by_type_rows", "count_arg", "deployment_line", "finish",
           "print_reason_rows", "reason_rows", "verdict", "write_metrics"]

#: The exit status of a run that dead-lettered more records than allowed (or, with
#: ``--fail-on-dead-letters``, parked any).
EXIT_DEAD_LETTERS = 3
#: ``deadletters list`` shows this many by default.
_LIST_LIMIT = 50


def verdict(counts: dict[str, int], *, accounted: bool, max_dead_letters: int | None,
            fail_on_parked: bool) -> tuple[int, str | None]:
    """The exit status and, when it is not 0, why: ``ok`` means exit status 0. Dead letters
    are those of input records and of released parked messages; ``max_dead_letters`` None:
    any number is allowed."""
    if not accounted:
        return 1, "input records and outcomes do not add up (a bug, please report it)"
    dead = counts.get("dead_lettered", 0) + counts.get("released_dead_lettered", 0)
    if max_dead_letters is not None and dead > max_dead_letters:
        allowed = (f"--max-dead-letters {max_dead_letters} allows" if max_dead_letters
                   else "none are allowed without --max-dead-letters N or "
                        "--allow-dead-letters")
        return EXIT_DEAD_LETTERS, f"{dead} record(s) dead-lettered; {allowed}"
    parked = counts.get("parked", 0)
    if fail_on_parked and parked:
        return EXIT_DEAD_LETTERS, f"{parked} record(s) parked (--fail-on-dead-letters)"
    return 0, None


def count_arg(text: str) -> int:
    """An ``argparse`` type: a count (0, 1, 2, …)."""
    import argparse

    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (0, 1, 2, …)")
    return int(text)


def finish(out: Any, args: Any, title: str, summary: dict[str, Any], result: Any,
           since: datetime, *, rate_line: str | None = None) -> int:
    """Print the tables (then ``rate_line``: how many messages at what rate), the
    dead-lettered and parked records by reason and, with
    ``--json``, the JSON line (``"ok"`` true exactly when the exit status is 0); return the
    exit status (docs/operations.md, "Exit status"). ``result``: a ``RunResult`` or
    ``StreamResult``; ``since``: when the command started."""
    import json
    import sys

    from spark.progress import by_type_table, summary_table

    status, problem = verdict(result.counts, accounted=result.ok, fail_on_parked=(
        args.fail_on_dead_letters), max_dead_letters=None if args.allow_dead_letters else (
        0 if args.fail_on_dead_letters else args.max_dead_letters))
    store = [*(["--config", args.config] if args.config else []),
             *(["--database", args.opt_aggbox_database] if args.opt_aggbox_database else [])]
    rows = reason_rows(result.reasons, result.samples, since=since, store_args=store)
    out.print(summary_table(title, result.input_count, result.counts, result.reasons))
    if result.by_type:
        out.print(by_type_table(result.by_type))
    if rate_line:
        out.print(rate_line, markup=False, highlight=False, soft_wrap=True)
    print_reason_rows(out, rows, problem)
    if args.json:
        summary.update(ok=status == 0, problem=problem, by_reason=rows)
        print(json.dumps(summary, default=str), file=sys.stdout, flush=True)
    return status


def reason_rows(reasons: dict[tuple[str, str], int],
                samples: dict[tuple[str, str], tuple[str, str | None]], *,
                since: datetime, store_args: list[str]) -> list[dict[str, Any]]:
    """Per dead-lettered or parked reason, largest count first: the count, the first
    message id (the smallest), the first line of its error, and the command that lists
    them all (``store_args``: the options that select the same store)."""
    rows = []
    for (outcome, reason), n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        if outcome not in ("dead_lettered", "parked"):
            continue
        first_id, detail = samples.get((outcome, reason), (None, None))
        if outcome == "dead_lettered":
            cmd = ["aggbox", "deadletters", "list", "--reason", reason, "--since",
                   since.strftime("%Y-%m-%dT%H:%M:%SZ")]
        else:
            cmd = ["aggbox", "parked", "list", "--reason", reason]
        if n > _LIST_LIMIT:
            cmd += ["--limit", str(n)]
        rows.append({"outcome": outcome, "reason": reason, "count": n,
                     "first_message_id": first_id,
                     "first_error": (detail or "").strip().split("\n", 1)[0] or None,
                     "command": shlex.join([*cmd, *store_args])})
    return rows


def print_reason_rows(console: Any, rows: list[dict[str, Any]], problem: str | None) -> None:
    """The rows of :func:`reason_rows` below the tables, details on lines of their own
    (never cut: the terminal wraps them), then why the run is not ok."""
    for r in rows:
        first = f", first {r['first_message_id']}" if r["first_message_id"] else ""
        console.print(f"{r['outcome']} {r['reason']}: {r['count']}{first}", markup=False,
                      highlight=False, soft_wrap=True)
        if r["first_error"]:
            console.print(f"    {r['first_error']}", markup=False, highlight=False,
                          soft_wrap=True)
        console.print(f"    all of them: {r['command']}", markup=False, highlight=False,
                      soft_wrap=True)
    if problem:
        console.print(f"not ok: {problem}", markup=False, highlight=False, soft_wrap=True)


_DEPLOYMENT = re.compile(r"DeploymentError: (.+)$")
_IMPORT = re.compile(r"^(?:ModuleNotFoundError|ImportError): ")


def deployment_line(lines: list[str], cause: str | None) -> str | None:
    """The one line of a Spark job that failed because the code cannot run on the workers:
    a handler's :class:`~aggregates.core.errors.DeploymentError` (its own message), or the
    aggregates module itself failing to import there (``cause``: the last exception line
    of the trace, with how to ship it). None for any other failure."""
    for line in reversed(lines):
        m = _DEPLOYMENT.search(line)
        if m:
            return m.group(1).strip()
    if cause and _IMPORT.match(cause):
        return (f"the Spark job failed: {cause} on the Spark workers: ship the module with "
                "the job (--py-files a wheel or .zip that contains it) or pip install it on "
                "every worker, then run again")
    return None


def by_type_rows(by_type: dict[tuple[str, str, str, str], int]) -> list[dict[str, Any]]:
    """``by_type`` for the JSON summary, largest count first."""
    return [{"aggregate_type": a, "message_type": m, "outcome": o, "reason": r, "count": n}
            for (a, m, o, r), n in sorted(by_type.items(), key=lambda kv: (-kv[1], kv[0]))]


def write_metrics(path: str | None, by_type: dict[tuple[str, str, str, str], int],
                  input_count: int, seconds: float) -> None:
    """With ``--metrics-file PATH``: the outcome counts in the Prometheus text format."""
    if not path:
        return
    import time

    from spark.metrics_export import render_metrics, write_metrics_file

    write_metrics_file(path, render_metrics(by_type, input_records=input_count,
                                            run_seconds=seconds, timestamp=time.time()))
