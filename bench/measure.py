"""Measuring instruments shared by the benchmarks (bench only: no product code changes).

- :func:`process_cpu_s` (from bench/common.py): CPU seconds of this process, all threads.
- :class:`HandlerTimer`: wraps the registered handler functions of a registry's aggregate
  types with a thread-CPU timer (``time.thread_time_ns``), so the handlers' own CPU can be
  subtracted from the process CPU. Only the domain function is timed: a typed handler's
  payload validation (``TypedHandler.parse``) is aggbox's work and stays outside. The
  wrapper costs about 2 µs per call (``thread_time_ns`` is a system call), part of it inside
  the timed interval: :func:`calibrate_timer` measures both parts on a no-op handler, and
  the benches subtract them (``inside`` from the handlers' time, ``outside`` from the
  process's), printing the correction they applied.
- :class:`OpCounter`: a pymongo ``CommandListener`` counting what a client asks the server
  to do: write statements (each update/insert/delete inside a write command, so a bulk of
  1,000 updates counts 1,000) and read commands (``find``, ``getMore``, ``aggregate``,
  ``count``, ``distinct``: one each, however many documents come back).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from common import process_cpu_s
from pymongo import monitoring

WRITE_ARRAYS = {"insert": "documents", "update": "updates", "delete": "deletes"}
READ_COMMANDS = frozenset({"find", "getMore", "aggregate", "count", "distinct"})

__all__ = ["HandlerTimer", "OpCounter", "calibrate_timer", "process_cpu_s", "worker_state"]


class HandlerTimer:
    """Thread-CPU nanoseconds and calls of the handler functions of ``registry``."""

    def __init__(self) -> None:
        self.ns = 0
        self.calls = 0
        self._lock = threading.Lock()

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        clock = time.thread_time_ns
        lock = self._lock

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = clock() - t0
                with lock:
                    self.ns += dt
                    self.calls += 1

        timed.__wrapped__ = fn  # type: ignore[attr-defined]
        timed.__name__ = getattr(fn, "__name__", "handler")
        return timed

    def install(self, registry: Any) -> None:
        """Wrap every handler of every aggregate type of ``registry`` (once)."""
        for atype in registry:
            handlers = atype._handlers
            for mtype, h in list(handlers.items()):
                if hasattr(h, "fn") and hasattr(h, "parse"):  # a TypedHandler: time its fn
                    if not getattr(h.fn, "_bench_timed", False):
                        h.fn = self._timed(h.fn)
                        h.fn._bench_timed = True
                elif not getattr(h, "_bench_timed", False):
                    handlers[mtype] = self._timed(h)
                    handlers[mtype]._bench_timed = True

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return self.ns, self.calls


def calibrate_timer(calls: int = 200_000) -> tuple[float, float]:
    """(inside, outside): CPU-ns per call the timer adds inside the timed interval and
    outside it, measured on a no-op function (median of three rounds)."""

    def noop(state: Any, msg: Any) -> Any:
        return state

    rounds: list[tuple[float, float]] = []
    for _ in range(3):
        timer = HandlerTimer()
        timed = timer._timed(noop)
        c0 = process_cpu_s()
        for _ in range(calls):
            noop(1, 2)
        c1 = process_cpu_s()
        for _ in range(calls):
            timed(1, 2)
        c2 = process_cpu_s()
        total = ((c2 - c1) - (c1 - c0)) * 1e9 / calls
        inside = timer.ns / calls
        rounds.append((inside, max(0.0, total - inside)))
    rounds.sort(key=lambda r: r[0] + r[1])
    return rounds[1]


class OpCounter(monitoring.CommandListener):
    """Server operations requested by the clients it listens to (see the module docstring).
    Counts only while ``active``."""

    def __init__(self) -> None:
        self.active = False
        self.writes = 0
        self.reads = 0
        self.by_command: dict[str, int] = {}
        self._lock = threading.Lock()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if not self.active:
            return
        name = event.command_name
        array = WRITE_ARRAYS.get(name)
        if array is not None:
            n = len(event.command.get(array) or ())
            with self._lock:
                self.writes += n
                self.by_command[name] = self.by_command.get(name, 0) + n
        elif name in READ_COMMANDS:
            with self._lock:
                self.reads += 1
                self.by_command[name] = self.by_command.get(name, 0) + 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return self.writes, self.reads


_WORKER: tuple[HandlerTimer, OpCounter] | None = None


def worker_state(registry: Any) -> tuple[HandlerTimer, OpCounter]:
    """In a Spark Python worker (reused across tasks): the handler timer, installed on the
    worker's cached ``registry``, and a command listener registered for every MongoDB
    client the worker creates afterwards (before its first partition: the executor's client
    is created per worker, after this). Once per worker process."""
    global _WORKER
    if _WORKER is None:
        timer, ops = HandlerTimer(), OpCounter()
        ops.active = True
        monitoring.register(ops)
        _WORKER = (timer, ops)
    _WORKER[0].install(registry)
    return _WORKER
