"""Live counts of a run, in messages (issue 34, item 3): the executors add what they read and
the outcomes they wrote to one document per run in MongoDB, the driver polls it for the
progress display (:func:`spark.progress.spark_progress`).

Why MongoDB: the executors reach it on every deployment (local, a cluster, Spark Connect),
and so does the driver. Spark accumulators reach the driver only when a task ends (one task
per partition: a 4-partition run would jump 0 → 25 % → … in steps), a ``SparkListener`` needs
py4j (not on Spark Connect). The counts are for display only: a partition is counted by its
latest task attempt (a retried task starts again from zero, so the bar may step back); the
summary's counts come from the job itself
(:meth:`spark.pipeline.Pipeline.process`). Each writer sets its counts at most every
:data:`FLUSH_S` and when its partition ends (one small update, not one per message).

The document: ``{_id: <run stamp>, p: {"<partition>_<attempt>": {read, applied, duplicate,
dead_lettered, parked}}, at}`` in :data:`PROGRESS_COLLECTION`; the command creates it before
the job and deletes it when the run ends.

Before the first message is written the counts stay at zero — for minutes on a large input —
so the display also names the phase of the run and its Spark tasks (:class:`Phases`, issue
44, item 3).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

from aggregates.message.outcomes import Outcome

__all__ = ["COUNTS", "FLUSH_S", "PREPARING", "PROGRESS_COLLECTION", "READING", "SORTING",
           "WRITING", "Live", "LiveCounts", "Phase", "Phases", "StageCount", "count_input",
           "live_counts", "read_counts"]

#: The collection of the progress documents (one per running ``aggbox run``).
PROGRESS_COLLECTION: Final = "aggbox_progress"
#: A writer adds its counts to the document at most this often (seconds).
FLUSH_S: Final = 0.5
#: The counters of a progress document.
COUNTS: Final = ("read", "applied", "duplicate", "dead_lettered", "parked")

log = logging.getLogger("aggbox.spark")


class LiveCounts:
    """One task attempt's counts in the run's progress document (executor side): its running
    totals under ``p.<partition>_<attempt>``, set (not added), so that the driver counts a
    retried partition once, by its latest attempt (:func:`read_counts`)."""

    def __init__(self, db: Any, run: str, partition: int, attempt: int) -> None:
        self.collection = db[PROGRESS_COLLECTION]
        self.run = run
        self.key = f"p.{partition}_{attempt}"
        self.totals: dict[str, int] = dict.fromkeys(COUNTS, 0)
        self.changed = False
        self.last = time.monotonic()

    def add(self, read: int, outcomes: Iterable[Outcome]) -> None:
        """Count ``read`` input rows and ``outcomes``; flush when :data:`FLUSH_S` passed."""
        self.totals["read"] += read
        for o in outcomes:
            if not o.from_parked:  # released parked messages are not input rows
                self.totals[o.outcome] += 1
        self.changed = True
        if time.monotonic() - self.last >= FLUSH_S:
            self.flush()

    def flush(self) -> None:
        self.last = time.monotonic()
        if not self.changed:
            return
        self.changed = False
        try:  # the driver created the document (no upsert: writers would race to insert it)
            self.collection.update_one({"_id": self.run}, {"$set": {self.key: self.totals},
                                                           "$currentDate": {"at": True}})
        except Exception as exc:  # the display must never fail the job
            log.debug("progress counts not written: %s: %s", type(exc).__name__, exc)


def read_counts(db: Any, run: str) -> dict[str, int]:
    """The run's counts so far (driver side): per partition those of its latest attempt;
    zeros before the first write."""
    doc = db[PROGRESS_COLLECTION].find_one({"_id": run}) or {}
    latest: dict[str, tuple[int, dict[str, Any]]] = {}
    for key, counts in (doc.get("p") or {}).items():
        partition, _, attempt = key.partition("_")
        if partition not in latest or int(attempt) > latest[partition][0]:
            latest[partition] = (int(attempt), counts)
    return {k: sum(int(c.get(k, 0)) for _, c in latest.values()) for k in COUNTS}


def count_input(paths: Iterable[str], *, exact_bytes: int = 1 << 30) -> int | None:
    """The number of records in local input files, for the progress display's ETA: lines of
    JSON Lines files (counted up to ``exact_bytes`` in all, beyond that estimated from the
    bytes read so far), rows of Parquet files from their footers. None when it cannot be
    known cheaply (URLs, compressed files, unreadable files)."""
    import glob
    import os
    from pathlib import Path

    files: list[Path] = []
    for path in paths:
        if "://" in path and not path.startswith("file://"):
            return None
        local = os.path.expanduser(path.removeprefix("file://"))
        for match in (glob.glob(local, recursive=True) if glob.has_magic(local) else [local]):
            p = Path(match)
            if p.is_dir():
                files.extend(f for f in sorted(p.rglob("*")) if f.is_file() and not any(
                    part.startswith(("_", ".")) for part in f.relative_to(p).parts))
            elif p.is_file():
                files.append(p)
    total, counted_bytes = 0, 0
    try:
        for f in files:
            if f.suffix == ".parquet":
                import pyarrow.parquet as pq

                total += int(pq.ParquetFile(f).metadata.num_rows)
                continue
            if f.suffix in (".gz", ".bz2", ".zst", ".snappy", ".lz4", ".deflate"):
                return None
            size = f.stat().st_size
            if counted_bytes >= exact_bytes and counted_bytes:  # estimate: bytes per line
                total += round(size * total / counted_bytes)
                continue
            with f.open("rb") as fh:
                last = b"\n"
                while chunk := fh.read(1 << 22):
                    total += chunk.count(b"\n")
                    last = chunk[-1:]
                total += last != b"\n"
            counted_bytes += size
    except OSError as exc:
        log.debug("input not counted: %s: %s", type(exc).__name__, exc)
        return None
    return total


@dataclass(frozen=True, slots=True)
class Live:
    """What the progress display polls: ``counts()`` the run's counts so far, ``total`` the
    input's records when known."""

    counts: Callable[[], dict[str, int]]
    total: int | None


