"""What the command line shows: a live progress display in messages — read of the input's
records, rate, ETA, outcomes written (:mod:`spark.live`) — and, with ``-v``, of the running
Spark stages; a summary table of outcomes at the end (``rich``; plain text when not on a
terminal).

The stages come from ``sparkContext.statusTracker()`` (polled), or on Spark Connect, which
has no ``sparkContext``, from the progress the server reports with each operation
(``spark.registerProgressHandler``)."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console, RenderableType
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from aggregates.message.outcomes import OUTCOME_KINDS
from spark.live import PREPARING, WRITING, Live, Phase, Phases, StageCount

__all__ = ["by_type_table", "jvm_stderr_to", "rate", "spark_progress", "summary_table"]

log = logging.getLogger("aggbox.spark")


class _Display(Progress):
    """The bars, then one line of outcome counts (:attr:`line`) below them."""

    line: str = ""

    def get_renderables(self) -> Iterator[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        if self.line:
            yield Text(self.line)


def _duration(seconds: float) -> str:
    s = int(seconds + 0.5)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class _MessageBar:
    """The ``messages`` bar. Before the first write it names the run's phase and its Spark
    tasks (:class:`spark.live.Phases`: reading and validating, sorting), with no rate and no
    ETA; from the first write on, the messages written (of ``total``), the rate over the last
    seconds of writing and the ETA from it — never from the time before the writes began,
    which made the first ETA several times too long (issue 44, item 3) — and the outcomes
    written below the bars."""

    WINDOW_S = 30.0

    def __init__(self, progress: _Display, total: int | None) -> None:
        self.progress, self.total = progress, total
        self.task = progress.add_task(PREPARING, total=None, done="", extra="")
        self.samples: deque[tuple[float, int]] = deque()

    def update(self, counts: dict[str, int], phase: Phase | None = None) -> None:
        """The bar counts the messages written (one outcome each); the writers read them in
        Arrow batches (10,000 rows by default), so ``read`` runs ahead."""
        now = time.monotonic()
        read, done = counts.get("read", 0), sum(counts.get(k, 0) for k in OUTCOME_KINDS)
        if self.total is not None:  # never past the total, whatever the counts say
            read, done = min(read, self.total), min(done, self.total)
        of = f"/{self.total:,}" if self.total is not None else ""
        self.progress.line = f"read {read:,}{of} · " + " · ".join(
            f"{k.replace('_', '-')} {counts.get(k, 0):,}" for k in OUTCOME_KINDS)
        if not done:  # not writing yet: the phase; the rate starts from the last such poll
            self.samples.clear()
            self.samples.append((now, 0))
            p = phase or Phase(PREPARING)
            tasks = f"{p.done:,}/{p.total:,} tasks" if p.total else ""
            self.progress.update(self.task, description=p.name, completed=p.done,
                                 total=p.total or None, done=tasks,
                                 extra=f"{p.running:,} running" if p.running else "")
            return
        if self.samples and done < self.samples[-1][1]:  # a task retried: a new window
            self.samples.clear()
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.WINDOW_S:
            self.samples.popleft()
        t0, d0 = self.samples[0]
        rate = (done - d0) / (now - t0) if now > t0 else 0.0
        extra = f"{rate:,.0f} msg/s" if rate > 0 else ""
        if self.total is not None and rate > 0:
            extra += f" · ETA {_duration((self.total - done) / rate)}"
        self.progress.update(self.task, description=WRITING, completed=done, total=self.total,
                             done=f"{done:,}{of}", extra=extra)


@contextmanager
def _logs_above_bar() -> Iterator[None]:
    """While the display runs: log records below WARNING go to the log file only (the trace
    logger's handler, :mod:`aggbox.logs`), the others are printed above the bars (through
    rich's stderr proxy) instead of into them."""
    trace_handlers = logging.getLogger("aggbox.trace").handlers

    def to_file(record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        for handler in trace_handlers:
            if record.levelno >= handler.level:
                handler.handle(record)
        return False

    streams = [h for h in logging.getLogger().handlers
               if type(h) is logging.StreamHandler]
    previous = [h.setStream(sys.stderr) for h in streams]
    for h in streams:
        h.addFilter(to_file)
    try:
        yield
    finally:
        for h, stream in zip(streams, previous, strict=True):
            h.removeFilter(to_file)
            if stream is not None:
                h.setStream(stream)


@contextmanager
def jvm_stderr_to(path: Path | None) -> Iterator[None]:
    """A JVM started in the block writes its stderr (``WARNING: Using incubator modules`` …,
    anything log4j does not handle) to the log file ``path`` instead of the terminal: it
    inherits file descriptor 2, which points there while the block runs; this process's own
    ``sys.stderr`` (the spinner) keeps the terminal. ``path`` None: nothing changes."""
    if path is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    previous = sys.stderr
    sys.stderr = os.fdopen(os.dup(saved), "w", buffering=1, encoding="utf-8",
                           errors="replace")
    os.dup2(target, 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        sys.stderr.close()
        sys.stderr = previous
        os.close(saved)
        os.close(target)


@contextmanager
def spark_progress(spark: Any, console: Console, *, enabled: bool = True,
                   stages: bool = True, live: Live | None = None, interval: float = 0.5
                   ) -> Iterator[Progress | None]:
    """While the block runs: with ``live`` (the run's live counts, :mod:`spark.live`), a
    ``messages`` bar (of its total when known: rate and ETA) and the outcomes written; with
    ``stages``, one bar per active Spark stage (tasks done / total). Log records are kept out
    of the display (:func:`_logs_above_bar`). Without the display too: the summary the command
    prints says what the pipeline's INFO records say (``run …: {'run_id': …}``), so they go to
    the log file only (issue 44, item 7)."""
    if not enabled:
        with _logs_above_bar():
            yield None
        return
    progress = _Display(
        TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[done]}"),
        TextColumn("{task.fields[extra]}"), TimeElapsedColumn(),
        console=console, transient=True,
    )
    from spark.session import is_connect

    stop = threading.Event()
    connect = is_connect(spark)
    # The stages name the phase before the first write (issue 44, item 3), shown as bars of
    # their own only with ``stages`` (-v).
    tracker = None if connect or (live is None and not stages) else \
        spark.sparkContext.statusTracker()
    phases, lock = Phases(), threading.Lock()
    bars: dict[int, Any] = {}
    messages = _MessageBar(progress, live.total) if live is not None else None

    def poll() -> None:
        while not stop.wait(interval):
            try:
                if tracker is not None:
                    seen = _poll_stages(tracker, progress if stages else None, bars)
                    with lock:
                        phases.update(seen)
                if messages is not None and live is not None:
                    with lock:
                        phase = phases.current()
                    messages.update(live.counts(), phase)
            except Exception as exc:  # the display must never break the job
                log.debug("progress display: %s: %s", type(exc).__name__, exc, exc_info=True)
                continue

    thread = threading.Thread(target=poll, name="aggbox-progress", daemon=True)
    with ExitStack() as stack:
        stack.enter_context(progress)
        stack.enter_context(_logs_above_bar())
        if connect and (stages or live is not None):
            stack.enter_context(_connect_progress(spark, progress if stages else None,
                                                  phases, lock))
        thread.start()
        try:
            yield progress
        finally:
            stop.set()
            thread.join(timeout=2 * interval + 1)
            if messages is not None and live is not None:  # the last counts, once
                try:
                    messages.update(live.counts(), phases.current())
                    progress.refresh()
                except Exception as exc:  # the display must never break the job
                    log.debug("progress display: %s: %s", type(exc).__name__, exc)


def _poll_stages(tracker: Any, progress: Progress | None,
                 bars: dict[int, Any]) -> list[StageCount]:
    """The active stages of the status tracker; with ``progress``, one bar each."""
    seen = []
    active = set(tracker.getActiveStageIds())
    for sid in active:
        info = tracker.getStageInfo(sid)
        if info is None:
            continue
        seen.append(StageCount(sid, info.numCompletedTasks, info.numTasks,
                               info.numActiveTasks))
        if progress is None:
            continue
        extra = f"failed {info.numFailedTasks}" if info.numFailedTasks else ""
        done = f"{info.numCompletedTasks}/{info.numTasks} tasks"
        if sid not in bars:
            bars[sid] = progress.add_task(f"stage {sid}", total=info.numTasks, done=done,
                                          extra=extra)
        progress.update(bars[sid], completed=info.numCompletedTasks, total=info.numTasks,
                        done=done, extra=extra)
    for sid in [s for s in bars if s not in active]:
        if progress is not None:
            progress.remove_task(bars.pop(sid))
    return seen


@contextmanager
def _connect_progress(spark: Any, progress: Progress | None, phases: Phases,
                      lock: threading.Lock) -> Iterator[None]:
    """The stage progress a Spark Connect server sends with each operation: into ``phases``,
    and with ``progress``, one bar per stage."""
    bars: dict[tuple[str, int], Any] = {}

    def handler(stages: Any, inflight_tasks: int, operation_id: str | None,
                done: bool) -> None:
        try:
            with lock:
                phases.update(StageCount(int(st.stage_id), int(st.num_completed_tasks),
                                         int(st.num_tasks), finished=bool(st.done or done))
                              for st in stages)
                if progress is None:
                    return
                seen = set()
                for st in stages:
                    key = (str(operation_id), int(st.stage_id))
                    finished = st.num_completed_tasks >= st.num_tasks or done
                    if finished:
                        continue
                    seen.add(key)
                    tasks = f"{st.num_completed_tasks}/{st.num_tasks} tasks"
                    if key not in bars:
                        bars[key] = progress.add_task(f"stage {st.stage_id}", done=tasks,
                                                      total=st.num_tasks, extra="")
                    progress.update(bars[key], completed=st.num_completed_tasks,
                                    total=st.num_tasks, done=tasks)
                for key in [k for k in bars if k[0] == str(operation_id) and k not in seen]:
                    progress.remove_task(bars.pop(key))
        except Exception as exc:  # the display must never break the job
            log.debug("progress display: %s: %s", type(exc).__name__, exc, exc_info=True)

    spark.registerProgressHandler(handler)
    try:
        yield
    finally:
        try:
            spark.removeProgressHandler(handler)
        except Exception as exc:  # the session may be gone already
            log.debug("progress display: cannot remove the handler: %s: %s",
                      type(exc).__name__, exc)


def rate(messages: int, seconds: float) -> str:
    """``200,000 messages in 41.2 s (4,854 msgs/s)``: the line below the summary's tables
    (``seconds``: the job, without starting Spark)."""
    per_s = f" ({messages / seconds:,.0f} msgs/s)" if seconds > 0 else ""
    return f"{messages:,} messages in {seconds:.1f} s{per_s}"


def summary_table(title: str, input_count: int, counts: dict[str, int],
                  reasons: dict[tuple[str, str], int]) -> Table:
    """Outcomes with their reasons; ``unaccounted`` (a bug) is shown when not zero."""
    table = Table(title=title, title_justify="left")
    # Names are folded, never cut to "invalid_handler_…" on a narrow terminal.
    table.add_column("outcome", overflow="fold")
    table.add_column("reason", overflow="fold")
    table.add_column("messages", justify="right", no_wrap=True)
    table.add_row("input", "", f"{input_count:,}", style="bold")
    for kind in OUTCOME_KINDS:
        table.add_row(kind, "", f"{counts.get(kind, 0):,}")
        for (outcome, reason), n in sorted(reasons.items(), key=lambda kv: -kv[1]):
            if outcome == kind:
                table.add_row("", reason, f"{n:,}")
    for key in sorted(counts):
        if key.startswith("released_") and counts[key]:
            table.add_row(key.replace("_", " ", 1), "previously parked", f"{counts[key]:,}")
    total = sum(counts.get(k, 0) for k in OUTCOME_KINDS)
    table.add_row("total", "", f"{total:,}", style="bold")
    if total != input_count:
        table.add_row("unaccounted", "BUG: report it", f"{input_count - total:,}", style="red")
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
        table.add_row(escape(atype), escape(mtype), outcome, escape(reason), f"{n:,}")
    if len(rows) > top:
        table.add_row(f"… {len(rows) - top} more", "", "", "", "", style="dim")
    return table
