"""The pipeline: read → validate → route → repartition by aggregate → sort within aggregate →
executor-side writer (``mapInArrow``) → outcomes. Batch and streaming share one code path
(:meth:`Pipeline.process`); streaming runs it in ``foreachBatch``.

    from spark.pipeline import Pipeline
    from spark.session import build_session

    spark = build_session()
    pipeline = Pipeline(spark, aggregates="myteam.aggregates",
                        mongodb_uri="mongodb://db1.example:27017/?replicaSet=rs0")
    result = pipeline.run_batch(["in/*.jsonl"])
    result.counts        # {"applied": …, "duplicate": …, "dead_lettered": …, "parked": …}
    result.outcomes      # DataFrame, one row per message (spark.schema.OUTCOME_SCHEMA)

Order within an aggregate: each source (``source.type`` + ``source.id``) keeps its
``source.seq`` order, and sources and unsourced messages are interleaved by ``occurred_at``
(for a sourced message the newest of its source up to its seq), ties settled by source, then
input position (file path and line, or Kafka partition and offset). The definition is
:func:`aggregates.ordering.delivery_order`; :func:`spark.order.order_within_aggregates`
computes it.

The MongoDB URI is required (``mongodb_uri=`` or ``settings.mongodb_uri``): a library never
starts a server by itself. The ``aggbox`` command resolves "no URI given" to its embedded
local server once, before it builds the pipeline (docs/design.md, "Layering").

Every input record ends in exactly one outcome. :class:`RunResult` compares the number of
input records with the number of outcome rows (released parked messages are counted apart)
and :meth:`RunResult.raise_for_accounting` fails the run (or the micro-batch) otherwise
(:mod:`spark.results`).
Re-running the same input, or Spark re-running a task, is harmless: what was already
applied comes back as ``duplicate``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from aggregates.aggregate import Registry
from aggregates.errors import AggboxError, ConfigurationError
from aggregates.settings import AggboxSettings
from aggregates.writer import StoreWriter
from spark.executor import WriterTask, write_partition
from spark.order import order_within_aggregates
from spark.results import (
    AccountingError,
    RunResult,
    StreamResult,
    count_outcomes,
    new_run_id,
)
from spark.schema import OUTCOME_SCHEMA
from spark.session import check_session
from spark.settings import InputFormat, SparkSettings
from spark.sources import (
    CE_HEADER_COLUMN,
    TRACE_HEADER_COLUMNS,
    StreamSource,
    add_line_order,
    read_batch,
    read_stream,
)
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


class Pipeline:
    """The aggbox pipeline for one aggregates module against one MongoDB database.

    ``aggregates`` is a module name (it is imported again in every executor);
    ``mongodb_uri`` defaults to ``settings.mongodb_uri``; one of them is required."""

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
        uri = mongodb_uri or self.settings.mongodb_uri
        if not uri:
            raise ConfigurationError(
                "no MongoDB URI: pass mongodb_uri=... (or set mongodb_uri in the settings / "
                "AGGBOX_MONGODB_URI); the pipeline never starts a local server itself"
            )
        self.mongodb_uri: str = uri
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
        rows = ordered.select("_raw", "_reason", "_detail", "_mid", "_atype", "_aid", "_mtype",
                              *[c for c in (*TRACE_HEADER_COLUMNS, CE_HEADER_COLUMN)
                                if c in ordered.columns])
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
        counts, reasons, by_type = count_outcomes(outcomes)
        return RunResult(run_id=run_id, input_count=input_count, counts=counts,
                         reasons=reasons, by_type=by_type, outcomes=outcomes, outcomes_path=target,
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