@contextmanager
def live_counts(pipeline: Any, run: str, inputs: Iterable[str], *,
                enabled: bool) -> Iterator[Live | None]:
    """With ``enabled``: the writers of ``pipeline`` count into ``run``'s progress document
    while the block runs, :class:`Live` reads it (a client of its own, 2 s server selection)
    and the document is deleted at the end. Else None."""
    if not enabled:
        yield None
        return
    from pymongo import MongoClient

    client: Any = MongoClient(pipeline.mongodb_uri, appname="aggbox-progress",
                              serverSelectionTimeoutMS=2000)
    db = client[pipeline.settings.database]
    pipeline.live_progress = True
    try:
        db[PROGRESS_COLLECTION].replace_one({"_id": run}, {"p": {}}, upsert=True)
        yield Live(lambda: read_counts(db, run), count_input(inputs))
    finally:
        pipeline.live_progress = False
        try:
            db[PROGRESS_COLLECTION].delete_one({"_id": run})
        except Exception as exc:  # the display's leftovers must never fail the run
            log.debug("progress document %s not deleted: %s: %s", run, type(exc).__name__, exc)
        client.close()


# -- the phase of a run, from its Spark stages (issue 44, item 3) ----------------------------
#: The phases of a run as the progress display names them.
PREPARING: Final = "starting the job"
READING: Final = "reading and validating input"
SORTING: Final = "sorting by aggregate"
WRITING: Final = "messages written"


@dataclass(frozen=True, slots=True)
class StageCount:
    """One Spark stage as the status tracker or a Spark Connect server reports it: its tasks
    completed, all, and running (when known); ``finished`` when the report says so."""

    stage_id: int
    done: int
    total: int
    running: int = 0
    finished: bool = False


@dataclass(frozen=True, slots=True)
class Phase:
    """What the display shows before the first write: the phase and its tasks."""

    name: str
    done: int = 0
    total: int = 0
    running: int = 0


class Phases:
    """Which phase a run is in, from the Spark stages it has run (pure: :meth:`update` is fed
    the stages of each poll). A run is one Spark job in two parts (docs/design.md "The
    pipeline"): the input read and validated, ending in the shuffle by aggregate (the map
    stage); then each partition sorted by aggregate and written (the result stage), whose
    writers count their first message only once their partition is sorted. So: no stage yet
    is :data:`PREPARING`; a stage that starts after an earlier one of the run finished runs
    downstream of it, :data:`SORTING`; any other, :data:`READING`."""

    def __init__(self) -> None:
        self._finished: set[int] = set()
        self._active: dict[int, StageCount] = {}

    def update(self, stages: Iterable[StageCount]) -> None:
        """The stages reported now: those still running, and any reported finished; a stage
        reported before and missing now has finished."""
        now = {}
        for st in stages:
            if st.finished or (st.total and st.done >= st.total):
                self._finished.add(st.stage_id)
            else:
                now[st.stage_id] = st
        self._finished.update(self._active.keys() - now.keys())
        self._active = now

    def current(self) -> Phase:
        first = min(self._finished, default=None)
        if not self._active:  # before the first stage, or between the two parts
            return Phase(PREPARING if first is None else SORTING)
        later = [st for st in self._active.values() if first is not None and st.stage_id > first]
        stages = later or list(self._active.values())
        return Phase(SORTING if later else READING, sum(st.done for st in stages),
                     sum(st.total for st in stages), sum(st.running for st in stages))
