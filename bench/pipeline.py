"""Benchmark of the Spark pipeline on ``local[2]`` against the local MongoDB server.

Scenarios per input size (messages):

(a) uniform  — the pipeline, ≈ 5 messages per aggregate;
(b) skewed   — the pipeline, one aggregate gets 50 % of the messages;
(c) raw      — the same final documents written by a blind Spark job: group by aggregate,
               one unconditional bulk upsert per document (no read, no version, no dedup);
(d) connector — the MongoDB Spark Connector writing one document per message (replace with
               upsert by aggregate id: a peer with no idempotency and no ordering).

Messages are ``CustomerRegistered`` for ``aggbox.examples.orders`` (no emits, so the outbox stays
empty). Peak RSS of the Python workers is sampled from /proc while the pipeline runs.

    .venv/bin/python bench/pipeline.py [--sizes 1e5,1e6] [--quick] [--no-connector]

Prints a table, then one JSON line (last line) with ``pipeline_vs_raw``,
``pipeline_vs_connector``, ``skew_vs_uniform`` (throughput ratios at the largest size),
``per_msg_growth_1e5_to_1e6`` (time per message, largest / smallest size),
``worker_peak_rss_mb`` (largest peak of one Python worker, and per size), and, for the
uniform run at the largest size:

- ``python_cpu_us_per_msg``: CPU-µs per message of the Python workers, summed over them,
  the handlers' own CPU excluded. The executor function is wrapped (bench only: the bench
  replaces ``spark.pipeline.write_partition`` with :func:`measured_write_partition`, no
  product code changes): each partition measures ``getrusage(RUSAGE_SELF)`` of its worker
  process from its first to its last Arrow batch (input decoding, parsing, the writer, the
  outcome batches: a worker runs one task at a time) and adds it to a Spark accumulator;
- ``handler_cpu_us_per_msg``: the handlers' own thread CPU (bench/measure.py), per message;
- ``server_ops_per_msg``: write statements plus read commands the workers' MongoDB clients
  sent, per message (a pymongo command listener registered in each worker);
  ``raw_server_ops_per_msg``: the raw job's write statements, counted as it sends them;
  ``connector_server_ops_per_msg``: rows handed to the connector per message (it writes
  one replace per row; its JVM client cannot be observed from here).
"""

from __future__ import annotations

import argparse
import functools
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


# -- CPU and server operations of the Python workers -------------------------------------------

#: What each partition adds up (Spark accumulators, summed over tasks and workers).
FIGURES = ("cpu_ns", "handler_ns", "handler_calls", "rows", "writes", "reads")
#: CPU-ns per handler call the handler timer adds inside / outside the timed interval
#: (calibrated on the driver: same machine, same interpreter).
TIMER_NS = (0.0, 0.0)


def measured_write_partition(accs: tuple[Any, ...], task: Any, batches: Any) -> Any:
    """:func:`spark.executor.write_partition`, measured (runs in the Python worker)."""
    import measure

    from spark.executor import get_registry, write_partition

    state = measure.worker_state(get_registry(task.aggregates))
    timer, ops = state
    rows = 0

    def counted(it: Any) -> Any:
        nonlocal rows
        for b in it:
            rows += b.num_rows
            yield b

    h0, ops0, cpu0 = timer.snapshot(), ops.snapshot(), measure.process_cpu_s()
    try:
        yield from write_partition(task, counted(batches))
    finally:
        cpu = measure.process_cpu_s() - cpu0
        h, o = timer.snapshot(), ops.snapshot()
        for acc, value in zip(accs, (round(cpu * 1e9), h[0] - h0[0], h[1] - h0[1], rows,
                                     o[0] - ops0[0], o[1] - ops0[1]), strict=True):
            acc.add(value)


class Measured:
    """Accumulators of one pipeline run, and ``spark.pipeline.write_partition`` swapped for
    :func:`measured_write_partition` while it runs."""

    def __init__(self, spark: Any) -> None:
        self.accs = tuple(spark.sparkContext.accumulator(0) for _ in FIGURES)

    def __enter__(self) -> Measured:
        import spark.pipeline as sp

        if not hasattr(sp, "write_partition"):
            raise RuntimeError("spark.pipeline.write_partition is gone: update the bench")
        self._saved = sp.write_partition
        sp.write_partition = functools.partial(measured_write_partition, self.accs)
        return self

    def __exit__(self, *exc: object) -> None:
        import spark.pipeline as sp

        sp.write_partition = self._saved

    def figures(self) -> dict[str, Any]:
        v = dict(zip(FIGURES, (a.value for a in self.accs), strict=True))
        rows = max(1, v["rows"])
        inside, outside = TIMER_NS
        handler_ns = max(0.0, v["handler_ns"] - v["handler_calls"] * inside)
        python_ns = v["cpu_ns"] - v["handler_ns"] - v["handler_calls"] * outside
        return {"python_cpu_us_per_msg": round(python_ns / rows / 1e3, 2),
                "handler_cpu_us_per_msg": round(handler_ns / rows / 1e3, 2),
                "server_ops_per_msg": round((v["writes"] + v["reads"]) / rows, 4),
                "server_writes_per_msg": round(v["writes"] / rows, 4),
                "server_reads_per_msg": round(v["reads"] / rows, 4),
                "worker_cpu_s": round(v["cpu_ns"] / 1e9, 2), "rows": v["rows"]}


