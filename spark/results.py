"""The results of the pipeline: :class:`RunResult` (one batch run or one micro-batch) and
:class:`StreamResult` (a stream's micro-batches), and the accounting that fails a run whose
input records and outcome rows do not add up (docs/design.md, invariant 6)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aggregates.core.errors import AggboxError
from aggregates.message.outcomes import OUTCOME_KINDS

__all__ = ["SAMPLED", "AccountingError", "RunResult", "StreamResult", "count_outcomes",
           "counts_from_observed", "counts_from_stats", "new_run_id"]


#: The outcomes whose reasons get a sample (:attr:`RunResult.samples`).
SAMPLED = ("dead_lettered", "parked")


class AccountingError(AggboxError):
    """Input records and outcome rows do not add up (a bug: nothing may be dropped)."""


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


@dataclass(slots=True)
class RunResult:
    """The result of one batch run or one micro-batch."""

    run_id: str
    input_count: int
    counts: dict[str, int]
    reasons: dict[tuple[str, str], int]
    #: (aggregate_type, message_type, outcome, reason) → count, "" for NULL; ``outcome`` is
    #: ``released_<kind>`` for released parked messages, as in ``counts``.
    by_type: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    outcomes: Any = None  # DataFrame of spark.schema.OUTCOME_SCHEMA (None once dropped)
    outcomes_path: str | None = None
    batch_id: int | None = None
    seconds: float = 0.0
    #: (outcome, reason) → (message id, detail) of one dead-lettered or parked input record
    #: with that reason: the smallest message id (so it does not depend on how the input was
    #: partitioned) and its outcome's detail.
    samples: dict[tuple[str, str], tuple[str, str | None]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Outcomes of input records (excludes released parked messages)."""
        return sum(self.counts.get(k, 0) for k in OUTCOME_KINDS)

    @property
    def unaccounted(self) -> int:
        return self.input_count - self.total

    @property
    def ok(self) -> bool:
        return self.unaccounted == 0

    def raise_for_accounting(self) -> None:
        if not self.ok:
            where = f"micro-batch {self.batch_id}" if self.batch_id is not None else "the run"
            raise AccountingError(
                f"{where}: {self.input_count} input records but {self.total} outcomes "
                f"({self.counts}); this is a bug, please report it with the outcome log"
            )

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run_id": self.run_id, "input": self.input_count}
        if self.batch_id is not None:
            out["batch_id"] = self.batch_id
        out.update(self.counts)
        return out


@dataclass(slots=True)
class StreamResult:
    """Per-micro-batch results (outcome DataFrames dropped) and their totals."""

    batches: list[RunResult] = field(default_factory=list)
    query_id: str | None = None

    @property
    def input_count(self) -> int:
        return sum(b.input_count for b in self.batches)

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for b in self.batches:
            for k, v in b.counts.items():
                out[k] = out.get(k, 0) + v
        return out

    @property
    def reasons(self) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for b in self.batches:
            for k, v in b.reasons.items():
                out[k] = out.get(k, 0) + v
        return out

    @property
    def by_type(self) -> dict[tuple[str, str, str, str], int]:
        out: dict[tuple[str, str, str, str], int] = {}
        for b in self.batches:
            for k, v in b.by_type.items():
                out[k] = out.get(k, 0) + v
        return out

    @property
    def seconds(self) -> float:
        return sum(b.seconds for b in self.batches)

    @property
    def samples(self) -> dict[tuple[str, str], tuple[str, str | None]]:
        """Per (outcome, reason): the sample of the first micro-batch that had one."""
        out: dict[tuple[str, str], tuple[str, str | None]] = {}
        for b in self.batches:
            for k, v in b.samples.items():
                out.setdefault(k, v)
        return out

    @property
    def ok(self) -> bool:
        return all(b.ok for b in self.batches)



Samples = dict[tuple[str, str], tuple[str, str | None]]
Counts = tuple[dict[str, int], dict[tuple[str, str], int], dict[tuple[str, str, str, str], int],
               Samples]


def count_outcomes(outcomes: Any) -> Counts:
    """``counts`` (per outcome kind, ``released_<kind>``, ``total``), ``reasons`` (per
    outcome and reason, input records only), ``by_type`` (see :attr:`RunResult.by_type`)
    and ``samples`` (:attr:`RunResult.samples`), from a groupBy over every column they
    need, and one over the dead-lettered and parked rows for the samples."""
    from pyspark.sql import functions as F

    rows = outcomes.groupBy("outcome", "from_parked", "reason", "aggregate_type",
                            "message_type").count().collect()
    firsts = (outcomes.where(F.col("outcome").isin(*SAMPLED) & ~F.col("from_parked")
                             & F.col("reason").isNotNull())
              .groupBy("outcome", "reason")
              .agg(F.min(F.struct("message_id", "detail")).alias("first")).collect())
    counts, reasons, by_type, _ = _fold((r["outcome"], r["from_parked"], r["reason"],
                                         r["aggregate_type"], r["message_type"], r["count"])
                                        for r in rows)
    samples = {(str(r["outcome"]), str(r["reason"])): (str(r["first"]["message_id"]),
                                                       r["first"]["detail"]) for r in firsts}
    return counts, reasons, by_type, samples


def counts_from_stats(stats: Iterable[str]) -> Counts:
    """What :func:`count_outcomes` returns, from the executors' own counts: one JSON text
    per partition (:func:`spark.executor.with_stats`), each a list of
    ``[outcome, from_parked, reason, aggregate_type, message_type, n]``, followed by
    ``message_id, detail`` of the group's sample for the :data:`SAMPLED` outcomes."""
    return _fold(tuple(row) for text in stats for row in json.loads(text))


def counts_from_observed(observed_out: Any) -> Counts:
    """:func:`counts_from_stats` of the executors' counts returned with the job (the
    ``stats`` and ``rows`` of the outcomes' ``Observation``), checked against the number of
    outcome rows: they differ only by a bug, which fails the run."""
    stats = [t for t in str(observed_out["stats"] or "").split("\n") if t]
    counts, reasons, by_type, samples = counts_from_stats(stats)
    released = sum(v for k, v in counts.items() if k.startswith("released_"))
    if counts["total"] + released != int(observed_out["rows"]):
        raise AccountingError(
            f"the executors counted {counts} but returned {observed_out['rows']} "
            "outcome rows; this is a bug, please report it with the outcome log")
    return counts, reasons, by_type, samples


def _fold(rows: Iterable[tuple[Any, ...]]) -> Counts:
    counts: dict[str, int] = {k: 0 for k in OUTCOME_KINDS}
    reasons: dict[tuple[str, str], int] = {}
    by_type: dict[tuple[str, str, str, str], int] = {}
    samples: Samples = {}
    for outcome, from_parked, reason, atype, mtype, count, *sample in rows:
        n = int(count)
        if sample and reason is not None and not from_parked:
            sk = (str(outcome), str(reason))
            if sk not in samples or str(sample[0]) < samples[sk][0]:
                samples[sk] = (str(sample[0]), sample[1])
        key = f"released_{outcome}" if from_parked else str(outcome)
        counts[key] = counts.get(key, 0) + n
        if reason is not None and not from_parked:
            rk = (str(outcome), str(reason))
            reasons[rk] = reasons.get(rk, 0) + n
        tk = (atype or "", mtype or "", key, reason or "")
        by_type[tk] = by_type.get(tk, 0) + n
    counts["total"] = sum(counts[k] for k in OUTCOME_KINDS)
    return counts, reasons, by_type, samples
