"""Kafka through confluent-kafka (librdkafka): idempotent producer, ``acks=all``.

Idempotence keeps records of one partition in produce order across the producer's own
retries, and every record is keyed (by the emitting aggregate's id by default), so the
records of one aggregate reach their partition in emission order.

``publish`` produces every record, then waits for all delivery reports (served by a
background thread calling ``poll``). Broker outages are retried inside librdkafka until
``delivery_timeout_s``; what then still fails comes back *retryable* and the dispatcher backs
off. Records the broker will never accept (too large, invalid topic name, policy) come back
*permanent* and are dead-lettered.

librdkafka's own log lines (e.g. one "Connect to … failed" per reconnect attempt while the
broker is down) go through the ``aggbox.dispatcher.kafka`` logger, at most one line per
distinct message (numbers ignored) per :data:`LOG_INTERVAL_S`; the next one says how many
were suppressed.

A broker never reached since start is :attr:`KafkaPublisher.unreachable` (one line): set
once a delivery failed while librdkafka reported every broker down and no metadata request
ever succeeded (``--once`` then ends at once instead of retrying until ``once_timeout_s``)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from aggregates.core.reasons import Reason
from dispatcher.core.settings import RecordFormat
from dispatcher.publishers.base import PublisherError, PublishResult
from dispatcher.publishers.formats import encode_failure, kafka_record
from dispatcher.publishers.record import OutboundRecord

__all__ = ["LOG_INTERVAL_S", "KafkaPublisher", "RateLimitedLog", "valid_topic_name"]

log = logging.getLogger("aggbox.dispatcher.kafka")

_TOPIC_RE: Final = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

# librdkafka error codes (confluent_kafka.KafkaError) that no retry will fix.
_TOO_LARGE: Final = frozenset({10, 18})  # MSG_SIZE_TOO_LARGE, RECORD_LIST_TOO_LARGE
_INVALID_TOPIC: Final = frozenset({17})  # TOPIC_EXCEPTION
_REJECTED: Final = frozenset({87, 44, -186})  # INVALID_RECORD, POLICY_VIOLATION, _INVALID_ARG
_FATAL: Final = -150
# librdkafka's reports of brokers it cannot reach (error_cb): _ALL_BROKERS_DOWN, and the
# causes worth quoting, _TRANSPORT (connection refused, reset) and _RESOLVE (DNS).
_ALL_BROKERS_DOWN: Final = -187
_UNREACHABLE_CAUSES: Final = frozenset({-195, -193})

#: Settings the dispatcher's guarantees depend on; ``kafka_config`` cannot override them.
FORCED_CONFIG: Final[Mapping[str, Any]] = {"enable.idempotence": True, "acks": "all"}

#: librdkafka log lines: at most one per distinct message per this many seconds.
LOG_INTERVAL_S: Final = 60.0
_NUMBERS: Final = re.compile(r"\d+")


class RateLimitedLog:
    """The ``logger`` handed to librdkafka (it calls ``log(level, fmt, *args)`` from the poll
    thread): forwards to ``target`` at most one record per distinct message per
    ``interval_s``, numbers (timestamps, counts, ports, instance names) ignored when
    comparing; the first line after a quiet spell counts what was suppressed."""

    def __init__(self, target: logging.Logger, *, interval_s: float = LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, max_keys: int = 1000) -> None:
        self.target = target
        self.interval_s = interval_s
        self._clock = clock
        self._max_keys = max_keys
        self._seen: dict[str, tuple[float, int]] = {}  # key → (last emitted, suppressed)
        self._lock = threading.Lock()

    def log(self, level: int, msg: str, *args: Any, **kwargs: Any) -> None:
        if not self.target.isEnabledFor(level):
            return
        text = msg % args if args else str(msg)
        key = _NUMBERS.sub("#", text)
        now = self._clock()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last[0] < self.interval_s:
                self._seen[key] = (last[0], last[1] + 1)
                return
            suppressed, since = (last[1], now - last[0]) if last is not None else (0, 0.0)
            self._seen[key] = (now, 0)
            if len(self._seen) > self._max_keys:
                cutoff = now - self.interval_s
                self._seen = {k: v for k, v in self._seen.items() if v[0] >= cutoff}
        if suppressed:
            text += f" ({suppressed} more like it in the last {since:.0f}s)"
        self.target.log(level, "librdkafka: %s", text)


@functools.lru_cache(maxsize=4096)  # called per record, with few distinct topics
def valid_topic_name(topic: str) -> bool:
    """Kafka's rule: 1–249 of ``[A-Za-z0-9._-]``, not ``.`` or ``..``."""
    return bool(_TOPIC_RE.match(topic)) and topic not in (".", "..")


