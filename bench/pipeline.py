"""Benchmark of the Spark pipeline on ``local[2]`` against the local MongoDB server.

Scenarios per input size (messages):

(a) uniform  — the pipeline, ≈ 5 messages per aggregate;
(b) skewed   — the pipeline, one aggregate gets 50 % of the messages;
(c) raw      — the same final documents written by a blind Spark job: group by aggregate,
               one unconditional bulk upsert per document (no read, no version, no dedup);
(d) connector — the MongoDB Spark Connector writing one document per message (replace with
               upsert by aggregate id: a peer with no idempotency and no ordering).

Messages are ``CustomerRegistered`` for ``examples.orders`` (no emits, so the outbox stays
empty). Peak RSS of the Python workers is sampled from /proc while the pipeline runs.

    .venv/bin/python bench/pipeline.py [--sizes 1e5,1e6] [--quick] [--no-connector]

Prints a table, then one JSON line (last line) with ``pipeline_vs_raw``,
``pipeline_vs_connector``, ``skew_vs_uniform`` (throughput ratios at the largest size),
``per_msg_growth_1e5_to_1e6`` (time per message, largest / smallest size) and
``worker_peak_rss_mb`` (largest peak of one Python worker, and per size).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

AGGREGATES = "examples.orders"
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


# -- peak RSS of the Python workers ------------------------------------------------------------


class RssSampler:
    """Polls /proc for pyspark daemon/worker processes; keeps the largest RSS of one."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.wait(self.interval):
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                    if b"pyspark.daemon" not in cmd and b"pyspark.worker" not in cmd:
                        continue
                    rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
                except (OSError, ValueError, IndexError):
                    continue
                self.peak_mb = max(self.peak_mb, rss / 2**20)


# -- scenarios ---------------------------------------------------------------------------------


def run_pipeline(spark: Any, uri: str, inputs: Path) -> tuple[float, dict[str, int], float]:
    from aggregates.settings import AggboxSettings
    from spark.pipeline import Pipeline

    db = f"bench_{uuid.uuid4().hex[:8]}"
    settings = AggboxSettings.load(mongodb_uri=uri, database=db)
    pipeline = Pipeline(spark, aggregates=AGGREGATES, settings=settings, mongodb_uri=uri)
    pipeline.ensure_indexes()
    with RssSampler() as rss:
        t0 = time.perf_counter()
        result = pipeline.run_batch([str(inputs / "*.jsonl")])
        seconds = time.perf_counter() - t0
    drop(uri, db)
    return seconds, result.counts, rss.peak_mb


def _upsert_partition(uri: str, db: str, rows: Any) -> None:
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
            ops = []
    if ops:
        coll.bulk_write(ops, ordered=False)
    client.close()


def _messages(spark: Any, inputs: Path) -> Any:
    from pyspark.sql import functions as F

    schema = ("message_id STRING, aggregate_id STRING, occurred_at TIMESTAMP, "
              "payload STRUCT<name: STRING, credit_limit: INT>")
    df = spark.read.text(str(inputs / "*.jsonl"))
    return df.select(F.from_json("value", schema).alias("m")).select("m.*")


def run_raw(spark: Any, uri: str, inputs: Path) -> float:
    """Group by aggregate (last message wins), then blind bulk upserts of the documents."""
    import functools

    from pyspark.sql import functions as F

    db = f"bench_{uuid.uuid4().hex[:8]}"
    t0 = time.perf_counter()
    docs = (_messages(spark, inputs)
            .groupBy("aggregate_id")
            .agg(F.max_by(F.col("payload"), F.col("occurred_at")).alias("p"))
            .select("aggregate_id", "p.name", "p.credit_limit"))
    docs.foreachPartition(functools.partial(_upsert_partition, uri, db))
    seconds = time.perf_counter() - t0
    check_written(uri, db, inputs)
    drop(uri, db)
    return seconds


def run_connector(spark: Any, uri: str, inputs: Path) -> float:
    """One replace-with-upsert per message through the MongoDB Spark Connector."""
    from pyspark.sql import functions as F

    db = f"bench_{uuid.uuid4().hex[:8]}"
    t0 = time.perf_counter()
    (_messages(spark, inputs)
     .select(F.col("aggregate_id").alias("_id"), F.col("payload").alias("state"))
     .write.format("mongodb").mode("append")
     .option("connection.uri", uri).option("database", db).option("collection", "customers")
     .option("operationType", "replace").option("upsertDocument", "true")
     .save())
    seconds = time.perf_counter() - t0
    check_written(uri, db, inputs)
    drop(uri, db)
    return seconds


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


# -- main --------------------------------------------------------------------------------------


