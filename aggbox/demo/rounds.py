"""The demo's loop: pipeline round → dispatcher drain → the drained records (plus some
redelivered copies) are the next round's input — until a drain finds nothing to publish.

The pipeline and the dispatcher are passed in (:class:`RoundRunner`, :class:`Drainer`), so
the loop is the same for Spark and for a test double.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from aggbox.demo.generate import write_lines
from aggbox.demo.model import DrainResult, OutcomeRow, RoundResult, RunRecord, read_records

__all__ = ["Drainer", "RoundRunner", "StepFactory", "run_rounds"]


class RoundRunner(Protocol):
    """Runs the pipeline once over ``inputs``; returns its counts and outcome rows."""

    def __call__(self, number: int, inputs: Sequence[Path]
                 ) -> tuple[dict[str, int], list[OutcomeRow]]: ...


class Drainer(Protocol):
    """Publishes every pending outbox entry once, as JSON Lines files in ``directory``;
    returns (published, dead-lettered)."""

    def __call__(self, directory: Path) -> tuple[int, int]: ...


#: ``step(description)`` → a context manager around one stage (the progress display).
StepFactory = Callable[[str], AbstractContextManager[object]]


def _no_step(_description: str) -> AbstractContextManager[object]:
    return contextlib.nullcontext()


def run_rounds(
    first_inputs: Sequence[Path],
    *,
    workdir: Path,
    process: RoundRunner,
    drain: Drainer,
    pending: Callable[[], int],
    redeliver_rate: float = 0.0,
    rng: random.Random | None = None,
    max_rounds: int = 6,
    step: StepFactory = _no_step,
) -> RunRecord:
    """Run rounds until a drain publishes nothing and no outbox entry is left."""
    rng = rng or random.Random(0)
    record = RunRecord()
    inputs = list(first_inputs)
    redelivered = 0
    for number in range(1, max_rounds + 1):
        lines = read_records(inputs)
        with step(f"Round {number}: Spark pipeline on {len(lines):,} messages"):
            t0 = time.monotonic()
            counts, rows = process(number, inputs)
        record.rounds.append(RoundResult(number, inputs, lines, counts, rows,
                                         time.monotonic() - t0, redelivered))
        out_dir = workdir / "published" / f"after-round-{number}"
        with step(f"Round {number}: dispatcher → {out_dir.relative_to(workdir)}/"):
            t0 = time.monotonic()
            published, dead = drain(out_dir)
            records = read_records([out_dir])
            left = pending()
        record.drains.append(DrainResult(number, out_dir, published, dead, records, left,
                                         time.monotonic() - t0))
        if not records:
            record.settled = left == 0
            break
        copies = [records[rng.randrange(len(records))]
                  for _ in range(round(redeliver_rate * len(records)))]
        inputs = [out_dir]
        redelivered = len(copies)
        if copies:
            # A broker delivers at least once: some of the published records come again.
            inputs += write_lines(workdir / "redelivered", [copies], stem=f"round-{number + 1}")
    return record
