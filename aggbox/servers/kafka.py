"""A real single-node Kafka broker (KRaft, combined broker + controller) for tests.

:func:`start_local_kafka` resolves ``org.apache.kafka:kafka_2.13`` (:data:`KAFKA_VERSION`,
``poms/kafka.xml``) from Maven Central into the aggbox cache once, formats a storage
directory in a temporary directory (``kafka.tools.StorageTool format --standalone``) and
runs ``kafka.Kafka`` with ``-Xmx512m`` on two free loopback ports (broker and controller).
Replication factors are 1, ``group.initial.rebalance.delay.ms=0`` and
``auto.create.topics.enable=true``. Readiness is an ``AdminClient.list_topics`` that sees
the broker.

The handle can :meth:`~LocalKafka.kill` (SIGKILL) and :meth:`~LocalKafka.restart` the broker
on the same ports and log directory, e.g. to test "broker down for 30 s". The broker runs
under aggbox's ``AggboxStdinGuard`` so it exits when this process dies; it is also stopped
at interpreter exit. Its log is ``<work dir>/kafka.log``.

Needs Java 17 (and Maven for the first resolution) and ``confluent-kafka`` (the ``kafka``
extra) for readiness checks and :func:`create_topic`. ``AGGBOX_CACHE_DIR`` sets the cache.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from aggbox.servers import _process, maven
from aggbox.servers.errors import ServerError

__all__ = [
    "DEFAULT_MESSAGE_MAX_BYTES",
    "KAFKA_VERSION",
    "LocalKafka",
    "create_topic",
    "start_local_kafka",
    "wait_for_kafka",
]

#: Kafka version of ``poms/kafka.xml``.
KAFKA_VERSION = "4.4.0"

#: ``message.max.bytes`` of the local broker unless overridden: Kafka's own default
#: (1 MiB + record batch overhead), so "message too large" behaves as in production.
DEFAULT_MESSAGE_MAX_BYTES = 1_048_588

_POM = "kafka"
_GUARD = "AggboxStdinGuard"
_PORT_ATTEMPTS = 5

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = OUT
logger.state_change.name = state.change.logger
logger.state_change.level = warn
logger.request.name = kafka.request.logger
logger.request.level = warn
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = warn
"""


def _require_confluent_kafka() -> Any:
    try:
        import confluent_kafka
        import confluent_kafka.admin
    except ImportError as exc:  # pragma: no cover - the dev environment has it
        raise ServerError(
            "confluent-kafka is needed to talk to the local Kafka broker; "
            "install it with `pip install 'aggbox[kafka]'`"
        ) from exc
    return confluent_kafka


def _admin(bootstrap_servers: str) -> Any:
    ck = _require_confluent_kafka()
    return ck.admin.AdminClient(
        {
            "bootstrap.servers": bootstrap_servers,
            "socket.connection.setup.timeout.ms": 2000,
            "reconnect.backoff.max.ms": 500,
            # connection-refused noise while the broker boots is expected: errors only
            "log_level": 3,
        }
    )


