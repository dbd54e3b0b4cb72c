"""The Spark pipeline benchmark's instruments (bench/pipeline.py): peak RSS of the Python
workers, their CPU and server operations per partition (Spark accumulators around
:func:`spark.executor.write_partition`), and the jobs and stages of a scenario from the
driver UI's REST API (``--stages``)."""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

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
    from common import process_cpu_s

    from spark.executor import get_registry, write_partition

    state = measure.worker_state(get_registry(task.aggregates))
    timer, ops = state
    rows = 0

    def counted(it: Any) -> Any:
        nonlocal rows
        for b in it:
            rows += b.num_rows
            yield b

    h0, ops0, cpu0 = timer.snapshot(), ops.snapshot(), process_cpu_s()
    try:
        yield from write_partition(task, counted(batches))
    finally:
        cpu = process_cpu_s() - cpu0
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
