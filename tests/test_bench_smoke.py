"""Every benchmark of ``bench/`` starts and prints its figures (issue 40: a benchmark that
cannot start backs no figure). Each script runs as ``python bench/<script>.py`` at its
smallest settings — a handful of messages, one repetition, the smallest loop sizes under
callgrind — and must exit 0 and print the figure lines it documents (its last line: the
figures as JSON, where it has one). The numbers themselves mean nothing at these sizes and
are not checked; that the code behind each figure runs is.

The scripts reach the suite's MongoDB through ``AGGBOX_MONGODB_URI`` (set by the
``mongo_server`` fixture); those that need more start it themselves, as they do when run by
hand: a Kafka broker (bench/dispatch.py), Spark ``local[2]`` and the MongoDB Spark Connector
(bench/pipeline.py), the persistent local server (bench/aging.py, bench/soak.py,
bench/h2_chunks.py), valgrind's callgrind (``--instructions``, bench/native.py). The modules
that are no script (the scenarios and instruments the scripts import) are imported.

About 4 minutes on a busy 2-core machine, most of it Spark, the Kafka broker and valgrind.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aggbox.servers import LocalMongo

pytestmark = [pytest.mark.mongo]

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"

#: script → (its smallest settings, the keys of its last JSON line that must hold a value).
#: A run whose last line is not JSON names what it must print instead (``lines``).
SMOKE: dict[str, list[tuple[list[str], dict[str, Any]]]] = {
    "writer.py": [
        (["--aggregates", "20", "--per", "2"],
         {"json": ["writer_vs_raw", "writer_vs_naive", "python_cpu_us_per_msg",
                   "server_ops_per_msg"]}),
        (["--tracing", "--aggregates", "20", "--per", "2"],
         {"json": ["tracing_messages_vs_off", "tracing_chunks_vs_off"]}),
        (["--instructions", "--instr-sizes", "5,10"],
         {"json": ["instructions_per_msg", "instructions_derived"]}),
    ],
    "dispatch.py": [
        (["--docs", "5", "--per", "2", "--rate", "50", "--seconds", "1", "--warmup", "0.2",
          "--scale-docs", "5", "--scale-per", "2"],
         {"json": ["dispatch_vs_raw_produce", "latency_p50_ms", "poll_latency_p50_ms",
                   "python_cpu_us_per_msg", "scale_2_vs_1"]}),
        (["--instructions", "--instr-sizes", "2,4"],
         {"json": ["instructions_per_msg", "instructions_derived"]}),
        # Its own local server (no AGGBOX_MONGODB_URI): the server's CPU is measured by pid.
        (["--server", "local", "--repeat", "2", "--only", "stream", "--rate", "50",
          "--seconds", "1", "--warmup", "0"],
         {"json": ["latency_p50_ms", "mongo_cpu_us_per_entry_stream"], "own_server": True}),
    ],
    "pipeline.py": [
        (["--sizes", "100", "--stages"],
         {"json": ["pipeline_vs_raw", "pipeline_vs_connector", "skew_vs_uniform",
                   "python_cpu_us_per_msg"]}),
    ],
    "inbox.py": [
        (["--aggregates", "10", "--per", "4", "--slice", "2"],
         {"json": ["narrow_vs_wide_first", "narrow_vs_wide_redelivery"]}),
    ],
    "executor.py": [
        (["--rows", "200", "--repeat", "1"],
         {"json": ["executor_cpu_us_per_msg", "parse_cpu_us_per_msg"]}),
    ],
    "timers.py": [
        (["--rate", "20", "--seconds", "1", "--warmup", "0", "--delay-ms", "100",
          "--drain-seconds", "30", "--json"],
         {"json": ["scheduled", "fired", "lost", "lag"]}),
        (["--drain", "30", "--json"], {"json": ["fired_per_s", "lost", "duplicates"]}),
    ],
    "native.py": [
        (["--sizes", "5,10", "--timed-n", "50"], {"json": ["instructions_per_msg", "wall"]}),
    ],
    "aging.py": [
        (["--rounds", "2", "--orders", "3", "--idle", "1", "--timeout", "120"],
         {"json": ["oplog_after_aging", "publish_all_s", "idle_oplog_entries"]}),
    ],
    "soak.py": [
        (["--writes", "20", "--cycles", "1", "--docs", "5", "--batch", "5", "--probe-rate",
          "10", "--probe-seconds", "0.5"],
         {"json": ["writes", "intact", "latency_p50_ms_start", "latency_p50_ms_end"]}),
    ],
    "faultcheck.py": [
        (["--smoke", "--json"], {"json": ["smoke"]}),
    ],
    "cli_start.py": [
        (["--smoke"], {"json": ["version_s", "help_s", "unreachable_s"]}),
    ],
    "h2_chunks.py": [
        (["--minutes", "0.03", "--writers", "1", "--interval", "1"],
         {"lines": [" s  oplog ", "result: "]}),
        (["--bare", "--minutes", "0.03"], {"lines": ["guard=false: ", "full scans"]}),
    ],
}
#: Scripts run by another one: bench/instructions.py is the callgrind child of
#: ``--instructions`` (bench/writer.py, bench/dispatch.py).
RUN_BY_OTHERS = {"instructions.py"}

CASES = [pytest.param(script, argv, expect, id=f"{script[:-3]}-{i}")
         for script, runs in SMOKE.items() for i, (argv, expect) in enumerate(runs)]


def _is_script(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
               for node in tree.body)


def test_every_script_has_a_smoke_run() -> None:
    scripts = {p.name for p in BENCH.glob("*.py") if _is_script(p)}
    assert scripts - RUN_BY_OTHERS == set(SMOKE), "give each bench script a smoke run here"


def test_every_module_imports() -> None:
    """The scenario and instrument modules too (``bench/`` first on the path, as when a
    script runs)."""
    names = sorted(p.stem for p in BENCH.glob("*.py"))
    probe = ("import importlib, sys\nsys.path.insert(0, sys.argv[1])\n"
             "for name in sys.argv[2:]:\n    importlib.import_module(name)\n")
    done = subprocess.run([sys.executable, "-c", probe, str(BENCH), *names],
                          capture_output=True, text=True, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize(("script", "argv", "expect"), CASES)
def test_bench_script_runs_at_its_smallest_settings(
        script: str, argv: list[str], expect: dict[str, Any], mongo_server: LocalMongo,
        tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path), "AGGBOX_HOME": str(tmp_path / "home")}
    if not expect.get("own_server"):
        env["AGGBOX_MONGODB_URI"] = mongo_server.uri
    else:
        env.pop("AGGBOX_MONGODB_URI", None)
    done = subprocess.run([sys.executable, str(BENCH / script), *argv], capture_output=True,
                          text=True, cwd=tmp_path, env=env, check=False)
    shown = f"{script} {' '.join(argv)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, shown
    lines = done.stdout.strip().splitlines()
    assert lines, shown
    for key in expect.get("json", []):
        figures = json.loads(lines[-1])
        assert figures.get(key) is not None, f"no {key!r} in the last line of {shown}"
    for text in expect.get("lines", []):
        assert any(text in line for line in lines), f"no line with {text!r} in {shown}"