# -- scenarios ---------------------------------------------------------------------------------


def run_pipeline(spark: Any, uri: str, inputs: Path
                 ) -> tuple[float, dict[str, int], float, dict[str, Any]]:
    from aggregates.core.settings import AggboxSettings
    from spark.pipeline import Pipeline

    db = f"bench_{uuid.uuid4().hex[:8]}"
    settings = AggboxSettings.load(mongodb_uri=uri, database=db)
    pipeline = Pipeline(spark, aggregates=AGGREGATES, settings=settings, mongodb_uri=uri)
    pipeline.ensure_indexes()
    with RssSampler() as rss, Measured(spark) as measured:
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


def run_raw(spark: Any, uri: str, inputs: Path) -> tuple[float, int]:
    """Group by aggregate (last message wins), then blind bulk upserts of the documents.
    Also returns the write statements sent (counted by the partitions)."""
    from pyspark.sql import functions as F

    db = f"bench_{uuid.uuid4().hex[:8]}"
    writes = spark.sparkContext.accumulator(0)
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


def run_connector(spark: Any, uri: str, inputs: Path) -> tuple[float, int]:
    """One replace-with-upsert per message through the MongoDB Spark Connector. Also
    returns the rows handed to it (counted apart, untimed): one replace each."""
    from pyspark.sql import functions as F

    db = f"bench_{uuid.uuid4().hex[:8]}"
    frame = _messages(spark, inputs).select(F.col("aggregate_id").alias("_id"),
                                            F.col("payload").alias("state"))
    rows = int(frame.count())
    t0 = time.perf_counter()
    (frame
     .write.format("mongodb").mode("append")
     .option("connection.uri", uri).option("database", db).option("collection", "customers")
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

    # The workers import the project and bench/measure.py (the instruments).
    here = Path(__file__).resolve()
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(here.parents[1]), str(here.parent), os.environ.get("PYTHONPATH")]))
    global TIMER_NS
    from measure import calibrate_timer

    TIMER_NS = calibrate_timer()
    log(f"handler timer overhead per call: {TIMER_NS[0] / 1e3:.2f} µs inside, "
        f"{TIMER_NS[1] / 1e3:.2f} µs outside the timed interval (subtracted)")
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
            (row["uniform_s"], counts, row["rss_uniform_mb"],
             row["uniform_cpu"]) = run_pipeline(spark, mongo.uri, uniform)
            row["uniform_counts"] = counts
            log(f"{n}: pipeline skewed")
            (row["skewed_s"], counts, row["rss_skewed_mb"],
             row["skewed_cpu"]) = run_pipeline(spark, mongo.uri, skewed)
            row["skewed_counts"] = counts
            log(f"{n}: raw upsert")
            row["raw_s"], row["raw_writes"] = run_raw(spark, mongo.uri, uniform)
            row["connector_s"] = row["connector_rows"] = None
            if connector:
                log(f"{n}: connector")
                try:
                    row["connector_s"], row["connector_rows"] = run_connector(
                        spark, mongo.uri, uniform)
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
        print(f"{'':>10} uniform workers  {r['uniform_cpu']}")
        print(f"{'':>10} skewed workers   {r['skewed_cpu']}")
    big, small = rows[max(rows)], rows[min(rows)]
    result: dict[str, Any] = {
        "pipeline_vs_raw": round(big["raw_s"] / big["uniform_s"], 3),
        "pipeline_vs_connector": (round(big["connector_s"] / big["uniform_s"], 3)
                                  if big["connector_s"] else None),
        "python_cpu_us_per_msg": big["uniform_cpu"]["python_cpu_us_per_msg"],
        "handler_cpu_us_per_msg": big["uniform_cpu"]["handler_cpu_us_per_msg"],
        "server_ops_per_msg": big["uniform_cpu"]["server_ops_per_msg"],
        "raw_server_ops_per_msg": round(big["raw_writes"] / big["messages"], 4),
        "connector_server_ops_per_msg": (round(big["connector_rows"] / big["messages"], 4)
                                         if big["connector_rows"] is not None else None),
        "skewed_python_cpu_us_per_msg": big["skewed_cpu"]["python_cpu_us_per_msg"],
        "handler_timer_us_per_call": [round(TIMER_NS[0] / 1e3, 2), round(TIMER_NS[1] / 1e3, 2)],
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
