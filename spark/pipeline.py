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

Order within an aggregate: :func:`spark.order.order_within_aggregates` (the definition is
:func:`aggregates.fold.ordering.delivery_order`).

The MongoDB URI is required (``mongodb_uri=`` or ``settings.mongodb_uri``): a library never
starts a server by itself. The ``aggbox`` command resolves "no URI given" to its embedded
local server once, before it builds the pipeline (docs/design.md, "Layering").

Every input record ends in exactly one outcome. :class:`RunResult` compares the number of
input records with the number of outcome rows (released parked messages are counted apart)
and :meth:`RunResult.raise_for_accounting` fails the run (or the micro-batch) otherwise
(:mod:`spark.results`).
Re-running the same input, or Spark re-running a task, is harmless: what was already
applied comes back as ``duplicate``.

``spark`` may be a Spark Connect session (``SparkSession.builder.remote(...)``, a
Databricks notebook's): DataFrames only — no ``sparkContext``, RDDs or accumulators;
streaming on Connect: :mod:`spark.microbatch`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from aggregates.core.errors import AggboxError, ConfigurationError, DeploymentError
from aggregates.core.settings import AggboxSettings
from aggregates.domain.aggregate import Registry
from aggregates.store.writer import StoreWriter
from spark.executor import (
    DEPLOYMENT_FAILED,
    STATS_COLUMN,
    WriterTask,
    deployment_failure,
    write_partition,
)
from spark.microbatch import BatchViews, MicroBatch, with_trigger
from spark.order import order_within_aggregates
from spark.pyfiles import install_py_files, read_py_files
from spark.results import (
    AccountingError,
    RunResult,
    StreamResult,
    count_outcomes,
    counts_from_observed,
    new_run_id,
)
from spark.schema import OUTCOME_SCHEMA
from spark.session import check_session, is_connect
from spark.settings import InputFormat, SparkSettings
from spark.sources import (
    CE_HEADER_COLUMN,
    TRACE_HEADER_COLUMNS,
    StreamSource,
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
]

log = logging.getLogger("aggbox.spark")


class Pipeline:
    """The aggbox pipeline for one aggregates module against one MongoDB database.

    ``aggregates`` is a module name (it is imported again in every executor);
    ``mongodb_uri`` defaults to ``settings.mongodb_uri``; one of them is required.
    ``keep_outcomes=False``: :meth:`run_batch` keeps no outcome DataFrame
    (``RunResult.outcomes`` is None unless an outcomes path is given; the counts are there
    all the same), so the outcomes are not checkpointed."""

    #: The writers add their counts to the run's progress document (:mod:`spark.live`),
    #: which the command line's progress display polls.
    live_progress: bool = False

    def __init__(
        self,
        spark: Any,
        *,
        aggregates: str | None = None,
        settings: AggboxSettings | None = None,
        spark_settings: SparkSettings | None = None,
        mongodb_uri: str | None = None,
        keep_outcomes: bool = True,
    ) -> None:
        check_session(spark)
        self.keep_outcomes = keep_outcomes
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
        self._pollers: dict[str, BatchViews] = {}

    # -- pickling (Spark Connect runs foreachBatch functions in the server's Python) ------
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in ("spark", "registry", "info", "_pollers"):
            state.pop(name, None)
        # The server's foreachBatch process gets no artifacts: the files travel along.
        state["_shipped"] = read_py_files(self.spark_settings.py_files)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        install_py_files(state.pop("_shipped", ()))
        self.__dict__.update(state)
        self.spark = None  # DataFrames carry their session (raw.sparkSession)
        self.registry = Registry.from_module(self.aggregates)
        self.info = RegistryInfo.from_registry(self.registry)
        self._pollers = {}

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
            progress=self.live_progress,
        )

    def plan(self, raw: Any) -> Any:
        """The lazy outcomes DataFrame for ``raw`` (``_raw, _src, _o1, _o2``). Every action
        on it runs the writer again; :meth:`process` runs it exactly once."""
        return self._plan(raw, None)

    def _plan(self, raw: Any, seen: Any, run: str | None = None) -> Any:
        """:meth:`plan`; with an ``Observation`` ``seen``: the rows that reach the writer
        are counted into it (``rows``) and the outcomes carry the executors' counts
        (:data:`spark.executor.STATS_COLUMN`). ``run``: the writers' run stamp
        (:attr:`spark.executor.WriterTask.run`)."""
        checked = validate(raw, self.info, max_payload_bytes=self.settings.max_payload_bytes)
        ordered = order_within_aggregates(checked, self.spark_settings.shuffle_partitions)
        rows = ordered.select("_raw", "_reason", "_detail",
                              *[c for c in (*TRACE_HEADER_COLUMNS, CE_HEADER_COLUMN)
                                if c in ordered.columns])
        if seen is None:
            return rows.mapInArrow(functools.partial(write_partition, self.task()),
                                   OUTCOME_SCHEMA)
        from pyspark.sql import functions as F
        from pyspark.sql.types import StringType, StructField, StructType

        rows = rows.observe(seen, F.count(F.lit(1)).alias("rows"))
        task = dataclasses.replace(self.task(), stats=True, run=run)
        schema = StructType([*OUTCOME_SCHEMA.fields, StructField(STATS_COLUMN, StringType())])
        return rows.mapInArrow(functools.partial(write_partition, task), schema)

    def process(
        self,
        raw: Any,
        *,
        run_id: str,
        batch_id: int | None = None,
        outcomes_path: str | None = None,
        input_count: int | None = None,
        keep_outcomes: bool = True,
    ) -> RunResult:
        """Run the writer over ``raw`` once (one Spark job), materialise the outcomes — as
        Parquet under ``outcomes_path``, else a local checkpoint, or not at all when
        ``keep_outcomes`` is false (``RunResult.outcomes`` is then None) — and count them.

        The input is counted as it reaches the writer and the outcomes by the executors,
        both returned with the job (``Observation``), so no second pass over the input or
        the outcomes runs. Should a session not return the observed values (the fallback,
        never seen on Spark 4.0), the input and the kept outcomes are counted by jobs of
        their own (a session that returns none always keeps the outcomes)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        self.ensure_indexes()
        started = time.monotonic()
        seen_in, seen_out = Observation(), Observation()
        # The run stamp: the run, and the micro-batch in a stream (docs/design.md "Counts that
        # survive retries").
        run = run_id if batch_id is None else f"{run_id}/{batch_id}"
        outcomes = self._plan(raw, seen_in, run).observe(
            seen_out, F.count(F.lit(1)).alias("rows"),
            F.array_join(F.collect_list(STATS_COLUMN), "\n").alias("stats"),
        ).where(F.col("outcome") != DEPLOYMENT_FAILED).drop(STATS_COLUMN)
        target = None
        if outcomes_path:
            part = f"batch_id={batch_id}" if batch_id is not None else f"run_id={run_id}"
            target = outcomes_path.rstrip("/") + "/" + part
            outcomes.write.mode("overwrite").parquet(target)
            outcomes = raw.sparkSession.read.schema(OUTCOME_SCHEMA).parquet(target)
        elif keep_outcomes or is_connect(raw.sparkSession):
            outcomes = outcomes.localCheckpoint(eager=True)
        else:
            outcomes.write.format("noop").mode("overwrite").save()
            outcomes = None
        observed_in, observed_out = seen_in.get, seen_out.get
        if observed_out and (failed := deployment_failure(observed_out["stats"])):
            raise DeploymentError(failed)  # a task met it: docs/design.md "Deployment errors"
        if observed_in and observed_out:
            if input_count is None:
                input_count = int(observed_in["rows"])
            counts, reasons, by_type, samples = counts_from_observed(observed_out)
        else:  # no observed values: count with jobs of their own
            log.warning("the session returned no observed counts; counting with extra jobs")
            if outcomes is None:
                raise AccountingError("the session returned no observed counts and the "
                                      "outcomes were not kept: the run cannot be accounted")
            if input_count is None:
                input_count = int(raw.count())
            counts, reasons, by_type, samples = count_outcomes(outcomes)
        if not keep_outcomes and not outcomes_path:
            outcomes = None
        return RunResult(run_id=run_id, input_count=input_count, counts=counts,
                         reasons=reasons, by_type=by_type, outcomes=outcomes, outcomes_path=target,
                         batch_id=batch_id, seconds=time.monotonic() - started,
                         samples=samples)

    # -- batch ---------------------------------------------------------------------------
    def run_batch(
        self,
        inputs: Sequence[str],
        *,
        input_format: InputFormat | None = None,
        outcomes_path: str | None = None,
        run_id: str | None = None,
        keep_outcomes: bool | None = None,
    ) -> RunResult:
        """Process files (JSON Lines / Parquet paths, directories, globs) once.
        ``keep_outcomes`` (default: the pipeline's): see :class:`Pipeline`."""
        raw = read_batch(self.spark, inputs,
                         input_format=input_format or self.spark_settings.input_format)
        run_id = run_id or new_run_id()
        result = self.process(raw, run_id=run_id,
                              outcomes_path=outcomes_path or self.spark_settings.outcomes_path,
                              keep_outcomes=(self.keep_outcomes if keep_outcomes is None
                                             else keep_outcomes))
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

        connect = is_connect(self.spark)
        views = BatchViews(self.spark, stream_result, on_batch) if connect else None

        def sink(result: RunResult) -> None:
            stream_result.batches.append(result)
            if on_batch is not None:
                on_batch(result)

        each = MicroBatch(self, run_id=run_id, outcomes_path=outcomes_path,
                          sink=None if views is not None else sink,
                          view_prefix=views.prefix if views is not None else None)
        writer = read_stream(self.spark, source).writeStream.foreachBatch(each)
        writer = writer.option("checkpointLocation", checkpoint)
        if query_name:
            writer = writer.queryName(query_name)
        writer = with_trigger(writer, trigger or self.spark_settings.trigger)
        query = writer.start()
        stream_result.query_id = str(query.id)
        if views is not None:
            self._pollers[stream_result.query_id] = views
            views.start(query)
        return query, stream_result

    def collect_batches(self, stream_result: StreamResult) -> None:
        """Spark Connect: take the results of micro-batches finished so far into
        ``stream_result`` (a thread does it every half second while the query runs;
        :meth:`run_stream` calls this once more at the end). Nothing to do otherwise."""
        views = self._pollers.get(stream_result.query_id or "")
        if views is not None:
            views.poll()

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
        views = self._pollers.pop(result.query_id or "", None)
        if views is not None:
            views.finish()
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
