"""Instructions per message, counted by valgrind's callgrind: a load-independent measure
(issue 35). The CPU-µs figures of the other benches move by ±50 % with the machine's load;
an instruction count does not.

How: one process per suite (bench/instructions_writer.py, bench/instructions_dispatch.py)
runs under ``valgrind --tool=callgrind --dump-before=getppid``: every ``os.getppid()`` it
calls closes a part of the count (callgrind writes the instructions executed since the last
part). The process builds the inputs of every component (``n2`` messages), then runs each
component as a loop of its own, twice: over messages ``[0, n1)`` (warm-up: first calls,
caches, lazy imports) and over ``[n1, n2)``, a marker after each. So

    instructions per message = Ir of the loop over [n1, n2) / (n2 − n1)

which is (Ir(n2) − Ir(n1)) / (n2 − n1) of two runs over n2 and n1 messages, without paying
the interpreter's start and the set-up twice under valgrind (~50× slower than native). Ir is
callgrind's total of instructions executed by the process, all its threads. The MongoDB
server is another process: a component that talks to it counts the client's side only.
Repeatable: ``PYTHONHASHSEED=0``, pymongo's monitor polls once an hour (no heartbeat lands
inside a loop), the writer runs with ``pipeline_depth=1`` (no thread).

Used by ``bench/writer.py --instructions`` and ``bench/dispatch.py --instructions``; run
directly, it is the child::

    python bench/instructions.py child <suite> <n1> <n2> <component>...
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: The suites: the module of each (its COMPONENTS, setup(n_max, uri) and run(ctx, name, n)).
SUITES = {"writer": "instructions_writer", "dispatch": "instructions_dispatch"}


def callgrind_parts(suite: str, components: Sequence[str], n1: int, n2: int,
                    uri: str | None, work: Path) -> dict[str, int]:
    """One child run under callgrind: the instructions of each component's loop over
    messages [n1, n2)."""
    out = work / f"callgrind.{suite}.{time.monotonic_ns()}"
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    if uri:
        env["AGGBOX_BENCH_URI"] = uri
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
           "--dump-before=getppid", "--dump-instr=no", sys.executable,
           str(Path(__file__).resolve()), "child", suite, str(n1), str(n2), *components]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{suite}: exit {done.returncode}\n{done.stderr[-3000:]}")
    parts: dict[int, int] = {}
    for f in work.glob(out.name + ".*"):
        part = int(f.name.rsplit(".", 1)[1])
        for line in f.read_text().splitlines():
            if line.startswith("summary:"):
                parts[part] = int(line.split()[1])
        f.unlink()
    # Part 1: start and set-up; then per component: warm-up loop, measured loop.
    if len(parts) != 1 + 2 * len(components):
        raise RuntimeError(f"{suite}: {len(parts)} callgrind parts, expected "
                           f"{1 + 2 * len(components)} (a getppid call elsewhere?)")
    return {c: parts[3 + 2 * i] for i, c in enumerate(components)}


def measure(suite: str, *, n1: int, n2: int, repeat: int, uri: str | None,
            jobs: int = 2, only: Sequence[str] = ()) -> dict[str, Any]:
    """Every component of ``suite`` (or ``only``), counted ``repeat`` times (``jobs``
    processes at once: the counts do not depend on it); the figures of each repetition and
    the largest relative spread between them per component."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    module = importlib.import_module(SUITES[suite])
    components = [c for c in module.COMPONENTS if not only or c in only]
    print(f"callgrind, {suite}: {', '.join(components)}; loops over {n1} then {n2 - n1} "
          f"messages, {repeat} repetition(s), {jobs} at once", flush=True)
    work = Path(tempfile.mkdtemp(prefix="aggbox-callgrind-"))
    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            reps = list(pool.map(lambda _r: callgrind_parts(suite, components, n1, n2, uri,
                                                            work), range(repeat)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures = {c: [round(rep[c] / (n2 - n1)) for rep in reps] for c in components}
    spread = {c: round((max(v) - min(v)) / max(1, min(v)), 5) for c, v in figures.items()}
    derived = module.derived({c: v[0] for c, v in figures.items()})
    print(f"\n{'component':<14} {'instructions per message':>26}   what")
    for c in components:
        runs = " / ".join(f"{v:,}" for v in figures[c])
        print(f"{c:<14} {runs:>26}   {module.COMPONENTS[c]}")
    for name, value in derived.items():
        print(f"{name:<14} {value:>26,}   {module.DERIVED[name]}")
    return {"instructions_per_msg": {c: v[0] for c, v in figures.items()},
            "instructions_derived": derived, "instructions_runs": figures,
            "instructions_spread": spread, "n1": n1, "n2": n2, "repeat": repeat}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The ``--instructions`` options of bench/writer.py and bench/dispatch.py."""
    ap.add_argument("--instructions", action="store_true",
                    help="instead of the benchmark: instructions per message of each "
                         "component, counted with valgrind --tool=callgrind (bench/"
                         "instructions.py); last line JSON")
    ap.add_argument("--instr-sizes", default="2000,4000", metavar="N1,N2",
                    help="with --instructions: the two loop sizes (default 2000,4000)")
    ap.add_argument("--instr-repeat", type=int, default=1, metavar="R",
                    help="with --instructions: count everything R times (repeatability)")
    ap.add_argument("--instr-only", default="", metavar="A,B",
                    help="with --instructions: these components only")
    ap.add_argument("--instr-jobs", type=int, default=2, metavar="J",
                    help="with --instructions: callgrind runs at once (default 2)")


def from_arguments(suite: str, args: argparse.Namespace, uri: str | None) -> dict[str, Any]:
    """:func:`measure` with the options of :func:`add_arguments`; prints the JSON line."""
    n1, n2 = (int(float(x)) for x in args.instr_sizes.split(","))
    t = time.monotonic()
    result = measure(suite, n1=n1, n2=n2, repeat=args.instr_repeat, uri=uri,
                     jobs=args.instr_jobs, only=[c for c in args.instr_only.split(",") if c])
    result["callgrind_wall_s"] = round(time.monotonic() - t)
    print(json.dumps(result))
    return result


def child(argv: list[str]) -> None:
    suite, n1, n2, components = argv[0], int(argv[1]), int(argv[2]), argv[3:]
    sys.path.insert(0, str(HERE))
    module = importlib.import_module(SUITES[suite])
    ctx = module.setup(n2, os.environ.get("AGGBOX_BENCH_URI"), components)
    os.getppid()  # callgrind part: start and set-up
    for c in components:
        module.run(ctx, c, 0, n1)
        os.getppid()  # part: warm-up loop
        module.run(ctx, c, n1, n2)
        os.getppid()  # part: the measured loop
    module.teardown(ctx)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "child":
        child(sys.argv[2:])
    else:
        print(json.dumps(sorted(SUITES)))
        print(__doc__)