def wait_for_kafka(bootstrap_servers: str, timeout: float = 60.0) -> None:
    """Block until a broker at ``bootstrap_servers`` answers a metadata request.

    :class:`ServerError` after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    admin = _admin(bootstrap_servers)
    last: BaseException | None = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ServerError(
                f"no Kafka broker answered at {bootstrap_servers} within {timeout:g} s"
                + (f" (last error: {last})" if last else "")
            )
        try:
            metadata = admin.list_topics(timeout=max(0.2, min(2.0, remaining)))
            if metadata.brokers:
                return
        except Exception as exc:  # confluent_kafka.KafkaException
            last = exc
        time.sleep(0.1)


def create_topic(
    bootstrap_servers: str,
    name: str,
    partitions: int = 1,
    *,
    replication_factor: int = 1,
    config: Mapping[str, str] | None = None,
    exist_ok: bool = False,
    timeout: float = 30.0,
) -> None:
    """Create topic ``name`` and wait until every partition has a leader.

    ``exist_ok=True`` accepts an existing topic (its partition count is not checked).
    """
    ck = _require_confluent_kafka()
    admin = _admin(bootstrap_servers)
    topic = ck.admin.NewTopic(
        name,
        num_partitions=partitions,
        replication_factor=replication_factor,
        config=dict(config or {}),
    )
    futures = admin.create_topics([topic], operation_timeout=timeout, request_timeout=timeout)
    try:
        futures[name].result(timeout=timeout)
    except ck.KafkaException as exc:
        error: Any = exc.args[0] if exc.args else None
        code = error.code() if hasattr(error, "code") else None
        if not (exist_ok and code == ck.KafkaError.TOPIC_ALREADY_EXISTS):
            raise ServerError(f"cannot create Kafka topic {name!r}: {exc}") from exc
    deadline = time.monotonic() + timeout
    while True:
        metadata = admin.list_topics(topic=name, timeout=timeout)
        described = metadata.topics.get(name)
        if (
            described is not None
            and described.error is None
            and described.partitions
            and all(p.leader >= 0 for p in described.partitions.values())
        ):
            return
        if time.monotonic() >= deadline:
            raise ServerError(f"Kafka topic {name!r} has no leader after {timeout:g} s")
        time.sleep(0.1)


class LocalKafka:
    """Handle on a broker started by :func:`start_local_kafka` (a context manager).

    ``bootstrap_servers`` stays the same across :meth:`restart`. :meth:`stop` ends it for good
    (and deletes the data unless ``keep_data=True``); :meth:`kill` simulates a crash;
    :meth:`start` / :meth:`restart` bring it back on the same ports and log directory.
    """

    def __init__(
        self,
        *,
        work_dir: Path,
        broker_port: int,
        controller_port: int,
        argv: Sequence[str],
        ready_timeout: float,
    ) -> None:
        self.work_dir = work_dir
        self.broker_port = broker_port
        self.controller_port = controller_port
        self.bootstrap_servers = f"127.0.0.1:{broker_port}"
        self.ready_timeout = ready_timeout
        self._process = _process.ServerProcess(
            "kafka", argv, work_dir / "kafka.log", watch_stdin=True, cwd=work_dir
        )
        self._removed = False

    @property
    def log_path(self) -> Path:
        """The broker's log (all starts of this handle, appended)."""
        return self._process.log_path

    @property
    def data_dir(self) -> Path:
        """``log.dirs`` of the broker (topic data and KRaft metadata)."""
        return self.work_dir / "data"

    @property
    def is_running(self) -> bool:
        return self._process.is_running()

    def start(self, timeout: float | None = None) -> None:
        """Start the broker (after :meth:`kill` or ``stop(keep_data=True)``) and wait for it."""
        if self._removed:
            raise ServerError("this Kafka broker was stopped and its data deleted; start a new one")
        if self.is_running:
            return
        limit = self.ready_timeout if timeout is None else timeout
        self._process.start()
        _process.register_for_exit(self)
        self._process.wait_ready(
            lambda: _process.port_accepts(self.broker_port), limit, what="(broker port)"
        )
        try:
            wait_for_kafka(self.bootstrap_servers, limit)
        except ServerError as exc:
            self._process.stop()
            raise self._process.failure(str(exc)) from exc

    def stop(self, *, keep_data: bool = False, timeout: float = 30.0) -> None:
        """Shut the broker down (SIGTERM; SIGKILL after ``timeout`` s); idempotent.

        Deletes the working directory unless ``keep_data`` (then :meth:`start` can resume).
        """
        self._process.stop(timeout=timeout)
        if not keep_data:
            _process.unregister_for_exit(self)
            if not self._removed:
                shutil.rmtree(self.work_dir, ignore_errors=True)
                self._removed = True

    def kill(self) -> None:
        """SIGKILL the broker (a crash; data kept, :meth:`start` recovers it)."""
        self._process.kill()

    def restart(self, timeout: float | None = None) -> None:
        """Stop (gracefully, if running) and start again: same ports, same data."""
        self.stop(keep_data=True)
        self.start(timeout)

    def __enter__(self) -> LocalKafka:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_running else "stopped"
        return f"LocalKafka({self.bootstrap_servers}, {state}, work_dir={str(self.work_dir)!r})"


