"""Helpers every benchmark script shares, written once (bench only: no product code).

- :func:`process_cpu_s`: CPU seconds (user + system) of this process, all threads
  (``resource.getrusage``).
- :func:`cpu_ticks`, :func:`pid_cpu_s`, :func:`cpu_since`, :class:`PidCpu`: CPU of another
  process (the MongoDB server, the Kafka broker, a dispatcher) from ``/proc/<pid>/stat``.
- :func:`quantile`: nearest-rank quantile of a list of figures; :func:`median`.

The scripts run as ``python bench/<name>.py``: this folder is first on ``sys.path``, so
``import common`` finds this file. No file here is named like a package of the product
(``aggregates``, ``spark``, ``dispatcher``, ``aggbox``), which it would shadow.
"""

from __future__ import annotations

import math
import os
import resource
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path


def process_cpu_s() -> float:
    """CPU seconds (user + system) this process used so far, all its threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cpu_ticks(pid: int | None) -> int | None:
    """utime + stime of ``pid`` in clock ticks (all its threads), from /proc/<pid>/stat;
    None when unknown."""
    if pid is None:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # fields from the 3rd (state) on
    return int(fields[11]) + int(fields[12])


def pid_cpu_s(pid: int | None) -> float | None:
    """CPU seconds ``pid`` used so far (None when unknown)."""
    ticks = cpu_ticks(pid)
    return None if ticks is None else ticks / os.sysconf("SC_CLK_TCK")


def cpu_since(pids: Mapping[str, int | None], ticks: Mapping[str, int | None]
              ) -> dict[str, float | None]:
    """CPU seconds each named process used since ``ticks`` (from :func:`cpu_ticks`; None
    when unknown)."""
    hz = os.sysconf("SC_CLK_TCK")
    out: dict[str, float | None] = {}
    for name, pid in pids.items():
        now, before = cpu_ticks(pid), ticks.get(name)
        out[name] = (round((now - before) / hz, 2) if now is not None and before is not None
                     else None)
    return out


class PidCpu:
    """CPU seconds of process ``pid`` over a ``with`` block (``.seconds``; 0.0 when the
    process is unknown)."""

    def __init__(self, pid: int | None) -> None:
        self.pid, self.seconds = pid, 0.0

    def __enter__(self) -> PidCpu:
        self._start = pid_cpu_s(self.pid) or 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = round((pid_cpu_s(self.pid) or 0.0) - self._start, 2)


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` (sorted here), nearest rank; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def median(values: Sequence[float], digits: int = 3) -> float:
    return round(statistics.median(values), digits)
