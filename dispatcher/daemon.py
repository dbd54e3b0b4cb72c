"""The dispatcher's lifecycle: clients, publisher, one worker per collection, metrics,
signals.

    dispatcher = Dispatcher(DispatcherSettings.load(collections=["orders"]))
    exit_code = asyncio.run(dispatcher.run(install_signal_handlers=True))

SIGTERM/SIGINT (or :meth:`Dispatcher.request_stop`): workers stop reading, the batch in
flight finishes (at most ``shutdown_timeout_s``; beyond that it is abandoned — nothing of it
was pulled, so it is published again after a restart), the resume token is saved,
partition leases are released so the other instances take them over at once, and
:meth:`run` returns 0. A second signal abandons in-flight work immediately.

With ``once=True``, :meth:`run` raises :class:`OnceGaveUp` when a collection makes no
progress for ``once_timeout_s`` (MongoDB or the broker unreachable): the command line prints
it as one error line and exits with status 1. A MongoDB never reached at all (the start-up
``ping`` finds no server within the server selection timeout) or a broker never reached
(the publisher's ``unreachable``, e.g. Kafka: every broker down and no metadata ever
fetched, once a delivery failed) ends it sooner, as :class:`NeverReached`.

A store error no retry can fix — wrong password, missing privilege, bad URI
(:mod:`aggregates.core.storeerrors`) — stops every worker within seconds and :meth:`run` raises
:class:`~dispatcher.core.errors.FatalStoreError`: one line for the command line to print (exit
status 1), the full trace in the ``aggbox.trace`` log (the log file, ``AGGBOX_LOG_FILE``).

The MongoDB URI is the store settings' ``mongodb_uri`` (or a ``client`` passed in): the
dispatcher never starts a server by itself — the command line resolves "no URI given".
Fault injection (crash tests) is passed in explicitly (``faults=``); it is inert by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Any

import pymongo
from pymongo import AsyncMongoClient, ReadPreference
from pymongo.errors import PyMongoError

from aggregates.core.errors import AggboxError, ConfigurationError
from aggregates.core.settings import AggboxSettings
from aggregates.domain.effects import Effects
from dispatcher.core.errors import (
    FIRST_LOOK_S,
    TRACE_LOGGER,
    FatalStoreError,
    check_fatal,
    is_unreachable,
    never_reached,
    refused_everywhere,
)
from dispatcher.core.faults import Faults
from dispatcher.core.settings import DispatcherSettings
from dispatcher.core.timing import REAL_TIME, Timing
from dispatcher.effects.guard import EffectGuard, FleetEffects
from dispatcher.leases.partlease import default_instance_id
from dispatcher.observe.metrics import Health, Metrics, MetricsServer
from dispatcher.outbox.backlog import pending_entries
from dispatcher.publishers import Publisher, create_publisher
from dispatcher.publishers.record import check_template
from dispatcher.wiring import check_replies, effect_router, load_effects, resolve_collections
from dispatcher.worker import CollectionWorker

__all__ = ["Dispatcher", "FatalStoreError", "NeverReached", "OnceGaveUp", "check_replies",
           "load_effects", "resolve_collections"]

log = logging.getLogger("aggbox.dispatcher")


class OnceGaveUp(AggboxError):
    """``--once`` stopped because a collection made no progress for ``once_timeout_s``."""


class NeverReached(OnceGaveUp):
    """``--once`` stopped because MongoDB or the broker was never reached since start (no
    point waiting ``once_timeout_s``). ``str()`` is the one line for the operator."""


class Dispatcher:
    """``aggbox dispatch`` as an object (tests and embedding use it directly)."""

    def __init__(
        self,
        settings: DispatcherSettings | None = None,
        *,
        store: AggboxSettings | None = None,
        publisher: Publisher | None = None,
        client: AsyncMongoClient[Any] | None = None,
        faults: Faults | None = None,
        metrics: Metrics | None = None,
        timing: Timing = REAL_TIME,
        effects: Effects | None = None,
    ) -> None:
        self.settings = settings or DispatcherSettings.load()
        self.store = store or AggboxSettings.load()
        check_template(self.settings.topic_template)
        self.collections = resolve_collections(self.settings)
        self.publisher = publisher or create_publisher(self.settings)
        #: Effects executed instead of published (docs/design.md "Side effects"): those of
        #: the `aggregates` module and the built-ins of `settings.effects`.
        self.effects = effects if effects is not None else load_effects(self.settings)
        self._sync_client: Any = None
        self.faults = faults if faults is not None else Faults()
        self.timing = timing
        self.metrics = metrics or Metrics()
        self.health = Health(stale_after_s=max(60.0, 3 * self.settings.lease_ttl_s,
                                               3 * self.settings.kafka_delivery_timeout_s),
                             unhealthy_after_s=self.settings.unhealthy_after_s)
        self.instance_id = self.settings.instance_id or default_instance_id()
        self.workers: list[CollectionWorker] = []
        self.metrics_server: MetricsServer | None = None
        self.started = asyncio.Event()
        self._client = client
        self._own_client = client is None
        self._stop: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._signals = 0
        self._gave_up: str | None = None
        self._never_reached = False
        self._fatal: FatalStoreError | None = None
        #: the broker's publisher, before effect routing and guards wrap it
        self._broker: Publisher = self.publisher
        #: ``--once``: collection → (pending entries, due timers) left after the run, in
        #: every partition (not measured when the run gave up)
        self.once_left: dict[str, tuple[int, int]] = {}

    # -- control ----------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Graceful stop (what SIGTERM does). Safe to call from the event loop thread."""
        self._signals += 1
        if self._stop is not None:
            self._stop.set()
        if self._signals >= 2:
            log.warning("second stop request: abandoning in-flight work")
            for t in self._tasks:
                t.cancel()

    @property
    def server_selection_timeout_s(self) -> float:
        """How long the dispatcher's own client waits for a reachable server before an
        operation fails (pymongo's default, 30 s, would hide an outage from the health
        check and the lease for that long)."""
        s = self.settings
        return max(1.0, min(s.lease_ttl_s, s.unhealthy_after_s / 2))

    @property
    def metrics_port(self) -> int | None:
        return self.metrics_server.port if self.metrics_server is not None else None

    # -- run --------------------------------------------------------------------------------
    async def run(self, *, once: bool = False, install_signal_handlers: bool = False) -> int:
        """Dispatch until stopped (or, with ``once``, until every collection is drained).
        Returns the process exit code; with ``once``, raises :class:`OnceGaveUp` when a
        collection made no progress for ``once_timeout_s``."""
        stop = self._stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            return await self._run(stop, once)
        finally:
            if install_signal_handlers:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("%s received: stopping (finishing in-flight publishes)", sig.name)
        self.request_stop()

    async def _client_for(self) -> AsyncMongoClient[Any]:
        if self._client is not None:
            return self._client
        uri = self.store.mongodb_uri
        if not uri:
            raise ConfigurationError(
                "no MongoDB URI: set mongodb_uri (--mongodb-uri, AGGBOX_MONGODB_URI); the "
                "dispatcher does not start a server by itself")
        options: dict[str, Any] = {}
        if "serverselectiontimeoutms" not in uri.lower():  # the URI's own setting wins
            options["serverSelectionTimeoutMS"] = int(self.server_selection_timeout_s * 1000)
        try:
            self._client = AsyncMongoClient(uri, tz_aware=True, appname="aggbox-dispatcher",
                                            **options)
        except PyMongoError as exc:  # InvalidURI, ConfigurationError: fatal
            check_fatal(exc, "MongoDB URI")
            raise
        return self._client

    async def _run(self, stop: asyncio.Event, once: bool) -> int:
        s = self.settings
        client = await self._client_for()
        db = client[self.store.database]
        rc = 0
        self._broker = self.publisher
        try:
            if once:
                await self._reach_store(client)
            if len(self.effects):
                self.publisher = await self._effect_router(db)
            # Entries of effects other instances execute and this one lacks wait here.
            fleet = FleetEffects(e.type for e in self.effects)
            self.publisher = EffectGuard(self.publisher, fleet)
            await self.publisher.start()
            if s.metrics_port and not once:
                self.metrics_server = MetricsServer(self.metrics, self.health,
                                                    host=s.metrics_host, port=s.metrics_port)
                try:
                    await self.metrics_server.start()
                except OSError as exc:
                    raise ConfigurationError(
                        f"cannot serve metrics on {s.metrics_host}:{s.metrics_port}: {exc}; "
                        "choose another metrics_port (--metrics-port, 0 turns it off)"
                    ) from exc
            self.workers = [
                CollectionWorker(db=db, collection=name, settings=s, publisher=self.publisher,
                                 dead_letter_collection=self.store.dead_letter_collection,
                                 metrics=self.metrics, health=self.health, faults=self.faults,
                                 stop=stop, owner=self.instance_id, source_type=atype,
                                 once=once, timing=self.timing, fleet=fleet)
                for name, atype in self.collections
            ]
            for w in self.workers:
                self.health.beat(w.name, role="starting")
            self._tasks = [asyncio.create_task(w.run(), name=f"dispatch-{w.name}")
                           for w in self.workers]
            gauges = asyncio.create_task(self._measure_loop(stop), name="dispatch-gauges")
            watchdog = (asyncio.create_task(self._once_watchdog(stop), name="dispatch-watchdog")
                        if once else None)
            log.info("dispatcher %s started: %s → %s", self.instance_id,
                     ", ".join(n for n, _ in self.collections), self.publisher.name,
                     extra={"instance": self.instance_id, "publisher": self.publisher.name})
            self.started.set()
            rc = await self._wait(stop)
            helpers = [t for t in (gauges, watchdog) if t is not None]
            for t in helpers:
                t.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            if once and self._gave_up is None:
                await self._measure_once()
                await self._measure_left()
        finally:
            await self._close()
        log.info("dispatcher %s stopped", self.instance_id, extra={"instance": self.instance_id})
        if self._fatal is not None:
            raise self._fatal
        if self._gave_up is not None:
            raise (NeverReached if self._never_reached else OnceGaveUp)(self._gave_up)
        return rc

    async def _reach_store(self, client: AsyncMongoClient[Any]) -> None:
        """``--once``: one ``ping`` first. A server not reached within the server selection
        timeout — or within :data:`FIRST_LOOK_S` when every server refused the connection or
        has a name that does not resolve (:func:`refused_everywhere`) — ends the run at once
        with one line naming the (redacted) URI: the workers would only retry until
        ``once_timeout_s``. Any member answers (``nearest``): a replica set without a primary
        was reached, and is left to the workers."""
        timeout: float = client.options.server_selection_timeout
        try:
            if timeout > FIRST_LOOK_S:
                try:  # a refused port or an unknown name is an answer: do not wait it out
                    with pymongo.timeout(FIRST_LOOK_S):
                        await client.admin.command("ping",
                                                   read_preference=ReadPreference.NEAREST)
                    return
                except PyMongoError:
                    if refused_everywhere(client):
                        timeout = FIRST_LOOK_S
                        raise
                with pymongo.timeout(timeout - FIRST_LOOK_S):  # the rest of the timeout
                    await client.admin.command("ping", read_preference=ReadPreference.NEAREST)
            else:
                await client.admin.command("ping", read_preference=ReadPreference.NEAREST)
        except PyMongoError as exc:
            check_fatal(exc, "MongoDB")  # e.g. a wrong password: FatalStoreError
            if not is_unreachable(exc):
                return  # the server answered: the workers deal with the rest
            message = never_reached(self.store.mongodb_uri or "", exc, timeout)
            logging.getLogger(TRACE_LOGGER).error(
                message, exc_info=(type(exc), exc, exc.__traceback__))
            raise NeverReached(message) from exc

    async def _once_watchdog(self, stop: asyncio.Event) -> None:
        """``--once`` must end: abandon the run when a collection has made no progress for
        ``once_timeout_s`` (nothing was pulled that was not published: at-least-once holds)."""
        limit = self.settings.once_timeout_s
        while not stop.is_set():
            unreachable = getattr(self._broker, "unreachable", None)
            if isinstance(unreachable, str) and unreachable:  # never reached since start
                self._gave_up, self._never_reached = unreachable, True
                stop.set()
                for t in self._tasks:
                    t.cancel()
                return
            now = self.timing.monotonic()  # the workers' clock (progress_at)
            for w, task in zip(self.workers, self._tasks, strict=True):
                if task.done() or now - w.progress_at <= limit:
                    continue
                self._gave_up = (f"{w.name}: no progress for {limit:g}s in --once mode "
                                 f"({w.outcomes.failure_summary()}); giving up with "
                                 f"{w.once_pending or 'entries still pending'} "
                                 "(once_timeout_s)")
                stop.set()
                for t in self._tasks:
                    t.cancel()
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), min(1.0, limit / 10))

    async def _wait(self, stop: asyncio.Event) -> int:
        rc = 0
        pending: set[asyncio.Task[Any]] = set(self._tasks)
        stopper = asyncio.create_task(stop.wait())
        while pending:
            done, pending = await asyncio.wait(pending | {stopper},
                                               return_when=asyncio.FIRST_COMPLETED)
            pending.discard(stopper)
            for t in done:
                if t is stopper or t.cancelled():
                    continue
                exc = t.exception()
                if isinstance(exc, FatalStoreError):  # its trace is in the trace log already
                    self._fatal = self._fatal or exc
                    rc = 1
                    stop.set()
                elif exc is not None:
                    log.error("%s failed: %s", t.get_name(), exc, exc_info=exc)
                    rc = 1
                    stop.set()
            if stop.is_set():
                break
        stopper.cancel()
        if pending:
            finished, unfinished = await asyncio.wait(
                pending, timeout=self.settings.shutdown_timeout_s or None)
            for t in unfinished:
                log.warning("%s: in-flight work did not finish within %.0fs; abandoned "
                            "(nothing of it was pulled: it is published again later)",
                            t.get_name(), self.settings.shutdown_timeout_s)
                t.cancel()
            if unfinished:
                await asyncio.gather(*unfinished, return_exceptions=True)
            for t in finished:
                if not t.cancelled() and t.exception() is not None:
                    log.error("%s failed: %s", t.get_name(), t.exception())
                    rc = 1
        return rc

    async def _measure_left(self) -> None:
        """``--once``: what is left in each collection (every partition) after the run."""
        for w in self.workers:
            try:
                self.once_left[w.name] = (await pending_entries(w.coll),
                                          await w.timers.due_left())
            except PyMongoError as exc:
                log.debug("measuring what is left of %s failed: %s", w.name, exc)

    async def _measure_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self._measure_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.metrics_interval_s)

    async def _measure_once(self) -> None:
        for w in self.workers:
            try:
                await w.measure_backlog()
            except PyMongoError as exc:
                log.debug("backlog measurement of %s failed: %s", w.name, exc)

    async def _effect_router(self, db: Any) -> Publisher:
        """The publisher wrapped so that effect entries are executed (dispatcher.effects)."""
        router, self._sync_client = await effect_router(
            db, self.publisher, self.effects, settings=self.settings, store=self.store,
            metrics=self.metrics, faults=self.faults)
        return router

    async def _close(self) -> None:
        if self.metrics_server is not None:
            await self.metrics_server.close()
        try:
            await self.publisher.close()
        except Exception as exc:
            log.warning("closing publisher %s: %s", self.publisher.name, exc)
        if self._own_client and self._client is not None:
            await self._client.close()
            self._client = None
        if self._sync_client is not None:
            self._sync_client.close()
            self._sync_client = None