def classify(code: int, text: str) -> PublishResult:
    """A librdkafka error → the dispatcher's view of it."""
    if code in _TOO_LARGE:
        return PublishResult.permanent(Reason.MESSAGE_TOO_LARGE, text)
    if code in _INVALID_TOPIC:
        return PublishResult.permanent(Reason.INVALID_TOPIC, text)
    if code in _REJECTED:
        return PublishResult.permanent(Reason.REJECTED_BY_BROKER, text)
    return PublishResult.retryable(text)


class _Batch:
    """Collects the delivery reports of one ``publish`` call (reports arrive on the poll
    thread; the waiting coroutine is woken through the event loop)."""

    def __init__(self, n: int, loop: asyncio.AbstractEventLoop) -> None:
        self.results: list[PublishResult | None] = [None] * n
        self.remaining = n
        self.loop = loop
        self.done = loop.create_future()
        self._lock = threading.Lock()
        if n == 0:
            self.done.set_result(None)

    def settle(self, index: int, result: PublishResult) -> None:
        with self._lock:
            if self.results[index] is not None:
                return
            self.results[index] = result
            self.remaining -= 1
            finished = self.remaining == 0
        if finished:
            # RuntimeError: the loop is closed, nobody waits for this batch any more
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self._finish)

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def report(self, index: int, err: Any, _msg: Any) -> None:
        if err is None:
            self.settle(index, PublishResult.ok())
        else:
            self.settle(index, classify(err.code(), err.str()))


