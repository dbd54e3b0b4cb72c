"""Benchmark of the Spark pipeline on ``local[2]`` against the local MongoDB server.

Scenarios per input size (messages):

(a) uniform  — the pipeline, ≈ 5 messages per aggregate;
(b) skewed   — the pipeline, one aggregate gets 50 % of the messages;
(c) raw      — the same final documents written by a blind Spark job: group by aggregate,
               one unconditional bulk upsert per document (no read, no version, no dedup);
(d) connector — the MongoDB Spark Connector writing one document per message (replace with
               upsert by aggregate id: a peer with no idempotency and no ordering).

The pipeline runs as ``aggbox run`` runs it: ``Pipeline(..., keep_outcomes=False)``, the
counts only (no outcome DataFrame kept, no audit log).

Messages are ``CustomerRegistered`` for ``aggbox.examples.orders`` (no emits, so the outbox stays
empty). Peak RSS of the Python workers is sampled from /proc while the pipeline runs.

    .venv/bin/python bench/pipeline.py [--sizes 1e5,1e6] [--quick] [--no-connector]
                                       [--stages] [--repeat N]

``--stages`` turns the driver UI on and prints, for the first repetition of every scenario,
its jobs and stages from the UI's REST API: wall time per job and stage, task time and CPU
summed over the stage's tasks, records in (input, shuffle read) and out (output, shuffle
write), shuffle bytes; and the scenario's wall time outside any job (the driver's own).
``--repeat N`` runs each scenario N times (interleaved, same session): times are medians,
the ratios medians of the per-repetition ratios (the machine is shared: ratios within one
repetition are steadier than absolute times).

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
import contextlib
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


# -- per-stage breakdown (--stages): Spark's REST API of the driver UI --------------------------


class Stages:
    """Jobs and stages of one scenario, read from the driver UI's REST API
    (``/api/v1/applications/<id>/jobs`` and ``/stages``): the scenario runs under its own job
    group, and its jobs are those of that group (a SparkListener cannot be registered from
    Python)."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        sc = spark.sparkContext
        self.base = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}"

    def _get(self, path: str) -> Any:
        import urllib.request

        with urllib.request.urlopen(self.base + path, timeout=30) as r:
            return json.loads(r.read())

    def table(self, group: str) -> list[dict[str, Any]]:
        """One row per job of ``group`` and one per stage of it (the listener bus is
        asynchronous: waits until every job of the group has ended)."""
        for _ in range(50):
            jobs = [j for j in self._get("/jobs") if j.get("jobGroup") == group]
            if jobs and all(j["status"] != "RUNNING" for j in jobs):
                break
            time.sleep(0.2)
        stages = {(s["stageId"], s["attemptId"]): s for s in self._get("/stages")}
        out: list[dict[str, Any]] = []
        for j in sorted(jobs, key=lambda j: j["jobId"]):
            out.append({"kind": "job", "id": j["jobId"], "name": _short(j.get("name", "")),
                        "wall_s": _span(j.get("submissionTime"), j.get("completionTime")),
                        "stages": j["stageIds"], "skipped": j.get("numSkippedStages", 0)})
            for sid in sorted(j["stageIds"]):
                s = next((v for (i, _a), v in sorted(stages.items()) if i == sid), None)
                if s is None or s.get("status") == "SKIPPED":
                    continue
                out.append({
                    "kind": "stage", "id": sid, "name": _short(s.get("name", "")),
                    "tasks": s.get("numTasks"),
                    "wall_s": _span(s.get("submissionTime"), s.get("completionTime")),
                    "task_s": round(s.get("executorRunTime", 0) / 1e3, 2),
                    "cpu_s": round(s.get("executorCpuTime", 0) / 1e9, 2),
                    "in_records": s.get("inputRecords", 0),
                    "shuffle_read_records": s.get("shuffleReadRecords", 0),
                    "out_records": s.get("outputRecords", 0),
                    "shuffle_write_records": s.get("shuffleWriteRecords", 0),
                    "shuffle_read_mb": round(s.get("shuffleReadBytes", 0) / 2**20, 2),
                    "shuffle_write_mb": round(s.get("shuffleWriteBytes", 0) / 2**20, 2),
                })
        return out


