"""The executor side: the ``mapInArrow`` function that runs the store writer per partition.

Rows arrive repartitioned by aggregate key and sorted within each aggregate (see
:mod:`spark.pipeline`). Per Arrow batch the rows become :class:`Message` objects or dead
letters (:mod:`spark.records` decides, whatever a record's bytes; a dead letter keeps the
record value as it came); the messages go to :meth:`StoreWriter.process` and one outcome row
per message comes back, as Arrow columns built column by column.

An aggregate's messages may span two Arrow batches: the trailing run of the last aggregate
in a batch is carried into the next one, so it is read and written once — unless the run is
longer than ``carry_over_max``, then it is written as it is (correct either way: the writer
re-reads the aggregate; only the number of writes differs), which keeps memory bounded for a
hot aggregate.

Per Python worker process (workers are reused across tasks) there is one cached
``MongoClient`` per URI and one cached :class:`Registry` per module name. Exceptions
from the writer (e.g. :class:`aggregates.core.errors.RetryableError` from a handler, a MongoDB
outage) fail the task; Spark retries it, and the retry finds what the failed attempt wrote:
a message that attempt applied is counted ``applied`` once, with reason ``earlier_attempt``
naming it (run stamps, :mod:`aggregates.dedup.runs`), a real duplicate stays ``duplicate``.
All but a :class:`~aggregates.core.errors.DeploymentError`, which fails every attempt the
same way: it ends the task with one row (:data:`DEPLOYMENT_FAILED`), not a retry.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aggregates.core.errors import DeploymentError
from aggregates.core.ids import raw_message_id
from aggregates.core.settings import AggboxSettings
from aggregates.dedup.runs import RunStamp
from aggregates.domain.aggregate import Registry
from aggregates.fold import DeadLetter
from aggregates.message.envelope import Message
from aggregates.message.outcomes import Outcome
from aggregates.store.deadletters import DeadLetterStore
from aggregates.store.writer import StoreWriter, utc_now
from spark.records import Ids, Rows, check_row_exact
from spark.results import SAMPLED
from spark.schema import OUTCOME_COLUMNS, outcome_columns

__all__ = ["DEPLOYMENT_FAILED", "STATS_COLUMN", "STATS_KEYS", "Failed", "WriterTask",
           "deployment_failure", "get_client", "get_registry", "parse_rows", "with_stats",
           "write_partition"]

_lock = threading.Lock()
_clients: dict[str, Any] = {}
_registries: dict[str, Registry] = {}

@dataclass(frozen=True, slots=True)
class WriterTask:
    """Everything an executor needs, shipped from the driver (plain, picklable values)."""

    mongodb_uri: str
    aggregates: str
    settings: dict[str, Any]
    carry_over_max: int = 5_000
    #: Add :data:`STATS_COLUMN` to the outcome batches (:func:`with_stats`).
    stats: bool = False
    #: The run (and micro-batch) the writers stamp documents with, so that a retried task
    #: counts what a lost attempt of it applied as ``applied`` once
    #: (:mod:`aggregates.dedup.runs`); ``None``: no stamps.
    run: str | None = None
    #: Add the partition's counts to the run's progress document (:mod:`spark.live`).
    progress: bool = False


def get_client(uri: str) -> Any:
    """The worker's ``MongoClient`` for ``uri`` (created once per Python worker process)."""
    with _lock:
        client = _clients.get(uri)
        if client is None:
            from pymongo import MongoClient

            client = _clients[uri] = MongoClient(uri, appname="aggbox-spark-executor")
        return client


def get_registry(module: str) -> Registry:
    """The registry of aggregates module ``module`` (imported once per worker)."""
    with _lock:
        reg = _registries.get(module)
        if reg is None:
            reg = _registries[module] = Registry.from_module(module)
        return reg


def _task_attempt() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return int(ctx.attemptNumber()) if ctx is not None else 0


def _partition_attempt() -> tuple[int, int]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return (int(ctx.partitionId()), int(ctx.attemptNumber())) if ctx is not None else (0, 0)