class KafkaPublisher:
    """See the module documentation. ``config`` adds librdkafka settings (e.g. security);
    ``record_format`` ``cloudevents`` sends CloudEvents in binary content mode
    (:mod:`dispatcher.publishers.formats`)."""

    name = "kafka"

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        config: Mapping[str, Any] | None = None,
        delivery_timeout_s: float = 60.0,
        record_format: RecordFormat = "aggbox",
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.record_format: RecordFormat = record_format
        self.delivery_timeout_s = delivery_timeout_s
        self.config: dict[str, Any] = {
            "bootstrap.servers": bootstrap_servers,
            "linger.ms": 5,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 200_000,
            "message.timeout.ms": int(delivery_timeout_s * 1000),
            "max.in.flight.requests.per.connection": 5,
            "reconnect.backoff.max.ms": 2000,
            "log_level": 4,
            **dict(config or {}),
            **FORCED_CONFIG,
        }
        self._producer: Any = None
        self._closing = threading.Event()
        self._fatal: str | None = None
        self._thread: threading.Thread | None = None
        self._rdkafka_log = RateLimitedLog(log)
        #: a broker answered since start (a delivery or a metadata request succeeded)
        self._reached = False
        #: librdkafka said every broker is down; the last cause it gave (error_cb)
        self._all_down = False
        self._down_cause: str | None = None
        self._unreachable: str | None = None

    @property
    def unreachable(self) -> str | None:
        """One line when no broker was ever reached since start (see the module
        documentation), else ``None``."""
        return self._unreachable

    async def start(self) -> None:
        try:
            import confluent_kafka
        except ImportError as exc:
            raise PublisherError(
                "the kafka publisher needs confluent-kafka: pip install 'aggbox[dispatcher]'"
            ) from exc
        try:
            self._producer = confluent_kafka.Producer({**self.config,
                                                      "error_cb": self._on_error,
                                                      "logger": self._rdkafka_log})
        except confluent_kafka.KafkaException as exc:
            raise PublisherError(
                f"invalid Kafka producer configuration: {exc}; check kafka_config"
            ) from exc
        self._closing.clear()
        self._thread = threading.Thread(target=self._poll_loop, name="aggbox-kafka-poll",
                                        daemon=True)
        self._thread.start()

    def _on_error(self, err: Any) -> None:
        if err.code() == _ALL_BROKERS_DOWN:
            self._all_down = True
        elif err.code() in _UNREACHABLE_CAUSES:
            self._down_cause = err.str()
        if err.fatal():
            self._fatal = err.str()
            log.error("kafka producer fatal error: %s; the producer is recreated", err.str())
        else:
            log.debug("kafka client error: %s", err.str())

    def _poll_loop(self) -> None:
        producer = self._producer
        while not self._closing.is_set():
            producer.poll(0.05)

    async def _recreate_if_fatal(self) -> None:
        if self._fatal is None:
            return
        self._fatal = None
        await self.close()
        await self.start()

    async def publish(self, records: Sequence[OutboundRecord]) -> list[PublishResult]:
        if self._producer is None:
            raise PublisherError("KafkaPublisher.publish called before start()")
        await self._recreate_if_fatal()
        import confluent_kafka

        loop = asyncio.get_running_loop()
        batch = _Batch(len(records), loop)
        producer = self._producer
        for i, r in enumerate(records):
            if not valid_topic_name(r.topic):
                batch.settle(i, PublishResult.permanent(
                    Reason.INVALID_TOPIC, f"{r.topic!r} is not a valid Kafka topic name "
                    "(1-249 of A-Z a-z 0-9 . _ -)"))
                continue
            try:  # a record that cannot be encoded is dead-lettered alone
                value, headers = kafka_record(r, self.record_format)
                key = r.key.encode()
            except Exception as exc:
                batch.settle(i, encode_failure(r, f"a Kafka record ({self.record_format})",
                                               exc))
                continue
            while True:
                try:
                    producer.produce(r.topic, value=value, key=key, headers=headers,
                                     on_delivery=lambda err, msg, i=i: batch.report(i, err, msg))
                    break
                except BufferError:  # local queue full: let the poll thread drain it
                    await asyncio.sleep(0.005)
                except confluent_kafka.KafkaException as exc:
                    err = exc.args[0]
                    batch.settle(i, classify(err.code(), err.str()))
                    break
                except (TypeError, ValueError, UnicodeError) as exc:  # refused by the client
                    batch.settle(i, encode_failure(r, f"a Kafka record ({self.record_format})",
                                                   exc))
                    break
        try:
            await asyncio.wait_for(asyncio.shield(batch.done), self.delivery_timeout_s + 30)
        except TimeoutError:
            for i in range(len(records)):
                batch.settle(i, PublishResult.retryable("no delivery report in time"))
        results = [r if r is not None else PublishResult.retryable("no report")
                   for r in batch.results]
        if not self._reached:
            await self._check_reached(results)
        return results

    async def _check_reached(self, results: list[PublishResult]) -> None:
        """Note a broker answering; after failed deliveries with every broker reported down,
        ask for metadata once: no answer either means no broker was ever reached."""
        if any(r.status == "ok" for r in results):
            self._reached = True
            return
        if not self._all_down or not any(r.status == "retryable" for r in results):
            return
        producer = self._producer
        if producer is None:
            return
        import confluent_kafka

        try:
            await asyncio.to_thread(producer.list_topics,
                                    timeout=min(2.0, max(0.5, self.delivery_timeout_s)))
        except confluent_kafka.KafkaException as exc:
            cause = self._down_cause or exc.args[0].str()
            cause = cause if len(cause) <= 120 else cause[:117] + "..."
            self._unreachable = (
                f"no Kafka broker reachable at {self.bootstrap_servers[:80]} ({cause}); check "
                "that the brokers run and that --bootstrap-servers names them")
            return
        self._reached = True

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        self._closing.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None
        # Outstanding records were reported already (publish waits for all of them) unless
        # a publish was abandoned (a stop, --once giving up): drop those, they are still in
        # the outbox and go out again later.
        if await asyncio.to_thread(producer.flush, 5.0):
            producer.purge(in_queue=True, in_flight=True, blocking=False)
            await asyncio.to_thread(producer.flush, 1.0)