def _span(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    fmt = "%Y-%m-%dT%H:%M:%S.%f%Z"
    return round((datetime.strptime(end, fmt) - datetime.strptime(start, fmt)).total_seconds(),
                 2)


def _short(name: str) -> str:
    return name.split(" at ")[0][:40]


def print_stages(title: str, wall_s: float, rows: list[dict[str, Any]]) -> None:
    jobs_s = sum(r["wall_s"] or 0 for r in rows if r["kind"] == "job")
    njobs = sum(r["kind"] == "job" for r in rows)
    print(f"\n{title}: {wall_s:.2f} s wall, {jobs_s:.2f} s in {njobs} job(s), "
          f"{wall_s - jobs_s:.2f} s outside jobs (driver)")
    print(f"  {'':5} {'id':>4} {'name':<40} {'tasks':>5} {'wall s':>7} {'task s':>7} "
          f"{'cpu s':>6} {'in rec':>8} {'shr rec':>8} {'out rec':>8} {'shw rec':>8} "
          f"{'shr MB':>7} {'shw MB':>7}")
    for r in rows:
        if r["kind"] == "job":
            print(f"  job   {r['id']:>4} {r['name']:<40} {'':>5} {r['wall_s'] or 0:>7.2f}"
                  f"   stages {r['stages']} ({r['skipped']} skipped)")
        else:
            print(f"  stage {r['id']:>4} {r['name']:<40} {r['tasks']:>5} {r['wall_s'] or 0:>7.2f} "
                  f"{r['task_s']:>7.2f} {r['cpu_s']:>6.2f} {r['in_records']:>8} "
                  f"{r['shuffle_read_records']:>8} {r['out_records']:>8} "
                  f"{r['shuffle_write_records']:>8} {r['shuffle_read_mb']:>7.2f} "
                  f"{r['shuffle_write_mb']:>7.2f}")


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


# -- main --------------------------------------------------------------------------------------


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1e5,1e6",
                        help="comma-separated input sizes in messages (default: 1e5,1e6)")
    parser.add_argument("--quick", action="store_true",
                        help="a small run (sizes 2e4,1e5) to check the script works")
    parser.add_argument("--no-connector", action="store_true",
                        help="skip scenario (d), the MongoDB Spark Connector")
    parser.add_argument("--stages", action="store_true",
                        help="print the jobs and stages of each scenario (first repetition) "
                             "from the driver UI's REST API")
    parser.add_argument("--cluster", action="store_true",
                        help="run on a standalone cluster (a master and 2 workers of 1 core "
                             "on loopback, started from the installed PySpark) instead of "
                             "local[2]")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run every scenario this many times per size (interleaved); "
                             "figures are medians, ratios medians of the per-repetition ratios")
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
    with contextlib.ExitStack() as stack:
        master = "local[2]"
        if args.cluster:
            # The test suite's launcher (tests/spark/servers.py): master + 2 workers.
            sys.path.insert(0, str(here.parents[1]))
            from tests.spark.servers import standalone_cluster

            cluster = stack.enter_context(standalone_cluster(
                Path(tempfile.mkdtemp(prefix="aggbox-bench-cluster-")), workers=2,
                worker_memory="1500m", pythonpath=[str(here.parents[1]), str(here.parent)]))
            master = cluster.master
            log(f"standalone cluster: {master}")
        return _run(args, sizes, mongo, master)


