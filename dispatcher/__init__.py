"""The outbox dispatcher: ``aggbox dispatch`` turns outbox entries into broker messages.

Each collection is split into partitions (a stable hash of the aggregate id); every running
instance holds leases on a fair share of them, balanced without a coordinator, and opens one
change stream filtered to its partitions (or polls, on servers without change streams),
sweeps its documents with a pending outbox,
publishes each document's entries in order keyed by aggregate id, ``$pull``s exactly the
acknowledged ids and saves the stream's resume token. At-least-once with stable ids: a crash
anywhere republishes, never loses. See docs/design.md "The dispatcher".

Rooms, floor by floor (each imports only the floors below it; docs/design.md "Layout of the
dispatcher", held by tests/dispatcher/test_boundaries.py):

- :mod:`dispatcher.core` — settings (section ``[dispatcher]``), fatal store errors, the
  injected clock, crash-test fault points;
- :mod:`dispatcher.publishers` — the outbound record (entry → envelope + headers/key/topic),
  its formats, and the publishers (Kafka, JSON Lines, stdout; the interface for more);
- :mod:`dispatcher.observe` — Prometheus metrics + ``/healthz`` over aiohttp, producer spans;
- :mod:`dispatcher.leases` — which partitions to hold (the pure rule), leases and heartbeats
  as stored, the lease rounds;
- :mod:`dispatcher.outbox` — publish → dead-letter → pull, in-flight entries, retries,
  sweeps, the change stream and its checkpoints, the partitions as filters, backlog gauges;
- :mod:`dispatcher.timers` — firing due timers; :mod:`dispatcher.effects` — the effect
  runner (entries executed instead of published);
- :mod:`dispatcher.status` — the read-only ``aggbox dispatch-status`` report;
- on top, the daemon's wiring: :mod:`~dispatcher.worker` (one collection: what comes next),
  :mod:`~dispatcher.wiring` (the collections, effects and their router) and
  :mod:`~dispatcher.daemon` (lifecycle, signals). The command line is
  ``aggbox.commands.dispatch``.

Imports here are light (no broker client); publishers load theirs when started. The names
below are imported at first use (PEP 562): ``import dispatcher.core.settings`` works without
the ``dispatcher`` extra (aiohttp, prometheus-client), which only :mod:`~dispatcher.daemon` needs.
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
    from dispatcher.publishers.builder import build_record
    from dispatcher.publishers.record import OutboundRecord

_LAZY = {"Dispatcher": "dispatcher.daemon", "DispatcherSettings": "dispatcher.core.settings",
         "OutboundRecord": "dispatcher.publishers.record",
         "build_record": "dispatcher.publishers.builder",
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
