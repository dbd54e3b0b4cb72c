"""Pipeline metrics as a Prometheus text-exposition file, for a batch job to push.

:func:`render_metrics` turns a run's counts (:class:`spark.results.RunResult` or the totals
of a :class:`spark.results.StreamResult`) into the text format the Pushgateway accepts;
:func:`write_metrics_file` writes it atomically (a temporary file in the same directory,
then a rename: a reader never sees half a file). Push it with::

    curl --data-binary @PATH http://pushgateway:9091/metrics/job/aggbox

Metrics (all gauges: the values of the last run, or of the stream so far; a later push
replaces them):

- ``aggbox_pipeline_outcomes{aggregate_type,message_type,outcome,reason}``: outcome rows
  (``outcome`` is ``released_<kind>`` for released parked messages; missing values are "");
- ``aggbox_pipeline_input_records``, ``aggbox_pipeline_run_seconds``,
  ``aggbox_pipeline_last_run_timestamp_seconds``.

No ``run_id`` label: the Pushgateway groups by job (and instance); a label that changes on
every run would leave one stale series per run behind. Label values come from user input and
are escaped as the format requires (backslash, double quote, newline).

Rendered here rather than with ``prometheus_client``: that library is an optional extra of
the dispatcher, not of the pipeline, and the format needed is small.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from aggregates.core.files import write_atomic

__all__ = ["BY_TYPE_LABELS", "escape_label_value", "render_metrics", "write_metrics_file"]

#: Label names of ``aggbox_pipeline_outcomes``, in ``RunResult.by_type`` key order.
BY_TYPE_LABELS = ("aggregate_type", "message_type", "outcome", "reason")


def escape_label_value(value: str) -> str:
    """``value`` as the text format wants it between double quotes."""
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(int(value))


def _gauge(name: str, help_text: str, samples: list[tuple[str, float]]) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} gauge",
            *(f"{name}{labels} {_number(v)}" for labels, v in samples)]


def render_metrics(
    by_type: Mapping[tuple[str, str, str, str], int],
    *,
    input_records: int,
    run_seconds: float,
    timestamp: float,
) -> str:
    """The Prometheus text exposition of a run's outcome counts (pure: no I/O, no clock)."""
    outcome_samples: list[tuple[str, float]] = []
    for key, n in sorted(by_type.items()):
        labels = ",".join(f'{name}="{escape_label_value(v)}"'
                          for name, v in zip(BY_TYPE_LABELS, key, strict=True))
        outcome_samples.append(("{" + labels + "}", n))
    lines = [
        *_gauge("aggbox_pipeline_outcomes",
                "Outcome rows of the last aggbox run (of the stream so far) by aggregate type, "
                "message type, outcome and reason.", outcome_samples),
        *_gauge("aggbox_pipeline_input_records",
                "Input records of the last aggbox run (of the stream so far).",
                [("", input_records)]),
        *_gauge("aggbox_pipeline_run_seconds",
                "Seconds the last aggbox run (the stream's micro-batches) took.",
                [("", float(run_seconds))]),
        *_gauge("aggbox_pipeline_last_run_timestamp_seconds",
                "Unix time at which the last aggbox run (micro-batch) finished.",
                [("", float(timestamp))]),
    ]
    return "\n".join(lines) + "\n"


def write_metrics_file(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file + rename)."""
    write_atomic(path, text)
