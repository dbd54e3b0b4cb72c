"""How :func:`aggregates.testing.message` numbers the messages it builds without an id or a
time (pure): ``test-<n>`` and 2026-01-01 00:00:00 + ``n`` seconds.

Outside a run, ``n`` counts across the process, so every test message has an id of its own.
:func:`numbered_run` numbers from 1 again for the messages built inside it, with ids
``run-<n>`` (never equal to a ``test-<n>`` built outside): :func:`check_fault_tolerance`
runs every build of the flow inside one, as does each ``hash_seeds`` subprocess, so every run
builds the same messages — same ids, same ``occurred_at`` — and a handler that keeps
``msg.occurred_at`` (or the id) ends every run in the same state (issue 43)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["next_number", "numbered_run"]

_process = itertools.count(1)
_run: ContextVar[Iterator[int] | None] = ContextVar("aggbox_message_numbers", default=None)


def next_number() -> tuple[str, int]:
    """The default id's prefix and the next number (also the default time's seconds)."""
    numbers = _run.get()
    if numbers is None:
        return "test", next(_process)
    return "run", next(numbers)


@contextmanager
def numbered_run() -> Iterator[None]:
    """Messages built inside number from 1 (``run-1``, ``run-2``, …)."""
    token = _run.set(itertools.count(1))
    try:
        yield
    finally:
        _run.reset(token)