def start_spark(connector: bool) -> tuple[Any, str | None, str | None]:
    """A session with the connector if one of CONNECTOR_VERSIONS resolves."""
    from spark.session import build_session
    from spark.settings import SparkSettings

    settings = SparkSettings.load(master="local[2]", shuffle_partitions=4,
                                  conf={"spark.ui.enabled": "false",
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1e5,1e6",
                        help="comma-separated input sizes in messages (default: 1e5,1e6)")
    parser.add_argument("--quick", action="store_true",
                        help="a small run (sizes 2e4,1e5) to check the script works")
    parser.add_argument("--no-connector", action="store_true",
                        help="skip scenario (d), the MongoDB Spark Connector")
    args = parser.parse_args()
    sizes = [int(float(s)) for s in ("2e4,1e5" if args.quick else args.sizes).split(",")]

    from aggbox.servers import start_local_mongodb

    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")]))
    mongo = start_local_mongodb(java_options=("-Xmx8g",))
    log(f"MongoDB: {mongo.kind} {mongo.uri}")
    spark, connector, connector_problem = start_spark(not args.no_connector)
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(tempfile.mkdtemp(prefix="aggbox-bench-"))
    rows: dict[int, dict[str, Any]] = {}
    try:
        warm = write_input(work / "warm", 2000, skewed=False)
        run_pipeline(spark, mongo.uri, warm)  # Python workers started, modules imported
        for n in sizes:
            log(f"generating {n} messages")
            uniform = write_input(work / f"u{n}", n, skewed=False)
            skewed = write_input(work / f"s{n}", n, skewed=True)
            row: dict[str, Any] = {"messages": n}
            log(f"{n}: pipeline uniform")
            row["uniform_s"], counts, row["rss_uniform_mb"] = run_pipeline(spark, mongo.uri,
                                                                            uniform)
            row["uniform_counts"] = counts
            log(f"{n}: pipeline skewed")
            row["skewed_s"], counts, row["rss_skewed_mb"] = run_pipeline(spark, mongo.uri,
                                                                          skewed)
            row["skewed_counts"] = counts
            log(f"{n}: raw upsert")
            row["raw_s"] = run_raw(spark, mongo.uri, uniform)
            row["connector_s"] = None
            if connector:
                log(f"{n}: connector")
                try:
                    row["connector_s"] = run_connector(spark, mongo.uri, uniform)
                except Exception as exc:
                    connector_problem = f"{connector} failed: {str(exc).splitlines()[0][:300]}"
                    log(connector_problem)
                    connector = None
            rows[n] = row
            shutil.rmtree(uniform)
            shutil.rmtree(skewed)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()
        mongo.stop()

    print(f"{'messages':>10} {'uniform s':>10} {'msg/s':>9} {'skewed s':>9} {'raw s':>7} "
          f"{'connector s':>12} {'rss MB':>7}")
    for n, r in rows.items():
        conn = f"{r['connector_s']:.1f}" if r["connector_s"] is not None else "n/a"
        print(f"{n:>10} {r['uniform_s']:>10.1f} {n / r['uniform_s']:>9.0f} "
              f"{r['skewed_s']:>9.1f} {r['raw_s']:>7.1f} {conn:>12} "
              f"{max(r['rss_uniform_mb'], r['rss_skewed_mb']):>7.0f}")
        print(f"{'':>10} uniform outcomes {r['uniform_counts']}")
        print(f"{'':>10} skewed outcomes  {r['skewed_counts']}")
    big, small = rows[max(rows)], rows[min(rows)]
    result: dict[str, Any] = {
        "pipeline_vs_raw": round(big["raw_s"] / big["uniform_s"], 3),
        "pipeline_vs_connector": (round(big["connector_s"] / big["uniform_s"], 3)
                                  if big["connector_s"] else None),
        "skew_vs_uniform": round(big["uniform_s"] / big["skewed_s"], 3),
        "per_msg_growth_1e5_to_1e6": round(
            (big["uniform_s"] / big["messages"]) / (small["uniform_s"] / small["messages"]), 3),
        "worker_peak_rss_mb": round(max(max(r["rss_uniform_mb"], r["rss_skewed_mb"])
                                        for r in rows.values()), 1),
        "worker_peak_rss_mb_by_size": {str(n): round(max(r["rss_uniform_mb"],
                                                         r["rss_skewed_mb"]), 1)
                                       for n, r in rows.items()},
        "sizes": list(rows),
        "seconds": {str(n): {k: r[k] for k in ("uniform_s", "skewed_s", "raw_s", "connector_s")}
                    for n, r in rows.items()},
        "connector": connector,
        # On success: the newer versions that could not be resolved (None if none).
        "connector_problem": connector_problem,
        "mongodb": mongo.kind,
        "master": "local[2]",
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
