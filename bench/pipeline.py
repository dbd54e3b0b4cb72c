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
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pipeline_measure
from common import PidCpu, median
from pipeline_jobs import log, run_connector, run_pipeline, run_raw, start_spark, write_input
from pipeline_measure import Stages, print_stages


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
    from measure import calibrate_timer

    timer_ns = pipeline_measure.TIMER_NS = calibrate_timer()
    log(f"handler timer overhead per call: {timer_ns[0] / 1e3:.2f} µs inside, "
        f"{timer_ns[1] / 1e3:.2f} µs outside the timed interval (subtracted)")
    # No scenario reads a change stream: mongo-java-server runs without its oplog, which it
    # never trims (at 1e6 messages the four scenarios' oplog outgrew an 8 GB heap and the
    # server closed its connections mid-run).
    mongo = start_local_mongodb(java_options=("-Xmx8g",), oplog=False)
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

                for kind, inputs in (("uniform", uniform), ("skewed", skewed)):
                    log(f"{n} #{rep + 1}: pipeline {kind}")
                    with PidCpu(mongo.pid) as cpu:
                        (row[f"{kind}_s"], row[f"{kind}_counts"], row[f"rss_{kind}_mb"],
                         row[f"{kind}_cpu"]) = run_pipeline(spark, mongo.uri, inputs,
                                                            group(f"pipeline-{kind}"))
                    row[f"{kind}_server_cpu_s"] = cpu.seconds
                log(f"{n} #{rep + 1}: raw upsert")
                with PidCpu(mongo.pid) as cpu:
                    row["raw_s"], row["raw_writes"] = run_raw(spark, mongo.uri, uniform,
                                                              group("raw"))
                row["raw_server_cpu_s"] = cpu.seconds
                row["connector_s"] = row["connector_rows"] = None
                row["connector_server_cpu_s"] = None
                if connector:
                    log(f"{n} #{rep + 1}: connector")
                    try:
                        with PidCpu(mongo.pid) as cpu:
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
        "pipeline_vs_raw": median([x["raw_s"] / x["uniform_s"] for x in big_reps]),
        "pipeline_vs_connector": (median([x["connector_s"] / x["uniform_s"]
                                           for x in big_reps])
                                  if all(x["connector_s"] for x in big_reps) else None),
        "python_cpu_us_per_msg": big["uniform_cpu"]["python_cpu_us_per_msg"],
        "handler_cpu_us_per_msg": big["uniform_cpu"]["handler_cpu_us_per_msg"],
        "server_ops_per_msg": big["uniform_cpu"]["server_ops_per_msg"],
        "raw_server_ops_per_msg": round(big["raw_writes"] / big["messages"], 4),
        "connector_server_ops_per_msg": (round(big["connector_rows"] / big["messages"], 4)
                                         if big["connector_rows"] is not None else None),
        "skewed_python_cpu_us_per_msg": big["skewed_cpu"]["python_cpu_us_per_msg"],
        "handler_timer_us_per_call": [round(t / 1e3, 2) for t in pipeline_measure.TIMER_NS],
        "skew_vs_uniform": median([x["uniform_s"] / x["skewed_s"] for x in big_reps]),
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
        out[key] = median(values) if len(values) == len(reps) else None
    for key in ("uniform_cpu", "skewed_cpu"):
        out[key] = {k: (median([r[key][k] for r in reps])
                        if isinstance(reps[0][key][k], (int, float)) else reps[0][key][k])
                    for k in reps[0][key]}
    return out


if __name__ == "__main__":
    sys.exit(main())
