"""The Spark pipeline benchmark's scenarios (bench/pipeline.py): its input files, the
pipeline, the raw Spark upsert job and the MongoDB Spark Connector, and the Spark session."""

from __future__ import annotations

import functools
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pipeline_measure import Measured, RssSampler

AGGREGATES = "aggbox.examples.orders"
#: The newest 11.x on Maven Central is wanted; mirrors may lack it (then 10.x is tried).
CONNECTOR_VERSIONS = ("11.0.1", "11.0.0", "10.5.0")
FILES = 8


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# -- input -------------------------------------------------------------------------------------


def write_input(directory: Path, n: int, *, skewed: bool) -> Path:
    """``n`` CustomerRegistered messages in FILES JSON Lines files. Uniform: n/5 aggregates;
    skewed: half of the messages go to one aggregate, the rest uniform. Every message has a
    distinct, increasing occurred_at (the inbox floor never rejects one)."""
    directory.mkdir(parents=True, exist_ok=True)
    base = datetime(2026, 1, 1, tzinfo=UTC)
    aggregates = max(1, n // 5)
    handles = [(directory / f"part-{i}.jsonl").open("w") for i in range(FILES)]
    seen: set[str] = set()
    try:
        for i in range(n):
            aid = "hot" if skewed and i % 2 == 0 else f"c{(i * 7919) % aggregates}"
            seen.add(aid)
            at = (base + timedelta(milliseconds=i)).isoformat().replace("+00:00", "Z")
            line = (f'{{"message_id":"m{i}","type":"CustomerRegistered","aggregate_type":'
                    f'"Customer","aggregate_id":"{aid}","payload":{{"name":"n{i}",'
                    f'"credit_limit":{i % 1000}}},"occurred_at":"{at}"}}\n')
            handles[i % FILES].write(line)
    finally:
        for h in handles:
            h.close()
    (directory / "aggregates").write_text(str(len(seen)))
    return directory

# -- scenarios ---------------------------------------------------------------------------------


def job_group(spark: Any, group: str | None) -> Any:
    """Spark jobs started inside run under job group ``group`` (None: unchanged)."""
    import contextlib

    @contextlib.contextmanager
    def scope() -> Any:
        if group is None:
            yield
            return
        spark.sparkContext.setJobGroup(group, group)
        try:
            yield
        finally:
            spark.sparkContext.setJobGroup("other", "other")

    return scope()


def run_pipeline(spark: Any, uri: str, inputs: Path, group: str | None = None
                 ) -> tuple[float, dict[str, int], float, dict[str, Any]]:
    from aggregates.core.settings import AggboxSettings
    from spark.pipeline import Pipeline

    db = f"bench_{uuid.uuid4().hex[:8]}"
    settings = AggboxSettings.load(mongodb_uri=uri, database=db)
    # As `aggbox run` runs it: no outcome DataFrame kept (the counts only).
    pipeline = Pipeline(spark, aggregates=AGGREGATES, settings=settings, mongodb_uri=uri,
                        keep_outcomes=False)
    pipeline.ensure_indexes()
    with RssSampler() as rss, Measured(spark) as measured, job_group(spark, group):
        t0 = time.perf_counter()
        result = pipeline.run_batch([str(inputs / "*.jsonl")])
        seconds = time.perf_counter() - t0
    drop(uri, db)
    return seconds, result.counts, rss.peak_mb, measured.figures()


def _upsert_partition(uri: str, db: str, writes: Any, rows: Any) -> None:
    from pymongo import MongoClient, UpdateOne

    client: Any = MongoClient(uri)
    coll = client[db]["customers"]
    ops: list[Any] = []
    for r in rows:
        ops.append(UpdateOne({"_id": r["aggregate_id"]},
                             {"$set": {"state": {"name": r["name"],
                                                 "credit_limit": r["credit_limit"]}, "_v": 1}},
                             upsert=True))
        if len(ops) >= 1000:
            coll.bulk_write(ops, ordered=False)
            writes.add(len(ops))
            ops = []
    if ops:
        coll.bulk_write(ops, ordered=False)
        writes.add(len(ops))
    client.close()


def _messages(spark: Any, inputs: Path) -> Any:
    from pyspark.sql import functions as F

    schema = ("message_id STRING, aggregate_id STRING, occurred_at TIMESTAMP, "
              "payload STRUCT<name: STRING, credit_limit: INT>")
    df = spark.read.text(str(inputs / "*.jsonl"))
    return df.select(F.from_json("value", schema).alias("m")).select("m.*")


def run_raw(spark: Any, uri: str, inputs: Path, group: str | None = None
            ) -> tuple[float, int]:
    """Group by aggregate (last message wins), then blind bulk upserts of the documents.
    Also returns the write statements sent (counted by the partitions)."""
    from pyspark.sql import functions as F

    db = f"bench_{uuid.uuid4().hex[:8]}"
    writes = spark.sparkContext.accumulator(0)
    with job_group(spark, group):
        t0 = time.perf_counter()
        docs = (_messages(spark, inputs)
                .groupBy("aggregate_id")
                .agg(F.max_by(F.col("payload"), F.col("occurred_at")).alias("p"))
                .select("aggregate_id", "p.name", "p.credit_limit"))
        docs.foreachPartition(functools.partial(_upsert_partition, uri, db, writes))
        seconds = time.perf_counter() - t0
    check_written(uri, db, inputs)
    drop(uri, db)
    return seconds, int(writes.value)


def run_connector(spark: Any, uri: str, inputs: Path, group: str | None = None
                  ) -> tuple[float, int]:
    """One replace-with-upsert per message through the MongoDB Spark Connector. Also
    returns the rows handed to it (counted apart, untimed): one replace each."""
    from pyspark.sql import functions as F

    db = f"bench_{uuid.uuid4().hex[:8]}"
    frame = _messages(spark, inputs).select(F.col("aggregate_id").alias("_id"),
                                            F.col("payload").alias("state"))
    rows = int(frame.count())
    with job_group(spark, group):
        t0 = time.perf_counter()
        (frame
         .write.format("mongodb").mode("append")
         .option("connection.uri", uri).option("database", db)
         .option("collection", "customers")
         .option("operationType", "replace").option("upsertDocument", "true")
         .save())
        seconds = time.perf_counter() - t0
    check_written(uri, db, inputs)
    drop(uri, db)
    return seconds, rows


def check_written(uri: str, db: str, inputs: Path) -> None:
    """The baseline really wrote one document per aggregate (not a silent no-op)."""
    from pymongo import MongoClient

    client: Any = MongoClient(uri)
    found = client[db]["customers"].count_documents({})
    client.close()
    expected = int((inputs / "aggregates").read_text())
    if found != expected:
        raise RuntimeError(f"baseline wrote {found} documents, expected {expected}")


def drop(uri: str, db: str) -> None:
    from pymongo import MongoClient

    client: Any = MongoClient(uri)
    client.drop_database(db)
    client.close()

def start_spark(connector: bool, ui: bool = False, master: str = "local[2]"
                ) -> tuple[Any, str | None, str | None]:
    """A session with the connector if one of CONNECTOR_VERSIONS resolves; ``ui``: the
    driver UI on (its REST API gives the stage tables); ``master``: ``local[2]`` or a
    standalone master's URL."""
    from spark.session import build_session
    from spark.settings import SparkSettings

    settings = SparkSettings.load(master=master, shuffle_partitions=4,
                                  conf={"spark.ui.enabled": "true" if ui else "false",
                                        "spark.driver.memory": "4g"})
    problems: list[str] = []
    if connector:
        for version in CONNECTOR_VERSIONS:
            coordinate = f"org.mongodb.spark:mongo-spark-connector_2.13:{version}"
            try:
                spark = build_session(settings, packages=[coordinate])
                return spark, coordinate, "; ".join(problems) or None
            except Exception as exc:
                problems.append(f"{coordinate}: {str(exc).splitlines()[0][:200]}")
                log(f"cannot start Spark with {coordinate}; trying the next version")
    spark = build_session(settings)
    return spark, None, "; ".join(problems) or "skipped (--no-connector)"