def _run_stamp(run: str | None) -> RunStamp | None:
    """The writer's run stamp: ``run`` and this task attempt, named much as Spark's logs
    name it (``task 3.1 in stage 2 (TID 17)``; the TID is unique within the application)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if run is None or ctx is None:
        return None
    return RunStamp(run, f"task {ctx.partitionId()}.{ctx.attemptNumber()} in stage "
                         f"{ctx.stageId()} (TID {ctx.taskAttemptId()})")


#: A row without a message to write: its index, the message it may still have (a misrouted
#: one keeps it), the reason, the detail and the ids its record names.
Failed = tuple[int, Message | None, str | None, str | None, Ids]


def parse_rows(rows: Rows, max_payload: int) -> tuple[list[Message], list[Failed]]:
    """The batch's messages and its rows without one, as :func:`spark.records.check_row`
    decides each row: the rows the batch's fast path proved are their messages as they are
    (no call per row), any other is parsed on its own (``check_row_exact``)."""
    rows.prove(max_payload)
    proven = rows.proven
    if None not in proven:  # every row proven: the common batch
        return proven, []  # type: ignore[return-value]
    messages: list[Message] = []
    failed: list[Failed] = []
    for row, msg in enumerate(proven):
        if msg is not None:
            messages.append(msg)
            continue
        msg, reason, detail, ids = check_row_exact(rows, row, max_payload)
        if reason is None and msg is not None:
            messages.append(msg)
        else:
            failed.append((row, msg, reason, detail, ids))
    return messages, failed


class _Partition:
    """State of one partition's run through the writer."""

    def __init__(self, task: WriterTask) -> None:
        client = get_client(task.mongodb_uri)
        self.settings = AggboxSettings.model_construct(**task.settings)
        self.db = client[self.settings.database]
        self.registry = get_registry(task.aggregates)
        self.writer = StoreWriter(self.db, self.registry, settings=self.settings,
                                  run=_run_stamp(task.run))
        self.dead_store = DeadLetterStore(self.db,
                                          collection=self.settings.dead_letter_collection)
        self.carry_over_max = task.carry_over_max
        self.task_attempt = _task_attempt()
        self.carry: list[Message] = []
        # Message id → type of this batch's dead letters (``Outcome`` carries no type).
        self.dead_types: dict[str, str] = {}

    # -- one Arrow batch → messages and dead letters --------------------------------------
    def parse(self, batch: Any) -> tuple[list[Message], list[tuple[DeadLetter, Outcome]]]:
        """Each row becomes a message or a dead letter (:func:`parse_rows`)."""
        rows = Rows(batch)
        self.dead_types = {}
        messages, failed = parse_rows(rows, self.settings.max_payload_bytes)
        return messages, [self._dead_letter(rows, *f) for f in failed]

    def _dead_letter(self, rows: Rows, row: int, msg: Message | None, reason: str | None,
                     detail: str | None, ids: Ids) -> tuple[DeadLetter, Outcome]:
        """The dead letter and outcome of a row: the message's ids, else the ids its record
        names (:func:`spark.records.check_row`), a record without a string message id
        gets one from its bytes (:func:`aggregates.core.ids.raw_message_id`)."""
        raw = rows.raw[row]
        atype: str | None
        aid: str | None
        mtype: str | None
        if msg is not None:
            ident, atype, aid, mtype = (msg.message_id, msg.aggregate_type, msg.aggregate_id,
                                        msg.type)
        else:
            mid, atype, aid, mtype = ids
            ident = mid or raw_message_id(raw if raw is not None else "")
        headers = rows.binary(row)
        letter = DeadLetter(msg, None if msg else raw, str(reason), detail, None,
                            atype, aid, message_id=None if msg else ident,
                            record_headers=None if msg or headers is None else tuple(
                                (str(h["key"]), h["value"]) for h in headers))
        if mtype:
            self.dead_types[ident] = mtype
        return letter, Outcome(ident, atype or "", aid or "", "dead_lettered", reason, detail)

    # -- carry-over of the last aggregate's run ------------------------------------------
    def take(self, messages: list[Message], *, final: bool) -> list[Message]:
        """The messages to write now; keeps the trailing aggregate run for the next batch."""
        todo = self.carry + messages if self.carry else messages
        self.carry = []
        if final or not todo:
            return todo
        key = todo[-1].aggregate_key
        start = len(todo) - 1
        while start > 0 and todo[start - 1].aggregate_key == key:
            start -= 1
        if len(todo) - start > self.carry_over_max:
            return todo
        self.carry = todo[start:]
        return todo[:start]

    def write(self, messages: list[Message],
              dead: list[tuple[DeadLetter, Outcome]]) -> tuple[list[Outcome], dict[str, str]]:
        """The outcomes, and the message types by message id (for ``message_type``;
        released parked messages are not in it: their outcome rows have NULL there)."""
        outcomes = self.writer.process(messages) if messages else []
        types = {m.message_id: m.type for m in messages}
        if dead:
            self.dead_store.write([d for d, _ in dead], now=utc_now())
            outcomes.extend(o for _, o in dead)
            types.update(self.dead_types)
        return outcomes, types

    def to_arrow(self, outcomes: list[Outcome], types: dict[str, str]) -> Any:
        import pyarrow as pa

        columns = outcome_columns(outcomes, task_attempt=self.task_attempt,
                                  message_types=types)
        return pa.RecordBatch.from_arrays(
            [pa.array(c, type=t) for c, t in zip(columns, _arrow_types(), strict=True)],
            names=list(OUTCOME_COLUMNS),
        )