def _run(args: Any, sizes: list[int], mongo: Any, master: str) -> int:
    spark, connector, connector_problem = start_spark(not args.no_connector, ui=args.stages,
                                                      master=master)
    spark.sparkContext.setLogLevel("ERROR")
    stages = Stages(spark) if args.stages else None
    work = Path(tempfile.mkdtemp(prefix="aggbox-bench-"))
    rows: dict[int, dict[str, Any]] = {}
    reps: dict[int, list[dict[str, Any]]] = {}
    tables: list[tuple[str, float, list[dict[str, Any]]]] = []
    try:
        warm = write_input(work / "warm", 2000, skewed=False)
        run_pipeline(spark, mongo.uri, warm)  # Python workers started, modules imported
        for n in sizes:
            log(f"generating {n} messages")
            uniform = write_input(work / f"u{n}", n, skewed=False)
            skewed = write_input(work / f"s{n}", n, skewed=True)
            reps[n] = []
            for rep in range(args.repeat):
                row: dict[str, Any] = {"messages": n}

                def group(name: str, rep: int = rep, n: int = n) -> str | None:
                    return f"{name}-{n}" if stages is not None and rep == 0 else None

                log(f"{n} #{rep + 1}: pipeline uniform")
                with ServerCpu(mongo.pid) as cpu:
                    (row["uniform_s"], counts, row["rss_uniform_mb"],
                     row["uniform_cpu"]) = run_pipeline(spark, mongo.uri, uniform,
                                                        group("pipeline-uniform"))
                row["uniform_server_cpu_s"] = cpu.seconds
                row["uniform_counts"] = counts
                log(f"{n} #{rep + 1}: pipeline skewed")
                with ServerCpu(mongo.pid) as cpu:
                    (row["skewed_s"], counts, row["rss_skewed_mb"],
                     row["skewed_cpu"]) = run_pipeline(spark, mongo.uri, skewed,
                                                       group("pipeline-skewed"))
                row["skewed_server_cpu_s"] = cpu.seconds
                row["skewed_counts"] = counts
                log(f"{n} #{rep + 1}: raw upsert")
                with ServerCpu(mongo.pid) as cpu:
                    row["raw_s"], row["raw_writes"] = run_raw(spark, mongo.uri, uniform,
                                                              group("raw"))
                row["raw_server_cpu_s"] = cpu.seconds
                row["connector_s"] = row["connector_rows"] = None
                row["connector_server_cpu_s"] = None
                if connector:
                    log(f"{n} #{rep + 1}: connector")
                    try:
                        with ServerCpu(mongo.pid) as cpu:
                            row["connector_s"], row["connector_rows"] = run_connector(
                                spark, mongo.uri, uniform, group("connector"))
                        row["connector_server_cpu_s"] = cpu.seconds
                    except Exception as exc:
                        connector_problem = (f"{connector} failed: "
                                             f"{str(exc).splitlines()[0][:300]}")
                        log(connector_problem)
                        connector = None
                if stages is not None and rep == 0:
                    for name, key in (("pipeline-uniform", "uniform_s"),
                                      ("pipeline-skewed", "skewed_s"), ("raw", "raw_s"),
                                      ("connector", "connector_s")):
                        if row[key] is not None:
                            tables.append((f"{name} {n}", row[key],
                                           stages.table(f"{name}-{n}")))
                reps[n].append(row)
            rows[n] = _median_row(reps[n])
            shutil.rmtree(uniform)
            shutil.rmtree(skewed)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()
        mongo.stop()

    for title, wall, table in tables:
        print_stages(title, wall, table)
    if tables:
        print()
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
        print(f"{'':>10} MongoDB server CPU s (uniform, skewed, raw, connector): "
              f"{r['uniform_server_cpu_s']}, {r['skewed_server_cpu_s']}, "
              f"{r['raw_server_cpu_s']}, {r['connector_server_cpu_s']}")
        if len(reps[n]) > 1:
            print(f"{'':>10} per repetition (uniform, skewed, raw, connector s): " + "; ".join(
                f"{x['uniform_s']:.2f}, {x['skewed_s']:.2f}, {x['raw_s']:.2f}, "
                + (f"{x['connector_s']:.2f}" if x["connector_s"] else "n/a") for x in reps[n]))
    big, small = rows[max(rows)], rows[min(rows)]
    big_reps = reps[max(rows)]
    result: dict[str, Any] = {
        "pipeline_vs_raw": _median([x["raw_s"] / x["uniform_s"] for x in big_reps]),
        "pipeline_vs_connector": (_median([x["connector_s"] / x["uniform_s"]
                                           for x in big_reps])
                                  if all(x["connector_s"] for x in big_reps) else None),
        "python_cpu_us_per_msg": big["uniform_cpu"]["python_cpu_us_per_msg"],
        "handler_cpu_us_per_msg": big["uniform_cpu"]["handler_cpu_us_per_msg"],
        "server_ops_per_msg": big["uniform_cpu"]["server_ops_per_msg"],
        "raw_server_ops_per_msg": round(big["raw_writes"] / big["messages"], 4),
        "connector_server_ops_per_msg": (round(big["connector_rows"] / big["messages"], 4)
                                         if big["connector_rows"] is not None else None),
        "skewed_python_cpu_us_per_msg": big["skewed_cpu"]["python_cpu_us_per_msg"],
        "handler_timer_us_per_call": [round(TIMER_NS[0] / 1e3, 2), round(TIMER_NS[1] / 1e3, 2)],
        "skew_vs_uniform": _median([x["uniform_s"] / x["skewed_s"] for x in big_reps]),
        "per_msg_growth_1e5_to_1e6": round(
            (big["uniform_s"] / big["messages"]) / (small["uniform_s"] / small["messages"]), 3),
        "worker_peak_rss_mb": round(max(max(r["rss_uniform_mb"], r["rss_skewed_mb"])
                                        for r in rows.values()), 1),
        "worker_peak_rss_mb_by_size": {str(n): round(max(r["rss_uniform_mb"],
                                                         r["rss_skewed_mb"]), 1)
                                       for n, r in rows.items()},
        "sizes": list(rows),
        "repeat": args.repeat,
        "seconds": {str(n): {k: r[k] for k in ("uniform_s", "skewed_s", "raw_s", "connector_s")}
                    for n, r in rows.items()},
        # CPU seconds the MongoDB server used during each scenario (it shares the cores).
        "server_cpu_s": {str(n): {k: r[k] for k in (
            "uniform_server_cpu_s", "skewed_server_cpu_s", "raw_server_cpu_s",
            "connector_server_cpu_s")} for n, r in rows.items()},
        "connector": connector,
        # On success: the newer versions that could not be resolved (None if none).
        "connector_problem": connector_problem,
        "mongodb": mongo.kind,
        "master": master,
    }
    print(json.dumps(result))
    return 0


