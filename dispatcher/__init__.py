"""The outbox dispatcher: ``aggbox dispatch`` turns outbox entries into broker messages.

Each collection is split into partitions (a stable hash of the aggregate id); every running
instance holds leases on a fair share of them, balanced without a coordinator, and opens one
change stream filtered to its partitions (or polls, on servers without change streams),
sweeps its documents with a pending outbox,
publishes each document's entries in order keyed by aggregate id, ``$pull``s exactly the
acknowledged ids and saves the stream's resume token. At-least-once with stable ids: a crash
anywhere republishes, never loses. See docs/design.md "The dispatcher".

Modules: :mod:`~dispatcher.core.settings` (section ``[dispatcher]``),
:mod:`~dispatcher.publishers.record` (entry → envelope + headers/key/topic),
:mod:`~dispatcher.publishers` (Kafka, JSON Lines, stdout; the interface for more),
:mod:`~dispatcher.outbox.cycle` (publish → dead-letter → pull),
:mod:`~dispatcher.outbox.inflight`, :mod:`~dispatcher.outbox.sweep` (sweeps and their schedule),
:mod:`~dispatcher.outbox.stream` (change stream + checkpoints), :mod:`~dispatcher.outbox.streammode`
(stream mode: restarts, invalidations, checkpoints), :mod:`~dispatcher.leases.balance`
(which partitions to hold: the pure rule), :mod:`~dispatcher.leases.partlease` (partition leases and
heartbeats as stored), :mod:`~dispatcher.leases.balancer` (the lease rounds),
:mod:`~dispatcher.outbox.selection` (the partitions as query filters),
:mod:`~dispatcher.outbox.retries` (backoff and documents to retry), :mod:`~dispatcher.worker`
(one collection: what comes next),
:mod:`~dispatcher.outbox.backlog` (backlog gauges), :mod:`~dispatcher.observe.metrics` (Prometheus +
``/healthz`` over aiohttp), :mod:`~dispatcher.core.errors` (fatal store errors),
:mod:`~dispatcher.core.timing` (injected clock, sleep and jitter), :mod:`~dispatcher.core.faults`
(crash-test hooks), :mod:`~dispatcher.daemon` (lifecycle, signals). The command line is
``aggbox.commands.dispatch``.

Imports here are light (no broker client); publishers load theirs when started. The names
below are imported at first use (PEP 562): ``import dispatcher.core.settings`` works without the
``dispatcher`` extra (aiohttp, prometheus-client), which only :mod:`~dispatcher.daemon` needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dispatcher.core.settings import DispatcherSettings
    from dispatcher.daemon import Dispatcher
    from dispatcher.publishers import (
        Publisher,
        PublisherError,
        PublishResult,
        create_publisher,
    )
    from dispatcher.publishers.record import OutboundRecord, build_record

_LAZY = {"Dispatcher": "dispatcher.daemon", "DispatcherSettings": "dispatcher.core.settings",
         "OutboundRecord": "dispatcher.publishers.record",
         "build_record": "dispatcher.publishers.record",
         "PublishResult": "dispatcher.publishers", "Publisher": "dispatcher.publishers",
         "PublisherError": "dispatcher.publishers", "create_publisher": "dispatcher.publishers"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dispatcher' has no attribute {name!r}")

__all__ = [
    "Dispatcher",
    "DispatcherSettings",
    "OutboundRecord",
    "PublishResult",
    "Publisher",
    "PublisherError",
    "build_record",
    "create_publisher",
]
