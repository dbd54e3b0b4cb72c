"""What the command line shows: a live progress display of the running Spark stages and a
summary table of outcomes at the end (``rich``; plain text when not on a terminal).

The stages come from ``sparkContext.statusTracker()`` (polled), or on Spark Connect, which
has no ``sparkContext``, from the progress the server reports with each operation
(``spark.registerProgressHandler``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from aggregates.message.outcomes import OUTCOME_KINDS

__all__ = ["spark_progress", "summary_table"]

log = logging.getLogger("aggbox.spark")


@contextmanager
def spark_progress(spark: Any, console: Console, *, enabled: bool = True,
                   interval: float = 0.5) -> Iterator[Progress | None]:
    """Show one bar per active Spark stage (tasks done / total) while the block runs."""
    if not enabled:
        yield None
        return
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[extra]}"), TimeElapsedColumn(),
        console=console, transient=True,
    )
    from spark.session import is_connect

    if is_connect(spark):
        with _connect_progress(spark, progress):
            yield progress
        return
    stop = threading.Event()
    tracker = spark.sparkContext.statusTracker()
    bars: dict[int, Any] = {}

    def poll() -> None:
        while not stop.wait(interval):
            try:
                active = set(tracker.getActiveStageIds())
                for sid in active:
                    info = tracker.getStageInfo(sid)
                    if info is None:
                        continue
                    extra = f"failed {info.numFailedTasks}" if info.numFailedTasks else ""
                    if sid not in bars:
                        bars[sid] = progress.add_task(f"stage {sid}", total=info.numTasks,
                                                      extra=extra)
                    progress.update(bars[sid], completed=info.numCompletedTasks,
                                    total=info.numTasks, extra=extra)
                for sid in [s for s in bars if s not in active]:
                    progress.remove_task(bars.pop(sid))
            except Exception as exc:  # the display must never break the job
                log.debug("progress display: %s: %s", type(exc).__name__, exc, exc_info=True)
                continue

    thread = threading.Thread(target=poll, name="aggbox-progress", daemon=True)
    with progress:
        thread.start()
        try:
            yield progress
        finally:
            stop.set()
            thread.join(timeout=2 * interval + 1)


@contextmanager
def _connect_progress(spark: Any, progress: Progress) -> Iterator[None]:
    """Bars from the stage progress a Spark Connect server sends with each operation."""
    bars: dict[tuple[str, int], Any] = {}
    lock = threading.Lock()

    def handler(stages: Any, inflight_tasks: int, operation_id: str | None,
                done: bool) -> None:
        try:
            with lock:
                seen = set()
                for st in stages:
                    key = (str(operation_id), int(st.stage_id))
                    finished = st.num_completed_tasks >= st.num_tasks or done
                    if finished:
                        continue
                    seen.add(key)
                    if key not in bars:
                        bars[key] = progress.add_task(f"stage {st.stage_id}",
                                                      total=st.num_tasks, extra="")
                    progress.update(bars[key], completed=st.num_completed_tasks,
                                    total=st.num_tasks)
                for key in [k for k in bars if k[0] == str(operation_id) and k not in seen]:
                    progress.remove_task(bars.pop(key))
        except Exception as exc:  # the display must never break the job
            log.debug("progress display: %s: %s", type(exc).__name__, exc, exc_info=True)

    spark.registerProgressHandler(handler)
    with progress:
        try:
            yield
        finally:
            try:
                spark.removeProgressHandler(handler)
            except Exception as exc:  # the session may be gone already
                log.debug("progress display: cannot remove the handler: %s: %s",
                          type(exc).__name__, exc)


def summary_table(title: str, input_count: int, counts: dict[str, int],
                  reasons: dict[tuple[str, str], int]) -> Table:
    """Outcomes with their reasons; ``unaccounted`` (a bug) is shown when not zero."""
    table = Table(title=title, title_justify="left")
    # Names are folded, never cut to "invalid_handler_…" on a narrow terminal.
    table.add_column("outcome", overflow="fold")
    table.add_column("reason", overflow="fold")
    table.add_column("messages", justify="right", no_wrap=True)
    table.add_row("input", "", str(input_count), style="bold")
    for kind in OUTCOME_KINDS:
        table.add_row(kind, "", str(counts.get(kind, 0)))
        for (outcome, reason), n in sorted(reasons.items(), key=lambda kv: -kv[1]):
            if outcome == kind:
                table.add_row("", reason, str(n))
    for key in sorted(counts):
        if key.startswith("released_") and counts[key]:
            table.add_row(key.replace("_", " ", 1), "previously parked", str(counts[key]))
    total = sum(counts.get(k, 0) for k in OUTCOME_KINDS)
    table.add_row("total", "", str(total), style="bold")
    if total != input_count:
        table.add_row("unaccounted", "BUG: report it", str(input_count - total), style="red")
    return table


def by_type_table(by_type: dict[tuple[str, str, str, str], int], *, top: int = 20) -> Table:
    """Outcome rows by aggregate type, message type, outcome and reason: the ``top`` largest
    counts, then how many more rows there are."""
    table = Table(title="by aggregate and message type", title_justify="left")
    for name in ("aggregate_type", "message_type", "outcome", "reason"):
        table.add_column(name, overflow="fold")
    table.add_column("messages", justify="right", no_wrap=True)
    rows = sorted(by_type.items(), key=lambda kv: (-kv[1], kv[0]))
    for (atype, mtype, outcome, reason), n in rows[:top]:
        table.add_row(escape(atype), escape(mtype), outcome, escape(reason), str(n))
    if len(rows) > top:
        table.add_row(f"… {len(rows) - top} more", "", "", "", "", style="dim")
    return table