def process_cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) a process used so far, from /proc (0 if unknown)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ServerCpu:
    """The MongoDB server's CPU seconds over a ``with`` block (``.seconds``)."""

    def __init__(self, pid: int | None) -> None:
        self.pid, self.seconds = pid, 0.0

    def __enter__(self) -> ServerCpu:
        self._start = process_cpu_s(self.pid)
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = round(process_cpu_s(self.pid) - self._start, 2)


def _median(values: list[float]) -> float:
    import statistics

    return round(statistics.median(values), 3)


def _median_row(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """The repetitions of one size as one row: seconds, RSS and worker figures are medians
    (of each figure on its own); outcome counts are the first repetition's."""
    if len(reps) == 1:
        return reps[0]
    out = dict(reps[0])
    for key in ("uniform_s", "skewed_s", "raw_s", "connector_s", "rss_uniform_mb",
                "rss_skewed_mb", "raw_writes", "connector_rows", "uniform_server_cpu_s",
                "skewed_server_cpu_s", "raw_server_cpu_s", "connector_server_cpu_s"):
        values = [r[key] for r in reps if r[key] is not None]
        out[key] = _median(values) if len(values) == len(reps) else None
    for key in ("uniform_cpu", "skewed_cpu"):
        out[key] = {k: (_median([r[key][k] for r in reps])
                        if isinstance(reps[0][key][k], (int, float)) else reps[0][key][k])
                    for k in reps[0][key]}
    return out


if __name__ == "__main__":
    sys.exit(main())
