"""What ``aggbox run`` and ``aggbox stream`` report besides the tables: the ``by_type`` rows of
the JSON summary and the ``--metrics-file`` (:mod:`aggbox.commands.run`)."""

from __future__ import annotations

from typing import Any

__all__ = ["by_type_rows", "write_metrics"]


def by_type_rows(by_type: dict[tuple[str, str, str, str], int]) -> list[dict[str, Any]]:
    """``by_type`` for the JSON summary, largest count first."""
    return [{"aggregate_type": a, "message_type": m, "outcome": o, "reason": r, "count": n}
            for (a, m, o, r), n in sorted(by_type.items(), key=lambda kv: (-kv[1], kv[0]))]


def write_metrics(path: str | None, by_type: dict[tuple[str, str, str, str], int],
                  input_count: int, seconds: float) -> None:
    """With ``--metrics-file PATH``: the outcome counts in the Prometheus text format."""
    if not path:
        return
    import time

    from spark.metrics_export import render_metrics, write_metrics_file

    write_metrics_file(path, render_metrics(by_type, input_records=input_count,
                                            run_seconds=seconds, timestamp=time.time()))
