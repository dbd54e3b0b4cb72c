"""The Python API on a Spark Connect session, run as its own process by
tests/spark/test_spark_connect.py (a process holds either a JVM session or a Connect one:
``builder.remote`` switches all of ``pyspark.sql`` to Connect).

    python -m tests.spark.connect_client '<json request>'

Request: ``remote``, ``mongodb_uri``, ``database``, ``aggregates``, ``py_files`` and
either ``inputs`` (batch) or ``bootstrap_servers`` + ``topic`` + ``checkpoint`` (an
availableNow stream). Prints one JSON line: the result, the session's class, whether any
``sparkContext`` / JVM was touched, how often the progress handler was called."""

from __future__ import annotations

import json
import sys
from typing import Any


def main(request: dict[str, Any]) -> dict[str, Any]:
    import pyspark
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    touched: list[str] = []

    def no_jvm(*args: Any, **kwargs: Any) -> None:
        touched.append("SparkContext()")
        raise AssertionError("a SparkContext was created on the Spark Connect path")

    def no_context(self: Any) -> None:
        touched.append("sparkContext")
        raise AssertionError("sparkContext used on the Spark Connect path")

    pyspark.SparkContext.__init__ = no_jvm  # type: ignore[method-assign]
    ConnectSession.sparkContext = property(no_context)  # type: ignore[assignment,method-assign]

    from rich.console import Console

    from aggregates.core.settings import AggboxSettings
    from spark.pipeline import Pipeline, RunResult
    from spark.progress import spark_progress
    from spark.session import build_session, is_connect
    from spark.settings import SparkSettings
    from spark.sources import KafkaSource

    spark_settings = SparkSettings.load(remote=request["remote"], shuffle_partitions=3,
                                        arrow_batch_rows=128,
                                        py_files=request.get("py_files", []))
    spark = build_session(spark_settings)
    progress_calls: list[bool] = []
    register = spark.registerProgressHandler

    def counting(handler: Any) -> None:
        def wrapped(*args: Any, **kwargs: Any) -> None:
            progress_calls.append(True)
            handler(*args, **kwargs)

        register(wrapped)

    spark.registerProgressHandler = counting
    spark.removeProgressHandler = lambda handler: None
    settings = AggboxSettings.load(mongodb_uri=request["mongodb_uri"],
                                   database=request["database"])
    pipeline = Pipeline(spark, aggregates=request["aggregates"], settings=settings,
                        spark_settings=spark_settings, mongodb_uri=request["mongodb_uri"])
    out: dict[str, Any] = {"session": f"{type(spark).__module__}.{type(spark).__name__}",
                           "is_connect": is_connect(spark)}
    console = Console(file=sys.stderr, force_terminal=True)
    with spark_progress(spark, console, enabled=True, interval=0.1):
        if "inputs" in request:
            result = pipeline.run_batch(request["inputs"])
            out.update(input=result.input_count, counts=result.counts,
                       reasons=[[*k, n] for k, n in result.reasons.items()],
                       outcome_rows=result.outcomes.count())
        else:
            seen: list[RunResult] = []
            source = KafkaSource(request["bootstrap_servers"], request["topic"],
                                 max_offsets_per_trigger=request.get("max_offsets"))
            stream = pipeline.run_stream(source, checkpoint_location=request["checkpoint"],
                                         trigger="availableNow", on_batch=seen.append,
                                         timeout=request.get("timeout", 240))
            out.update(input=stream.input_count, counts=stream.counts,
                       reasons=[[*k, n] for k, n in stream.reasons.items()],
                       batches=[b.input_count for b in stream.batches],
                       batch_ids=[b.batch_id for b in stream.batches],
                       on_batch=[b.batch_id for b in seen])
    out.update(progress_calls=len(progress_calls), touched=touched,
               gateway=pyspark.SparkContext._gateway is not None,
               active_context=pyspark.SparkContext._active_spark_context is not None)
    spark.stop()
    return out


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
