"""Prometheus metrics and the ``/healthz`` endpoint.

Every :class:`Metrics` has its own registry (several dispatchers may live in one process,
e.g. in tests). :class:`MetricsServer` serves them over HTTP with aiohttp:

- ``GET /metrics`` — Prometheus text format;
- ``GET /healthz`` — 200 when every collection worker made progress recently (active or
  standby) *and* had a successful MongoDB round trip within ``unhealthy_after_s``, else 503;
  the body is JSON with each worker's role, mode, last activity, last server contact and
  last error.

``HEAD`` works on both; anything else is 404 (unknown path) or 405 (other methods), a
malformed request 400.

Why aiohttp: the dispatcher is an asyncio program, and aiohttp's server runs on the same
event loop as the workers — no thread, no second server process, no ASGI adapter. It is
maintained, widely deployed and handles HTTP/1.1 (keep-alive, HEAD, chunked bodies,
malformed requests, slow clients, header limits) itself. prometheus_client's own exposition
server is a WSGI app on a thread (``start_http_server``) and serves no ``/healthz``; its ASGI
app would need an ASGI server (uvicorn) as well as a second app for ``/healthz``.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
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

_LEASE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32)
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
        self.pull_failures = Counter(p + "pull_failures", "Published entries' ``$pull`` "
                                     "from the outbox that failed for good when a worker "
                                     "stopped publishing (they are published again).",
                                     ["collection"], registry=r)
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
        self.lease_active = Gauge(p + "lease_active", "1 while this instance publishes "
                                  "some partitions of the collection (active), 0 while it "
                                  "holds none (standby).",
                                  ["collection"], registry=r)
        self.partitions_owned = Gauge(
            p + "partitions_owned", "Partitions of the collection this instance holds a "
            "lease on.", ["collection"], registry=r)
        self.lease_round_seconds = Histogram(
            p + "lease_round_seconds", "Duration of a partition lease round (heartbeat, "
            "reads, claims); above a quarter of lease_ttl_s it is logged, near half of it "
            "leases lapse.", ["collection"], buckets=_LEASE_BUCKETS, registry=r)
        self.lease_lapses = Counter(
            p + "lease_lapses", "Heartbeats that could not be renewed in time: every lease "
            "of the instance dropped (alert).", ["collection"], registry=r)
        self.effects_missing = Gauge(
            p + "effects_missing", "Effect types other live instances execute and this one "
            "does not: their entries wait here (configure the same effects everywhere).",
            ["collection"], registry=r)
        self.handovers = Counter(
            p + "partition_handovers", "Partition leases changing hands at this instance "
            "(kind: claimed_new, claimed_released, claimed_expired, released, lost).",
            ["collection", "kind"], registry=r)
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
        # Timers (dispatcher.timers.firer).
        self.timers_fired = Counter(p + "timers_fired", "Due timers published (acknowledged "
                                    "by the broker; removed next).", ["collection"], registry=r)
        self.timer_lag = Histogram(p + "timer_lag_seconds", "Time from a timer's due time to "
                                   "the broker's acknowledgement.", ["collection"],
                                   buckets=_LATENCY_BUCKETS, registry=r)
        self.timers_overdue = Gauge(p + "timers_overdue", "Timers more than 60 s past due in "
                                    "the last page the firer read (alert when it stays > 0).",
                                    ["collection"], registry=r)
        # The effect runner (dispatcher.effects), by effect (message) type.
        e = "aggbox_effect_"
        self.effect_calls = Counter(e + "calls", "Effect calls made (attempts begun).",
                                    ["type"], registry=r)
        self.effect_retries = Counter(e + "retries", "Effect calls that failed retryably "
                                      "(reason: effect_retryable, effect_timeout, "
                                      "effect_error).", ["type", "reason"], registry=r)
        self.effect_results = Counter(e + "results", "Effect results recorded (outcome: "
                                      "succeeded, failed).", ["type", "outcome"], registry=r)
        self.effect_failures = Counter(e + "failures", "Effects that failed for good (the "
                                       "aggregate got the failure message; alert).",
                                       ["type", "reason"], registry=r)
        self.effect_recoveries = Counter(
            e + "recoveries", "Attempts found without a result after a crash or an unknown "
            "outcome (decision: query_done, query_not_done, call_again).",
            ["type", "decision"], registry=r)
        self.effect_latency = Histogram(e + "call_seconds", "Duration of effect calls.",
                                        ["type"], buckets=_LATENCY_BUCKETS, registry=r)

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
    #: since when (monotonic) lease rounds are too slow or fail; None while they are fine
    lease_trouble_since: float | None = None


class Health:
    """Liveness of the collection workers (each calls :meth:`beat` from its loop and
    :meth:`contact` after each successful MongoDB round trip).

    A worker is healthy while its role is starting, standby or active, it beat within
    ``stale_after_s``, it reached MongoDB within ``unhealthy_after_s`` — a loop that only
    retries failing server calls still beats, so the beat alone proves nothing — and its
    partition lease rounds have not been too slow (or failing) for longer than
    ``unhealthy_after_s`` (a store too slow for the leases answers, yet nothing is
    published)."""

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

    def lease_trouble(self, collection: str, since: float | None) -> None:
        """Lease rounds are too slow or fail since ``since`` (None: fine again)."""
        self.workers.setdefault(collection, WorkerHealth()).lease_trouble_since = since

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
            trouble = (0.0 if w.lease_trouble_since is None
                       else now - w.lease_trouble_since)
            healthy = (w.role in ("standby", "active", "starting") and age <= self.stale_after_s
                       and silent <= self.unhealthy_after_s
                       and trouble <= self.unhealthy_after_s)
            ok = ok and healthy
            workers[name] = {"role": w.role, "mode": w.mode, "seconds_since_progress":
                             round(age, 3), "seconds_since_server_contact": round(silent, 3),
                             "seconds_of_lease_trouble": round(trouble, 3),
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
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)  # GET and HEAD
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/health", self._healthz)
        return app

    async def start(self) -> None:
        """Bind (raises ``OSError`` when the port is taken) and serve."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        self._runner = runner
        log.info("metrics on http://%s:%d/metrics, health on /healthz", self.host, self.port)

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        ok, report = self.health.report()
        return web.json_response(report, status=200 if ok else 503)
