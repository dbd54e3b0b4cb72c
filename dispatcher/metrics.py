"""Prometheus metrics and the ``/healthz`` endpoint.

Every :class:`Metrics` has its own registry (several dispatchers may live in one process,
e.g. in tests). :class:`MetricsServer` is a tiny asyncio HTTP server:

- ``GET /metrics`` — Prometheus text format;
- ``GET /healthz`` — 200 when every collection worker made progress recently (active or
  standby) *and* had a successful MongoDB round trip within ``unhealthy_after_s``, else 503;
  the body is JSON with each worker's role, mode, last activity, last server contact and
  last error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

__all__ = ["Health", "Metrics", "MetricsServer"]

log = logging.getLogger("aggbox.dispatcher.metrics")

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class Metrics:
    """The dispatcher's metrics (names start with ``aggbox_dispatcher_``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        p = "aggbox_dispatcher_"
        self.published = Counter(p + "published", "Entries acknowledged by the broker.",
                                 ["collection"], registry=r)
        self.failed = Counter(p + "failed", "Entries the broker did not take "
                              "(kind: retryable = retried later, permanent = dead-lettered).",
                              ["collection", "kind"], registry=r)
        self.dead_lettered = Counter(p + "dead_lettered", "Entries dead-lettered (alert).",
                                     ["collection", "reason"], registry=r)
        self.stale_skipped = Counter(p + "stale_skipped", "Entries seen again after they "
                                     "were published (not republished).", ["collection"],
                                     registry=r)
        self.backlog = Gauge(p + "backlog_entries", "Pending outbox entries.", ["collection"],
                             registry=r)
        self.backlog_documents = Gauge(p + "backlog_documents",
                                       "Documents with a pending outbox.", ["collection"],
                                       registry=r)
        self.oldest_pending_age = Gauge(p + "oldest_pending_age_seconds",
                                        "Age of the oldest pending entry (0 when none).",
                                        ["collection"], registry=r)
        self.stream_lag = Gauge(p + "stream_lag_seconds", "Server time of the newest "
                                "change event handled, behind now (0 when caught up).",
                                ["collection"], registry=r)
        self.lease_active = Gauge(p + "lease_active", "1 while this instance holds the "
                                  "collection's lease (active), 0 as standby.",
                                  ["collection"], registry=r)
        self.mode = Gauge(p + "mode", "1 for the mode the worker runs in.",
                          ["collection", "mode"], registry=r)
        self.latency = Histogram(p + "commit_to_publish_seconds", "Time from an entry's "
                                 "creation to the broker's acknowledgement.", ["collection"],
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.batches = Counter(p + "batches", "Publish batches.", ["collection"], registry=r)
        self.sweeps = Counter(p + "sweeps", "Sweeps for pending entries.",
                              ["collection", "reason"], registry=r)
        self.stream_restarts = Counter(p + "stream_restarts", "Change streams reopened "
                                       "(reason: history_lost, invalid_token, error).",
                                       ["collection", "reason"], registry=r)
        self.backoffs = Counter(p + "backoffs", "Pauses after a broker or store failure.",
                                ["collection", "cause"], registry=r)
        self.stream_invalidations = Counter(
            p + "stream_invalidations", "Change streams ended by an invalidate event "
            "(collection dropped or renamed); each is followed by a new stream and a sweep.",
            ["collection"], registry=r)

    def set_mode(self, collection: str, mode: str) -> None:
        for m in ("stream", "poll", "standby"):
            self.mode.labels(collection, m).set(1 if m == mode else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


@dataclass
class WorkerHealth:
    role: str = "starting"  # starting | standby | active | stopped | failed
    mode: str = "-"
    last_beat: float = field(default_factory=time.monotonic)
    #: last successful MongoDB round trip (start-up counts, so a new worker has a grace period)
    last_contact: float = field(default_factory=time.monotonic)
    error: str | None = None


class Health:
    """Liveness of the collection workers (each calls :meth:`beat` from its loop and
    :meth:`contact` after each successful MongoDB round trip).

    A worker is healthy while its role is starting, standby or active, it beat within
    ``stale_after_s`` and it reached MongoDB within ``unhealthy_after_s`` — a loop that only
    retries failing server calls still beats, so the beat alone proves nothing."""

    def __init__(self, *, stale_after_s: float = 60.0, unhealthy_after_s: float = 30.0
                 ) -> None:
        self.stale_after_s = stale_after_s
        self.unhealthy_after_s = unhealthy_after_s
        self.workers: dict[str, WorkerHealth] = {}

    def beat(self, collection: str, *, role: str | None = None, mode: str | None = None
             ) -> None:
        w = self.workers.setdefault(collection, WorkerHealth())
        w.last_beat = time.monotonic()
        if role is not None:
            w.role = role
        if mode is not None:
            w.mode = mode

    def contact(self, collection: str) -> None:
        """A MongoDB round trip of this worker succeeded."""
        w = self.workers.setdefault(collection, WorkerHealth())
        w.last_contact = time.monotonic()

    def fail(self, collection: str, error: str) -> None:
        w = self.workers.setdefault(collection, WorkerHealth())
        w.role, w.error = "failed", error

    def report(self) -> tuple[bool, dict[str, Any]]:
        now = time.monotonic()
        workers = {}
        ok = bool(self.workers)
        for name, w in self.workers.items():
            age = now - w.last_beat
            silent = now - w.last_contact
            healthy = (w.role in ("standby", "active", "starting") and age <= self.stale_after_s
                       and silent <= self.unhealthy_after_s)
            ok = ok and healthy
            workers[name] = {"role": w.role, "mode": w.mode, "seconds_since_progress":
                             round(age, 3), "seconds_since_server_contact": round(silent, 3),
                             "healthy": healthy, "error": w.error}
        return ok, {"status": "ok" if ok else "unhealthy", "collections": workers}


class MetricsServer:
    """Serves ``/metrics`` and ``/healthz`` on ``host:port`` (port 0 picks a free one)."""

    def __init__(self, metrics: Metrics, health: Health, *, host: str = "127.0.0.1",
                 port: int = 9464) -> None:
        self.metrics = metrics
        self.health = health
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("metrics on http://%s:%d/metrics, health on /healthz", self.host, self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5.0)
            while True:  # skip the request headers
                line = await asyncio.wait_for(reader.readline(), 5.0)
                if line in (b"\r\n", b"\n", b""):
                    break
            parts = request.decode("latin-1").split()
            path = parts[1].split("?", 1)[0] if len(parts) >= 2 else "/"
            if path == "/metrics":
                status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, self.metrics.render()
            elif path in ("/healthz", "/health"):
                ok, report = self.health.report()
                status = "200 OK" if ok else "503 Service Unavailable"
                ctype, body = "application/json", json.dumps(report).encode()
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"try /metrics or /healthz\n"
            head = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