_ARROW_TYPES: list[Any] = []


def _arrow_types() -> list[Any]:
    if not _ARROW_TYPES:
        import pyarrow as pa

        _ARROW_TYPES.extend([pa.string(), pa.string(), pa.string(), pa.string(), pa.string(),
                             pa.string(), pa.list_(pa.string()), pa.int32(), pa.bool_(),
                             pa.int32(), pa.string()])
    return _ARROW_TYPES


def write_partition(task: WriterTask, batches: Iterator[Any]) -> Iterator[Any]:
    """The ``mapInArrow`` function (bind ``task`` with ``functools.partial``): Arrow batches
    of validated rows in, Arrow batches of :data:`spark.schema.OUTCOME_SCHEMA` out (plus
    :data:`STATS_COLUMN` when ``task.stats``: :func:`with_stats`)."""
    out = _write(task, batches)
    return with_stats(out) if task.stats else out


def _write(task: WriterTask, batches: Iterator[Any]) -> Iterator[Any]:
    from spark.live import LiveCounts

    part: _Partition | None = None
    live: LiveCounts | None = None
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if part is None:
                part = _Partition(task)
                if task.progress and task.run:
                    live = LiveCounts(part.db, task.run, *_partition_attempt())
            messages, dead = part.parse(batch)
            outcomes, types = part.write(part.take(messages, final=False), dead)
            if live is not None:
                live.add(batch.num_rows, outcomes)
            if outcomes:
                yield part.to_arrow(outcomes, types)
        if part is not None and part.carry:
            outcomes, types = part.write(part.take([], final=True), [])
            if live is not None:
                live.add(0, outcomes)
            yield part.to_arrow(outcomes, types)
    except DeploymentError as exc:  # not retried: the task ends here, the driver raises it
        yield _deployment_row(exc, part.task_attempt if part is not None else 0)
    if live is not None:
        live.flush()


# -- deployment errors (docs/design.md "Deployment errors") ----------------------------------
#: The ``outcome`` of the one row a task returns, instead of failing, when a handler cannot
#: run where it runs (:class:`~aggregates.core.errors.DeploymentError`): its ``reason`` is the
#: error's line. A failed task would be retried by Spark (``spark.task.maxFailures``), and it
#: fails the same way every time; this row ends the task at its first attempt, having written
#: nothing more, and :meth:`spark.pipeline.Pipeline.process` raises the error from it.
DEPLOYMENT_FAILED = "deployment_failed"