def _cluster_id() -> str:
    """A Kafka cluster id (base64url of 16 bytes). Never starting with '-': the storage tool's
    argument parser would take such an id for an option (1 start in 64 failed that way)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not cid.startswith("-"):
            return cid


def _properties(
    *,
    data_dir: Path,
    broker_port: int,
    controller_port: int,
    message_max_bytes: int,
    extra: Mapping[str, str],
) -> str:
    props: dict[str, str] = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.bootstrap.servers": f"127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{broker_port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{broker_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data_dir),
        "num.partitions": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        # after a SIGKILL the restarted broker cannot register until the controller expires
        # the old registration: keep that wait short (default 9 s)
        "broker.session.timeout.ms": "3000",
        "broker.heartbeat.interval.ms": "500",
        "auto.create.topics.enable": "true",
        "message.max.bytes": str(message_max_bytes),
        "log.retention.hours": "168",
        "log.segment.bytes": str(64 * 1024 * 1024),
    }
    props.update(extra)
    return "".join(f"{k}={v}\n" for k, v in props.items())


def start_local_kafka(
    *,
    timeout: float = 120.0,
    message_max_bytes: int = DEFAULT_MESSAGE_MAX_BYTES,
    extra_config: Mapping[str, str] | None = None,
    heap: str = "512m",
    java_options: Sequence[str] = (),
) -> LocalKafka:
    """Start a single-node KRaft broker on loopback and wait until it answers.

    ``extra_config`` adds or overrides ``server.properties`` entries (e.g.
    ``{"num.partitions": "3"}``); ``timeout`` bounds the start (not the first Maven
    resolution). Raises :class:`ServerError` with the broker log if it does not come up.
    """
    _require_confluent_kafka()
    java = maven.java_executable()
    jars = maven.resolve_classpath(_POM)
    guard = maven.compile_java(_GUARD, [])
    classpath = maven.classpath_string([guard, *jars])
    jvm_base = [java, f"-Xmx{heap}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                "-Djava.awt.headless=true"]
    last_error: ServerError | None = None
    for _attempt in range(_PORT_ATTEMPTS):
        kafka = _prepare(jvm_base, [*java_options, "-cp", classpath], timeout=timeout,
                         message_max_bytes=message_max_bytes, extra=extra_config or {})
        try:
            kafka.start()
        except ServerError as exc:
            bind_failed = "Address already in use" in _process.log_tail(kafka.log_path)
            if not bind_failed:
                raise  # keep the work dir: its log is named in the message
            kafka.stop()
            last_error = exc
            continue
        return kafka
    assert last_error is not None
    raise last_error


def _prepare(jvm_base: Sequence[str], jvm_tail: Sequence[str], *, timeout: float,
             message_max_bytes: int, extra: Mapping[str, str]) -> LocalKafka:
    """A fresh work directory with ``server.properties`` on free ports and formatted storage;
    the (not yet started) broker."""
    work_dir = Path(tempfile.mkdtemp(prefix="aggbox-kafka-"))
    broker_port, controller_port = _process.free_ports(2)
    props_path = work_dir / "server.properties"
    props_path.write_text(
        _properties(data_dir=work_dir / "data", broker_port=broker_port,
                    controller_port=controller_port, message_max_bytes=message_max_bytes,
                    extra=extra),
        encoding="utf-8",
    )
    log4j = work_dir / "log4j2.properties"
    log4j.write_text(_LOG4J2, encoding="utf-8")
    jvm = [*jvm_base, f"-Dlog4j2.configurationFile={log4j}",
           f"-Dkafka.logs.dir={work_dir / 'logs'}", *jvm_tail]
    _format_storage(jvm, props_path, work_dir)
    return LocalKafka(work_dir=work_dir, broker_port=broker_port,
                      controller_port=controller_port,
                      argv=[*jvm, _GUARD, "kafka.Kafka", str(props_path)], ready_timeout=timeout)


def _format_storage(jvm: Sequence[str], props_path: Path, work_dir: Path) -> None:
    cmd = [
        *jvm,
        "kafka.tools.StorageTool",
        "format",
        "--standalone",
        f"--cluster-id={_cluster_id()}",
        "-c",
        str(props_path),
    ]
    log = work_dir / "format.log"
    with open(log, "wb") as out:
        try:
            done = subprocess.run(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, timeout=120
            )
        except subprocess.TimeoutExpired as exc:
            raise ServerError(f"formatting Kafka storage timed out; log: {log}") from exc
    if done.returncode != 0:
        text = _process.log_tail(log, 4000)
        raise ServerError(
            f"`kafka.tools.StorageTool format` failed (exit {done.returncode}); log: {log}\n{text}"
        )
