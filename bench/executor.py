"""The executor's own CPU per message, in process (no Spark, no MongoDB): the pipeline's
``mapInArrow`` partition function (:class:`spark.executor._Partition`) over Arrow batches
of validated rows like ``bench/pipeline.py``'s (``CustomerRegistered``, ≈ 5 messages per
aggregate, ``occurred_at`` with 6 fraction digits), with the store writer replaced by a stub
that returns one ``applied`` outcome per message. What is measured is what the executor
adds around the writer: Arrow → Python, JSON parse, envelope checks, carry-over, outcome
batches.

    .venv/bin/python bench/executor.py [--rows 20000] [--repeat 5] [--ref REV]

``--ref REV`` also measures ``spark/executor.py`` as of git revision ``REV`` (loaded from
``git show``; the rest of the tree is the working tree's), interleaved with the working
tree's, for a before/after pair on a busy machine. Prints per-stage CPU-µs per message
(``time.process_time``, best of ``--repeat``), then one JSON line.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def batches(n: int, size: int = 10_000) -> list[Any]:
    import pyarrow as pa

    base = datetime(2026, 1, 1, tzinfo=UTC)
    names = ("_raw", "_reason", "_detail", "_mid", "_atype", "_aid")
    cols: dict[str, list[Any]] = {k: [] for k in names}
    for i in range(n):
        aid = f"c{(i * 7919) % max(1, n // 5)}"
        at = (base + timedelta(milliseconds=i)).isoformat().replace("+00:00", "Z")
        line = (f'{{"message_id":"m{i}","type":"CustomerRegistered","aggregate_type":'
                f'"Customer","aggregate_id":"{aid}","payload":{{"name":"n{i}",'
                f'"credit_limit":{i % 1000}}},"occurred_at":"{at}"}}')
        for k, v in zip(names, (line, None, None, f"m{i}", "Customer", aid), strict=True):
            cols[k].append(v)
    full = pa.RecordBatch.from_arrays([pa.array(v, type=pa.string()) for v in cols.values()],
                                      names=list(names))
    return [full.slice(i, size) for i in range(0, n, size)]


def load_executor(ref: str | None) -> Any:
    if ref is None:
        import spark.executor

        return spark.executor
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:spark/executor.py"],
                            check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "executor_at_ref.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("executor_at_ref", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["executor_at_ref"] = module
    spec.loader.exec_module(module)
    return module


def partition_class(module: Any) -> Any:
    from aggregates.core.settings import AggboxSettings
    from aggregates.message.outcomes import Outcome

    settings = AggboxSettings.model_construct(**AggboxSettings.load().model_dump())

    class StubWriter:
        def process(self, messages: list[Any]) -> list[Outcome]:
            return [Outcome(m.message_id, m.aggregate_type, m.aggregate_id, "applied")
                    for m in messages]

    class Partition(module._Partition):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:  # no client, no registry: the writer is a stub
            self.settings = settings
            self.writer = StubWriter()
            self.dead_store = None
            self.carry_over_max = 5_000
            self.task_attempt = 0
            self.carry = []

    return Partition


def _arrow(p: Any, written: Any) -> Any:
    """The outcome batch of what ``p.write`` returned, for the executor of any revision:
    outcomes (before 62b9a65) or (outcomes, message types); ``to_arrow`` takes the types
    since then."""
    outcomes, types = written if isinstance(written, tuple) else (written, {})
    if len(inspect.signature(p.to_arrow).parameters) >= 2:
        return p.to_arrow(outcomes, types)
    return p.to_arrow(outcomes)


def run(partition: Any, data: list[Any]) -> tuple[float, float, float, float]:
    """CPU seconds: total, parse, writer stub (+ carry-over), outcome batches."""
    clock = time.process_time
    p = partition()
    parse = write = arrow = 0.0
    rows = 0
    t_start = clock()
    for b in data:
        t0 = clock()
        messages, dead = p.parse(b)
        t1 = clock()
        written = p.write(p.take(messages, final=False), dead)
        t2 = clock()
        rows += _arrow(p, written).num_rows
        t3 = clock()
        parse, write, arrow = parse + t1 - t0, write + t2 - t1, arrow + t3 - t2
    if p.carry:
        rows += _arrow(p, p.write(p.take([], final=True), [])).num_rows
    total = clock() - t_start
    if rows != sum(b.num_rows for b in data):
        raise RuntimeError(f"{rows} outcomes for {sum(b.num_rows for b in data)} rows")
    return total, parse, write, arrow


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--ref", help="also measure spark/executor.py at this git revision")
    args = parser.parse_args()
    data = batches(args.rows)
    variants = {"tree": partition_class(load_executor(None))}
    if args.ref:
        variants[args.ref] = partition_class(load_executor(args.ref))
    for cls in variants.values():
        run(cls, data)  # warm up
    best: dict[str, tuple[float, ...]] = {}
    for _ in range(args.repeat):
        for name, cls in variants.items():
            figures = tuple(x / args.rows * 1e6 for x in run(cls, data))
            best[name] = min(best.get(name, figures), figures)
    result: dict[str, Any] = {"rows": args.rows}
    for name, (total, parse, write, arrow) in best.items():
        print(f"{name:>10}: executor {total:.2f} CPU-µs/msg (parse {parse:.2f}, stub writer + "
              f"carry-over {write:.2f}, outcome batches {arrow:.2f})")
        key = "" if name == "tree" else f"{name}_"
        result.update({f"{key}executor_cpu_us_per_msg": round(total, 2),
                       f"{key}parse_cpu_us_per_msg": round(parse, 2),
                       f"{key}to_arrow_cpu_us_per_msg": round(arrow, 2)})
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