def _deployment_row(exc: DeploymentError, task_attempt: int) -> Any:
    import pyarrow as pa

    line = str(exc)
    values: list[Any] = ["", None, None, DEPLOYMENT_FAILED, line, line, [], 0, False,
                         task_attempt, None]
    return pa.RecordBatch.from_arrays(
        [pa.array([v], type=t) for v, t in zip(values, _arrow_types(), strict=True)],
        names=list(OUTCOME_COLUMNS))


def deployment_failure(stats: str | None) -> str | None:
    """The line of a :data:`DEPLOYMENT_FAILED` row counted in ``stats`` (the executors'
    counts as the job returns them: JSON lists of :data:`STATS_KEYS` + count, one list per
    partition, one per line); ``None`` when no task met one."""
    for text in (stats or "").split("\n"):
        if DEPLOYMENT_FAILED not in text:
            continue
        for row in json.loads(text):
            if row[0] == DEPLOYMENT_FAILED:
                return str(row[2])
    return None

#: The column :func:`with_stats` adds to the outcome batches: NULL but on the last row a
#: partition returns, which holds the partition's outcome counts as JSON
#: (:func:`spark.results.counts_from_stats` reads them).
STATS_COLUMN = "_stats"
#: The outcome columns the counts are grouped by (:attr:`spark.results.RunResult.by_type`).
STATS_KEYS = ("outcome", "from_parked", "reason", "aggregate_type", "message_type")


def with_stats(outcomes: Iterator[Any]) -> Iterator[Any]:
    """Outcome batches with :data:`STATS_COLUMN` added: the rows counted by
    :data:`STATS_KEYS` as they pass (Arrow's group-by), the counts returned as JSON on the
    partition's last row (its batch is held back until the next one comes), so that the
    pipeline has its counts from the job that writes, without a second job over the
    outcomes."""
    import pyarrow as pa

    counts: dict[tuple[Any, ...], int] = {}
    samples: dict[tuple[Any, ...], tuple[str, str | None]] = {}
    pending: Any = None
    for batch in outcomes:
        if batch.num_rows == 0:
            continue
        _sample(batch, samples)
        grouped = pa.Table.from_batches([batch]).group_by(
            list(STATS_KEYS), use_threads=False).aggregate([([], "count_all")])
        for row in grouped.to_pylist():
            key = tuple(row[k] for k in STATS_KEYS)
            counts[key] = counts.get(key, 0) + row["count_all"]
        if pending is not None:
            yield _with_stats_column(pending, pa.nulls(pending.num_rows, pa.string()))
        pending = batch
    if pending is not None:
        stats = json.dumps([[*k, n, *samples.get(k, ())] for k, n in counts.items()])
        column = pa.array([None] * (pending.num_rows - 1) + [stats], type=pa.string())
        yield _with_stats_column(pending, column)


def _sample(batch: Any, samples: dict[tuple[Any, ...], tuple[str, str | None]]) -> None:
    """Per :data:`STATS_KEYS` group of the batch's dead-lettered and parked rows
    (:data:`spark.results.SAMPLED`), keep the smallest message id and the first line of its
    detail (what the command's summary shows)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    mask = pc.is_in(batch.column("outcome"), value_set=pa.array(SAMPLED))
    if not pc.any(mask).as_py():
        return
    rows = batch.filter(mask)
    keys = [rows.column(k).to_pylist() for k in STATS_KEYS]
    ids = rows.column("message_id").to_pylist()
    details = (rows.column("detail").to_pylist() if "detail" in rows.schema.names
               else [None] * len(ids))
    for i, mid in enumerate(ids):
        key = tuple(c[i] for c in keys)
        known = samples.get(key)
        if known is None or mid < known[0]:
            detail = details[i]
            samples[key] = (mid, detail.strip().split("\n", 1)[0][:1000] if detail else None)


def _with_stats_column(batch: Any, column: Any) -> Any:
    import pyarrow as pa

    return pa.RecordBatch.from_arrays([*batch.columns, column],
                                      names=[*batch.schema.names, STATS_COLUMN])
