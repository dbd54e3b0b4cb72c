"""Dispatcher benchmark: local MongoDB (or AGGBOX_MONGODB_URI) and a local Kafka broker,
one run.

(a) dispatcher throughput: N documents × k pending entries (written by the StoreWriter),
    drained to Kafka by ``Dispatcher.run(once=True)`` in this process;
(b) raw confluent-kafka produce of the same records (same value, key, headers, producer
    settings: idempotent, acks=all) from one process — the floor;
(c) commit → publish latency at a steady rate (default 1,000 entries/s, after ``--warmup``
    seconds of it that are not counted), the dispatcher running as its own process
    (``python -m aggbox.commands.dispatch``) with default settings, in stream mode and in
    polling mode. "Publish" is the broker's LogAppendTime of
    the record; "commit" the entry's ``created_at`` (taken by the writer just before its write).
(d) scale-out: the same backlog (``--scale-docs`` × ``--scale-per`` entries, written by the
    StoreWriter) drained by ONE dispatcher process, then — on a fresh server, database and
    topic — by TWO processes (default settings but ``--instance-id``, ``--lease-ttl 30``, the
    publisher and topic). The processes are started on an empty collection first; only when
    the partition leases are split evenly (1: 256, 2: 128 each, read from
    ``aggbox_dispatcher_partitions``) and a warm-up backlog (a quarter of the size) is drained
    are they frozen (SIGSTOP), the backlog written, and released (SIGCONT): the clock runs
    from the release to the broker LogAppendTime of the last record, so neither the
    hand-over nor the write is timed. CPU seconds (``/proc/<pid>/stat`` utime+stime) of each
    instance, of the MongoDB server, of the Kafka broker and of this process are taken over
    release → outbox empty: on a 2-core machine the ratio is bounded by CPU, not by the
    dispatcher's design; these show where the time goes. ``--skip-scale`` leaves (d) out.

Last line of output is JSON: ``dispatch_vs_raw_produce`` (throughput (a)/(b)),
``latency_p50_ms``, ``latency_p99_ms`` (stream mode), ``poll_latency_p50_ms``,
``poll_latency_p99_ms``, ``python_cpu_us_per_msg`` (CPU-µs per entry of this process —
Python and librdkafka's threads, from getrusage — during (a); ``raw_produce_cpu_us_per_msg``
the same for (b)), ``scale_2_vs_1`` (entries/s of (d) with 2 instances ÷ with 1),
``scale_entries_per_s_1``, ``scale_entries_per_s_2``, ``scale_cpu_s_per_instance`` (CPU
seconds of each of the 2 instances during (d)), and the raw figures.

``--server memory`` (default) runs each phase on its own throw-away mongo-java-server,
``--server local`` on the persistent local server of ``aggbox local start`` (H2, aggbox's
bounded oplog; in a temporary ``AGGBOX_HOME``), either unless ``AGGBOX_MONGODB_URI`` is set.
``--repeat N`` runs (a) and (c) N times, (c) alternating stream and polling mode, and reports
the medians (each run is printed; ``runs`` in the JSON holds them all). (c) also reports the
server's CPU per entry (``mongo_cpu_us_per_entry``: the writer's writes, the same in both
modes, plus what the dispatcher asks of the server) and the dispatcher's.

Usage: python bench/dispatch.py [--docs 2000] [--per 10] [--rate 1000] [--seconds 8]
       [--scale-docs 2000] [--scale-per 10] [--skip-scale] [--server memory|local]
       [--repeat 1]
       python bench/dispatch.py --only formats [--docs 2000] [--per 10]
           # (a) with record_format aggbox and cloudevents, alternating, twice each
       python bench/dispatch.py --instructions [--instr-sizes 2000,4000] [--instr-repeat 2]
           # instructions per outbox entry of the record building (BSON decode of the
           # documents, build_record, the envelope JSON), counted with valgrind's
           # callgrind (bench/instructions.py); no server or broker needed
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import uuid
from pathlib import Path
from typing import Any

import instructions
from dispatch_common import local_mongo
from dispatch_latency import latency
from dispatch_scale import scale
from dispatch_throughput import throughput, warm_up

from aggbox.servers import start_local_kafka


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--per", type=int, default=10)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--warmup", type=float, default=3.0,
                    help="(c): seconds of the steady load before the measured ones")
    ap.add_argument("--scale-docs", type=int, default=2000, help="(d): documents")
    ap.add_argument("--scale-per", type=int, default=10, help="(d): entries per document")
    ap.add_argument("--skip-scale", action="store_true", help="leave (d) out")
    ap.add_argument("--server", choices=["memory", "local"], default="memory",
                    help="memory: a throw-away mongo-java-server per phase; local: the "
                    "persistent local server (aggbox local start) per phase")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs of (a) and of (c) (alternating modes); medians reported")
    ap.add_argument("--only", choices=["throughput", "stream", "poll", "scale", "formats"],
                    default=None,
                    help="run one phase only (for profiling); formats: (a) in the aggbox "
                    "record format and as CloudEvents, twice each, alternating — "
                    "cloudevents_vs_aggbox_cpu is the ratio of the best CPU-µs per entry")
    instructions.add_arguments(ap)
    args = ap.parse_args()
    if args.instructions:
        instructions.from_arguments("dispatch", args, None)
        return
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"aggbox-bench-{uuid.uuid4().hex[:6]}"
    tmp.mkdir(parents=True)
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs")
    nothing: dict[str, Any] = {}
    tp, stream, poll, sc = nothing, nothing, nothing, nothing
    runs: dict[str, list[dict[str, Any]]] = {"throughput": [], "stream": [], "poll": []}
    with start_local_kafka() as kafka:
        warm_up(kafka.bootstrap_servers)
        if args.only == "formats":
            formats(args, kafka)
            return
        for _ in range(max(1, args.repeat)):
            if args.only in (None, "throughput"):
                with local_mongo(args.server) as mongo:
                    print(f"mongo: {mongo.kind}, kafka {kafka.bootstrap_servers}")
                    runs["throughput"].append(throughput(mongo, kafka, args.docs, args.per))
            for mode in ("stream", "poll"):
                if args.only in (None, mode):
                    with local_mongo(args.server) as mongo:
                        runs[mode].append(latency(mongo, kafka, mode, args.rate,
                                                  args.seconds, tmp, args.warmup))
        tp, stream, poll = (median_run(runs[k]) for k in ("throughput", "stream", "poll"))
        if args.only == "scale" or (args.only is None and not args.skip_scale):
            sc = scale(kafka, args.scale_docs, args.scale_per, tmp)
    print(f"dispatcher logs: {tmp}")
    result = {
        "dispatch_vs_raw_produce": tp.get("dispatch_vs_raw_produce"),
        "latency_p50_ms": stream.get("p50_ms"),
        "latency_p99_ms": stream.get("p99_ms"),
        "poll_latency_p50_ms": poll.get("p50_ms"),
        "poll_latency_p99_ms": poll.get("p99_ms"),
        "python_cpu_us_per_msg": tp.get("python_cpu_us_per_msg"),
        "scale_2_vs_1": sc.get("scale_2_vs_1"),
        "scale_entries_per_s_1": sc.get("one", {}).get("entries_per_s"),
        "scale_entries_per_s_2": sc.get("two", {}).get("entries_per_s"),
        "scale_cpu_s_per_instance": sc.get("two", {}).get("cpu_s_per_instance"),
        "mongo_cpu_us_per_entry_stream": stream.get("mongo_cpu_us_per_entry"),
        "mongo_cpu_us_per_entry_poll": poll.get("mongo_cpu_us_per_entry"),
        "server": args.server, "repeat": max(1, args.repeat),
        "throughput": tp, "stream": stream, "poll": poll, "scale": sc,
        "runs": runs if args.repeat > 1 else None,
    }
    print(json.dumps(result))


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each numeric figure over ``runs`` (the one run's figures when one)."""
    if len(runs) <= 1:
        return runs[0] if runs else {}
    out: dict[str, Any] = {}
    for key, value in runs[0].items():
        values = [r.get(key) for r in runs]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[key] = statistics.median(values)  # type: ignore[type-var]
        else:
            out[key] = value
    return out


def formats(args: argparse.Namespace, kafka: Any) -> None:
    """(a) with record_format aggbox and cloudevents, alternating, twice each."""
    runs: dict[str, list[dict[str, Any]]] = {"aggbox": [], "cloudevents": []}
    with local_mongo(args.server) as mongo:
        for _ in range(2):
            for fmt in runs:
                runs[fmt].append(throughput(mongo, kafka, args.docs, args.per, fmt))
    cpu = {f: min(r["python_cpu_us_per_msg"] for r in v) for f, v in runs.items()}
    rate = {f: max(r["dispatch_per_s"] for r in v) for f, v in runs.items()}
    print(json.dumps({"cloudevents_vs_aggbox_cpu": round(cpu["cloudevents"] / cpu["aggbox"], 3),
                      "cloudevents_vs_aggbox_rate": round(rate["cloudevents"]
                                                          / rate["aggbox"], 3),
                      "cpu_us_per_entry": cpu, "entries_per_s": rate}))


if __name__ == "__main__":
    main()
