"""The pipeline: read → validate → route → repartition by aggregate → sort within aggregate →
executor-side writer (``mapInArrow``) → outcomes. Batch and streaming share one code path
(:meth:`Pipeline.process`); streaming runs it in ``foreachBatch``.

    from spark.pipeline import Pipeline
    from spark.session import build_session

    spark = build_session()
    result = Pipeline(spark, aggregates="examples.orders").run_batch(["in/*.jsonl"])
    result.counts        # {"applied": …, "duplicate": …, "dead_lettered": …, "parked": …}
    result.outcomes      # DataFrame, one row per message (spark.schema.OUTCOME_SCHEMA)

Order within an aggregate: each source (``source.type`` + ``source.id``) keeps its
``source.seq`` order, and sources and unsourced messages are interleaved by ``occurred_at``
(for a sourced message the newest of its source up to its seq), ties settled by source, then
input position (file path and line, or Kafka partition and offset). The definition is
:func:`aggregates.ordering.delivery_order`; :func:`order_within_aggregates` computes it.

Every input record ends in exactly one outcome. :class:`RunResult` compares the number of
input records with the number of outcome rows (released parked messages are counted apart)
and :meth:`RunResult.raise_for_accounting` fails the run (or the micro-batch) otherwise.
Re-running the same input, or Spark re-running a task, is harmless: what was already
applied comes back as ``duplicate``.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aggregates.aggregate import Registry
from aggregates.errors import AggboxError, ConfigurationError
from aggregates.outcomes import OUTCOME_KINDS
from aggregates.settings import AggboxSettings
from aggregates.writer import StoreWriter
from spark.executor import WriterTask, write_partition
from spark.schema import OUTCOME_SCHEMA
from spark.session import check_session
from spark.settings import InputFormat, SparkSettings
from spark.sources import StreamSource, add_line_order, read_batch, read_stream
from spark.validate import RegistryInfo, validate

__all__ = [
    "AccountingError",
    "Pipeline",
    "RunResult",
    "StreamFailed",
    "StreamResult",
    "new_run_id",
    "order_within_aggregates",
    "run_batch",
    "run_stream",
]

log = logging.getLogger("aggbox.spark")


class AccountingError(AggboxError):
    """Input records and outcome rows do not add up (a bug: nothing may be dropped)."""


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


@dataclass(slots=True)
class RunResult:
    """The result of one batch run or one micro-batch."""

    run_id: str
    input_count: int
    counts: dict[str, int]
    reasons: dict[tuple[str, str], int]
    outcomes: Any = None  # DataFrame of spark.schema.OUTCOME_SCHEMA (None once dropped)
    outcomes_path: str | None = None
    batch_id: int | None = None
    seconds: float = 0.0

    @property
    def total(self) -> int:
        """Outcomes of input records (excludes released parked messages)."""
        return sum(self.counts.get(k, 0) for k in OUTCOME_KINDS)

    @property
    def unaccounted(self) -> int:
        return self.input_count - self.total

    @property
    def ok(self) -> bool:
        return self.unaccounted == 0

    def raise_for_accounting(self) -> None:
        if not self.ok:
            where = f"micro-batch {self.batch_id}" if self.batch_id is not None else "the run"
            raise AccountingError(
                f"{where}: {self.input_count} input records but {self.total} outcomes "
                f"({self.counts}); this is a bug, please report it with the outcome log"
            )

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run_id": self.run_id, "input": self.input_count}
        if self.batch_id is not None:
            out["batch_id"] = self.batch_id
        out.update(self.counts)
        return out


@dataclass(slots=True)
class StreamResult:
    """Per-micro-batch results (outcome DataFrames dropped) and their totals."""

    batches: list[RunResult] = field(default_factory=list)
    query_id: str | None = None

    @property
    def input_count(self) -> int:
        return sum(b.input_count for b in self.batches)

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for b in self.batches:
            for k, v in b.counts.items():
                out[k] = out.get(k, 0) + v
        return out

    @property
    def reasons(self) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for b in self.batches:
            for k, v in b.reasons.items():
                out[k] = out.get(k, 0) + v
        return out

    @property
    def ok(self) -> bool:
        return all(b.ok for b in self.batches)


def order_within_aggregates(checked: Any, partitions: int) -> Any:
    """Validated rows (:data:`spark.validate.VALIDATED_COLUMNS`) plus the aggregate key
    ``_pa``, ``_pb``, hash-partitioned by it into ``partitions`` and sorted within each
    partition: an aggregate's rows are consecutive and in the order of
    :func:`aggregates.ordering.delivery_order` (the specification; tested against it).

    A row is *sourced* when it passed validation and has ``source`` type, id and seq; its
    effective time is the newest ``occurred_at`` of its source up to it, by (seq, input
    position) — a running max over a window partitioned by aggregate and source. The window
    runs after the repartition: its partitioning contains the shuffle key, so Spark adds no
    second exchange. Other rows (unsourced, or flagged invalid: they only need to reach the
    executor) use their own ``occurred_at``. Times compare at millisecond precision, as
    :meth:`aggregates.envelope.Message.from_dict` keeps them."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keyed = checked.withColumn("_pa", F.coalesce(F.col("_atype"), F.lit(""))).withColumn(
        "_pb",
        F.when(F.col("_aid").isNotNull(), F.col("_aid")).otherwise(
            F.concat(F.lit("raw:"), F.xxhash64(F.col("_raw")).cast("string"))
        ),
    )
    parts = keyed.repartition(partitions, "_pa", "_pb")
    position = [F.col("_src"), F.col("_o1"), F.col("_o2")]
    own = F.date_trunc("millisecond", F.col("_ts"))
    sourced = (F.col("_reason").isNull() & F.col("_stype").isNotNull()
               & F.col("_sid").isNotNull() & F.col("_seq").isNotNull())
    by_source = (Window.partitionBy("_pa", "_pb", "_stype", "_sid")
                 .orderBy(F.col("_seq"), *position)
                 .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    newest = F.max(F.when(sourced, own)).over(by_source)
    keys = parts.select(
        "*",
        own.alias("_k_own"),
        (~sourced).alias("_k_unsourced"),
        F.when(sourced, newest).otherwise(own).alias("_k_eff"),
    )
    ordered = keys.sortWithinPartitions(
        F.col("_pa"), F.col("_pb"), F.col("_k_eff").asc_nulls_first(),
        F.col("_k_unsourced"), F.col("_stype"), F.col("_sid"), F.col("_seq"),
        F.col("_k_own").asc_nulls_first(), *position,
    )
    return ordered.drop("_k_own", "_k_unsourced", "_k_eff")


class Pipeline:
    """The aggbox pipeline for one aggregates module against one MongoDB database.

    ``aggregates`` is a module name (it is imported again in every executor);
    ``mongodb_uri`` defaults to ``settings.mongodb_uri``, else the embedded local server."""

    def __init__(
        self,
        spark: Any,
        *,
        aggregates: str | None = None,
        settings: AggboxSettings | None = None,
        spark_settings: SparkSettings | None = None,
        mongodb_uri: str | None = None,
    ) -> None:
        check_session(spark)
        self.spark = spark
        self.spark_settings = spark_settings or SparkSettings.load()
        module = aggregates or self.spark_settings.aggregates
        if not module:
            raise ConfigurationError(
                "no aggregates module: pass --aggregates MODULE (or set [spark] aggregates / "
                "AGGBOX_SPARK_AGGREGATES)"
            )
        self.aggregates = module
        self.settings = settings or AggboxSettings.load()
        self.registry = Registry.from_module(module)
        self.info = RegistryInfo.from_registry(self.registry)
        self.mongodb_uri = mongodb_uri or self.settings.mongodb_uri or _embedded_uri()
        self._indexes_done = False

    # -- the shared code path -----------------------------------------------------------
    def ensure_indexes(self) -> None:
        """Create the writer's indexes (once per pipeline; idempotent)."""
        if self._indexes_done:
            return
        from pymongo import MongoClient

        client: Any = MongoClient(self.mongodb_uri)
        try:
            StoreWriter(client[self.settings.database], self.registry,
                        settings=self.settings).ensure_indexes()
        finally:
            client.close()
        self._indexes_done = True

    def task(self) -> WriterTask:
        return WriterTask(
            mongodb_uri=self.mongodb_uri,
            aggregates=self.aggregates,
            settings=self.settings.model_dump(),
            carry_over_max=self.spark_settings.carry_over_max,
        )

    def plan(self, raw: Any) -> Any:
        """The lazy outcomes DataFrame for ``raw`` (``_raw, _src, _o1, _o2``). Every action
        on it runs the writer again; :meth:`process` runs it exactly once."""
        checked = validate(raw, self.info, max_payload_bytes=self.settings.max_payload_bytes)
        ordered = order_within_aggregates(checked, self.spark_settings.shuffle_partitions)
        rows = ordered.select("_raw", "_reason", "_detail", "_mid", "_atype", "_aid")
        return rows.mapInArrow(functools.partial(write_partition, self.task()), OUTCOME_SCHEMA)

    def process(
        self,
        raw: Any,
        *,
        run_id: str,
        batch_id: int | None = None,
        outcomes_path: str | None = None,
        input_count: int | None = None,
    ) -> RunResult:
        """Run the writer over ``raw`` once, materialise the outcomes and count them."""
        self.ensure_indexes()
        started = time.monotonic()
        if input_count is None:
            input_count = int(raw.count())
        outcomes = self.plan(raw)
        target = None
        if outcomes_path:
            part = f"batch_id={batch_id}" if batch_id is not None else f"run_id={run_id}"
            target = outcomes_path.rstrip("/") + "/" + part
            outcomes.write.mode("overwrite").parquet(target)
            outcomes = self.spark.read.schema(OUTCOME_SCHEMA).parquet(target)
        else:
            outcomes = outcomes.localCheckpoint(eager=True)
        counts, reasons = _count(outcomes)
        return RunResult(run_id=run_id, input_count=input_count, counts=counts,
                         reasons=reasons, outcomes=outcomes, outcomes_path=target,
                         batch_id=batch_id, seconds=time.monotonic() - started)

    # -- batch ---------------------------------------------------------------------------
    def run_batch(
        self,
        inputs: Sequence[str],
        *,
        input_format: InputFormat | None = None,
        outcomes_path: str | None = None,
        run_id: str | None = None,
    ) -> RunResult:
        """Process files (JSON Lines / Parquet paths, directories, globs) once."""
        raw = read_batch(self.spark, inputs,
                         input_format=input_format or self.spark_settings.input_format)
        run_id = run_id or new_run_id()
        result = self.process(raw, run_id=run_id,
                              outcomes_path=outcomes_path or self.spark_settings.outcomes_path)
        log.info("run %s: %s", run_id, result.summary())
        result.raise_for_accounting()
        return result

    # -- streaming -------------------------------------------------------------------------
    def start_stream(
        self,
        source: StreamSource,
        *,
        checkpoint_location: str | None = None,
        trigger: str | None = None,
        outcomes_path: str | None = None,
        on_batch: Callable[[RunResult], None] | None = None,
        query_name: str | None = None,
    ) -> tuple[Any, StreamResult]:
        """Start the streaming query; returns it and the :class:`StreamResult` it fills."""
        checkpoint = checkpoint_location or self.spark_settings.checkpoint_location
        if not checkpoint:
            raise ConfigurationError(
                "streaming needs a checkpoint location (--checkpoint DIR or [spark] "
                "checkpoint_location): it records what was consumed, so a restart resumes "
                "instead of replaying the whole source"
            )
        outcomes_path = outcomes_path or self.spark_settings.outcomes_path
        stream_result = StreamResult()
        run_id = new_run_id()
        self.ensure_indexes()

        def each(df: Any, batch_id: int) -> None:
            df.persist()
            try:
                result = self.process(add_line_order(df), run_id=run_id, batch_id=batch_id,
                                      outcomes_path=outcomes_path)
            finally:
                df.unpersist()
            result.outcomes = None
            stream_result.batches.append(result)
            log.info("micro-batch %d: %s", batch_id, result.summary())
            if on_batch is not None:
                on_batch(result)
            result.raise_for_accounting()

        writer = read_stream(self.spark, source).writeStream.foreachBatch(each)
        writer = writer.option("checkpointLocation", checkpoint)
        if query_name:
            writer = writer.queryName(query_name)
        writer = _with_trigger(writer, trigger or self.spark_settings.trigger)
        query = writer.start()
        stream_result.query_id = str(query.id)
        return query, stream_result

    def run_stream(
        self,
        source: StreamSource,
        *,
        checkpoint_location: str | None = None,
        trigger: str | None = None,
        outcomes_path: str | None = None,
        on_batch: Callable[[RunResult], None] | None = None,
        timeout: float | None = None,
    ) -> StreamResult:
        """Run a stream until it ends (``availableNow``), ``timeout`` seconds pass, or it
        fails (raises). A processing-time stream runs until ``timeout`` or Ctrl-C."""
        query, result = self.start_stream(
            source, checkpoint_location=checkpoint_location, trigger=trigger,
            outcomes_path=outcomes_path, on_batch=on_batch,
        )
        failure: BaseException | None = None
        try:
            if timeout is None:
                query.awaitTermination()
            else:
                query.awaitTermination(timeout)
        except Exception as exc:  # StreamingQueryException: the query died
            failure = exc
        finally:
            if query.isActive:
                query.stop()
        if failure is None:
            failure = query.exception()
        if failure is not None:
            first = str(failure).strip().splitlines()[:8]
            raise StreamFailed(
                "the streaming query failed after "
                f"{len(result.batches)} completed micro-batch(es): " + "\n".join(first)
                + "\nThe checkpoint keeps the failed micro-batch unconsumed; fix the cause and "
                "run again (what it already wrote comes back as duplicate)."
            ) from failure
        return result


class StreamFailed(AggboxError):
    """The streaming query stopped with an error (see the message and the Spark log)."""


def _with_trigger(writer: Any, trigger: str) -> Any:
    t = trigger.strip()
    if t.replace("_", "").lower() in ("availablenow", "once"):
        return writer.trigger(availableNow=True)
    if not t:
        raise ConfigurationError("empty trigger; use availableNow or an interval like '10 seconds'")
    return writer.trigger(processingTime=t)


def _count(outcomes: Any) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    counts: dict[str, int] = {k: 0 for k in OUTCOME_KINDS}
    reasons: dict[tuple[str, str], int] = {}
    rows = outcomes.groupBy("outcome", "from_parked", "reason").count().collect()
    for r in rows:
        n = int(r["count"])
        key = f"released_{r['outcome']}" if r["from_parked"] else str(r["outcome"])
        counts[key] = counts.get(key, 0) + n
        if r["reason"] is not None and not r["from_parked"]:
            rk = (str(r["outcome"]), str(r["reason"]))
            reasons[rk] = reasons.get(rk, 0) + n
    counts["total"] = sum(counts[k] for k in OUTCOME_KINDS)
    return counts, reasons


def _embedded_uri() -> str:
    from aggbox.servers import mongodb_uri

    return mongodb_uri()


def run_batch(
    spark: Any,
    inputs: Sequence[str],
    *,
    aggregates: str,
    settings: AggboxSettings | None = None,
    spark_settings: SparkSettings | None = None,
    mongodb_uri: str | None = None,
    input_format: InputFormat | None = None,
    outcomes_path: str | None = None,
) -> RunResult:
    """Convenience: ``Pipeline(...).run_batch(inputs)``."""
    return Pipeline(spark, aggregates=aggregates, settings=settings,
                    spark_settings=spark_settings, mongodb_uri=mongodb_uri).run_batch(
        inputs, input_format=input_format, outcomes_path=outcomes_path)


def run_stream(
    spark: Any,
    source: StreamSource,
    *,
    aggregates: str,
    checkpoint_location: str,
    trigger: str = "availableNow",
    settings: AggboxSettings | None = None,
    spark_settings: SparkSettings | None = None,
    mongodb_uri: str | None = None,
    outcomes_path: str | None = None,
    on_batch: Callable[[RunResult], None] | None = None,
    timeout: float | None = None,
) -> StreamResult:
    """Convenience: ``Pipeline(...).run_stream(source, ...)``."""
    return Pipeline(spark, aggregates=aggregates, settings=settings,
                    spark_settings=spark_settings, mongodb_uri=mongodb_uri).run_stream(
        source, checkpoint_location=checkpoint_location, trigger=trigger,
        outcomes_path=outcomes_path, on_batch=on_batch, timeout=timeout)

