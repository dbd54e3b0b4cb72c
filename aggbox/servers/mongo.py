"""A MongoDB server for tests and for the embedded default.

:func:`start_local_mongodb` picks, in this order:

1. ``AGGBOX_MONGODB_URI`` when set — used as is (kind ``"external"``; e.g. a real replica
   set: ``mongod --replSet rs0`` then ``rs.initiate()``). Nothing is started or stopped.
2. a ``mongod`` found on PATH, started as a one-node replica set ``rs0`` on a free loopback
   port with its data in a temporary directory (kind ``"mongod"``).
3. mongo-java-server (``de.bwaldvogel:mongo-java-server``, in memory, oplog enabled; kind
   ``"mongo-java-server"``), resolved from Maven Central into the aggbox cache once and run
   by aggbox's launcher ``java/AggboxMongoServer.java`` (compiled once). Needs Java 17 (and
   Maven for the first resolution).

Environment variables:

``AGGBOX_MONGODB_URI``
    connection string of an existing server; takes precedence over everything else.
``AGGBOX_LOCAL_MONGO``
    ``auto`` (default): ``mongod`` on PATH, else mongo-java-server;
    ``mjs``: always mongo-java-server, even when ``mongod`` is on PATH (testing the stand-in);
    ``mongod``: always ``mongod``; an error if it is not on PATH.
``AGGBOX_CACHE_DIR``
    where jars and the compiled launcher are cached (see :mod:`aggbox.servers.maven`).

mongo-java-server is a stand-in with limits, reported by :class:`MongoCapabilities`: no
sessions/transactions, no 16 MB check on updates, partial change streams (``watch()`` needs
``start_at_operation_time``/``resume_after``/``start_after``; events lack
``updateDescription``, ``ns`` and ``wallTime``; ``getMore`` does not wait), no ``hello``
command (use ``isMaster``). Code must rely on ``operationType`` and ``fullDocument`` (with
``full_document="updateLookup"``) only, and pace ``try_next()`` itself.

Servers started here are stopped by :meth:`LocalMongo.stop`, at the end of a ``with`` block,
at interpreter exit, and when this process dies (the Java launcher exits when its stdin pipe
closes; ``mongod`` is terminated by a small sidecar process).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from pymongo import MongoClient
from pymongo.errors import OperationFailure, PyMongoError

from aggbox.servers import _process, maven, persistent
from aggbox.servers.capabilities import (
    MongoCapabilities,
    detect_capabilities,
    server_operation_time,
)
from aggbox.servers.errors import ServerError
from aggregates.core.uri import redact_uri

__all__ = [
    "MJS_VERSION",
    "LocalMongo",
    "MongoCapabilities",
    "MongoKind",
    "detect_capabilities",
    "mongodb_uri",
    "server_operation_time",
    "shared_local_mongodb",
    "start_local_mongodb",
    "start_mongo_java_server",
]

MongoKind = Literal["external", "mongod", "mongo-java-server"]

#: mongo-java-server version (see ``poms/mongo-java-server.xml``).
MJS_VERSION = "1.47.0"

_MJS_POM = "mongo-java-server"
_MJS_LAUNCHER = "AggboxMongoServer"
_MJS_READY = b"AGGBOX-MJS READY"
_MJS_BIND_FAILED_EXIT = 3  # exit status of the launcher when the port is taken
_REPLICA_SET = "rs0"
_MONGOD_ADDRESS_IN_USE_EXIT = 48  # mongod ExitCode::netError ("Address already in use")
_PORT_ATTEMPTS = 5
#: mongo-java-server started without its oplog: no change streams at all.
_MJS_WITHOUT_OPLOG = MongoCapabilities(
    change_streams=False, change_streams_complete=False, change_streams_await=False,
    sessions=False, transactions=False, enforces_16mb=False)




class LocalMongo:
    """Handle on the MongoDB used by tests/embedded mode; see :func:`start_local_mongodb`.

    ``uri`` is complete (for mongo-java-server it contains ``directConnection=true``).
    Usable as a context manager; :meth:`stop` is idempotent and a no-op for ``"external"``.
    """

    def __init__(
        self,
        uri: str,
        kind: MongoKind,
        capabilities: MongoCapabilities,
        *,
        process: _process.ServerProcess | None = None,
        work_dir: Path | None = None,
    ) -> None:
        self.uri = uri
        self.kind: MongoKind = kind
        self.capabilities = capabilities
        self._process = process
        self.work_dir = work_dir
        if process is not None:
            _process.register_for_exit(self)

    @property
    def log_path(self) -> Path | None:
        """The server's log file (``None`` for external servers)."""
        return self._process.log_path if self._process is not None else None

    @property
    def pid(self) -> int | None:
        """Process id of the server this handle started (None for an external server)."""
        return self._process.pid if self._process is not None else None

    @property
    def is_running(self) -> bool:
        return self._process.is_running() if self._process is not None else True

    def client(self, **kwargs: Any) -> MongoClient[dict[str, Any]]:
        """A new :class:`pymongo.MongoClient` for :attr:`uri` (close it when done)."""
        return MongoClient(self.uri, **kwargs)

    def stop(self) -> None:
        """Stop the server if this handle started it and delete its temporary directory."""
        if self._process is not None:
            self._process.stop()
            _process.unregister_for_exit(self)
        if self.work_dir is not None:
            shutil.rmtree(self.work_dir, ignore_errors=True)
            self.work_dir = None

    def __enter__(self) -> LocalMongo:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalMongo(kind={self.kind!r}, uri={redact_uri(self.uri)!r})"


def _mode() -> str:
    mode = os.environ.get("AGGBOX_LOCAL_MONGO", "auto").strip().lower() or "auto"
    if mode in ("mongo-java-server", "java"):
        mode = "mjs"
    if mode not in ("auto", "mjs", "mongod"):
        raise ServerError(
            f"AGGBOX_LOCAL_MONGO={mode!r} is not valid; use 'auto' (default), 'mjs' or 'mongod'"
        )
    return mode


def start_local_mongodb(*, timeout: float = 60.0, java_options: Sequence[str] = (),
                        oplog: bool = True) -> LocalMongo:
    """The MongoDB to use: ``AGGBOX_MONGODB_URI``, else a new local server (see module doc).

    ``timeout`` bounds the start of a local server (not the first Maven resolution);
    ``java_options`` are extra JVM options for mongo-java-server (e.g. ``("-Xmx4g",)``);
    ``oplog=False`` starts mongo-java-server without its oplog (no change streams; its
    in-memory oplog is never trimmed, so a long benchmark without streams leaves it out).
    Raises :class:`ServerError` with the server log when it cannot be started or reached.
    """
    uri = os.environ.get("AGGBOX_MONGODB_URI", "").strip()
    if uri:
        return _external(uri, timeout)
    mode = _mode()
    mongod = shutil.which("mongod")
    if mode == "mongod" and mongod is None:
        raise ServerError(
            "AGGBOX_LOCAL_MONGO=mongod but no `mongod` on PATH; install MongoDB or unset it"
        )
    if mode != "mjs" and mongod is not None:
        return _start_mongod(mongod, timeout)
    return _start_mjs(timeout, java_options, oplog=oplog)


def _external(uri: str, timeout: float) -> LocalMongo:
    client: MongoClient[dict[str, Any]] = MongoClient(
        uri, serverSelectionTimeoutMS=int(timeout * 1000)
    )
    try:
        client.admin.command("ping")
        capabilities = detect_capabilities(client)
    except PyMongoError as exc:
        raise ServerError(
            f"cannot reach the MongoDB of AGGBOX_MONGODB_URI={redact_uri(uri)!r}: {exc}. "
            "Start it (e.g. `mongod --replSet rs0` then `rs.initiate()`) or unset the variable "
            "to use a local server."
        ) from exc
    finally:
        client.close()
    return LocalMongo(uri, "external", capabilities)


def _ping(uri: str) -> bool:
    client: MongoClient[dict[str, Any]] = MongoClient(
        uri, serverSelectionTimeoutMS=500, connectTimeoutMS=500
    )
    try:
        client.admin.command("ping")
        return True
    finally:
        client.close()


def start_mongo_java_server(*, timeout: float = 60.0, oplog: bool = True) -> LocalMongo:
    """A new mongo-java-server, whatever ``AGGBOX_MONGODB_URI`` and ``AGGBOX_LOCAL_MONGO``
    say. ``oplog=False``: no oplog, so ``$changeStream`` is refused as on a standalone
    ``mongod`` (tests of the polling fallback, e.g. ``aggbox check-store``'s)."""
    return _start_mjs(timeout, (), oplog=oplog)


def _start_mjs(timeout: float, java_options: Sequence[str], *, oplog: bool = True
               ) -> LocalMongo:
    java = maven.java_executable()
    jars = maven.resolve_classpath(_MJS_POM)
    classes = maven.compile_java(_MJS_LAUNCHER, jars)
    classpath = maven.classpath_string([classes, *jars])
    work_dir = Path(tempfile.mkdtemp(prefix="aggbox-mjs-"))
    log_path = work_dir / "mongo-java-server.log"
    for _attempt in range(_PORT_ATTEMPTS):
        port = _process.free_port()
        argv = [
            java,
            "-XX:+UseParallelGC",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            *java_options,
            "-cp",
            classpath,
            _MJS_LAUNCHER,
            str(port),
            *(() if oplog else ("--no-oplog",)),
        ]
        proc = _process.ServerProcess("mongo-java-server", argv, log_path, watch_stdin=True)
        offset = log_path.stat().st_size if log_path.exists() else 0
        proc.start()

        def launcher_ready(_offset: int = offset) -> bool:
            with open(log_path, "rb") as f:
                f.seek(_offset)
                return _MJS_READY in f.read()

        try:
            proc.wait_ready(launcher_ready, timeout, what="(mongo-java-server)")
        except ServerError:
            if proc.returncode() == _MJS_BIND_FAILED_EXIT:
                proc.stop()
                continue  # the port was taken between choosing and binding: try another
            raise
        uri = f"mongodb://127.0.0.1:{port}/?directConnection=true"
        proc.wait_ready(partial(_ping, uri), timeout, what="for pymongo (mongo-java-server)")
        return LocalMongo(
            uri,
            "mongo-java-server",
            MongoCapabilities.mongo_java_server() if oplog else _MJS_WITHOUT_OPLOG,
            process=proc,
            work_dir=work_dir,
        )
    raise ServerError(
        f"mongo-java-server could not bind a free loopback port in {_PORT_ATTEMPTS} attempts; "
        f"log: {log_path}\n{_process.log_tail(log_path)}"
    )


def _start_mongod(mongod: str, timeout: float) -> LocalMongo:
    work_dir = Path(tempfile.mkdtemp(prefix="aggbox-mongod-"))
    db_path = work_dir / "db"
    db_path.mkdir()
    log_path = work_dir / "mongod.log"
    for _attempt in range(_PORT_ATTEMPTS):
        port = _process.free_port()
        argv = [
            mongod,
            "--replSet",
            _REPLICA_SET,
            "--bind_ip",
            "127.0.0.1",
            "--port",
            str(port),
            "--dbpath",
            str(db_path),
            "--oplogSize",
            "256",
            "--wiredTigerCacheSizeGB",
            "0.5",
            "--setParameter",
            "diagnosticDataCollectionEnabled=false",
        ]
        proc = _process.ServerProcess("mongod", argv, log_path, watch_stdin=False)
        proc.start()
        direct = f"mongodb://127.0.0.1:{port}/?directConnection=true"
        try:
            proc.wait_ready(partial(_ping, direct), timeout, what="(mongod)")
        except ServerError:
            if proc.returncode() == _MONGOD_ADDRESS_IN_USE_EXIT:
                proc.stop()
                continue  # the port was taken between choosing and binding: try another
            raise
        try:
            _initiate_replica_set(direct, port, timeout)
        except (PyMongoError, ServerError) as exc:
            proc.stop()
            raise proc.failure(
                f"mongod started but the replica set did not initiate: {exc}"
            ) from exc
        uri = f"mongodb://127.0.0.1:{port}/?replicaSet={_REPLICA_SET}"
        return LocalMongo(
            uri, "mongod", MongoCapabilities.replica_set(), process=proc, work_dir=work_dir
        )
    raise ServerError(
        f"mongod could not bind a free loopback port in {_PORT_ATTEMPTS} attempts; "
        f"log: {log_path}\n{_process.log_tail(log_path)}"
    )


def _initiate_replica_set(direct_uri: str, port: int, timeout: float) -> None:
    client: MongoClient[dict[str, Any]] = MongoClient(
        direct_uri, serverSelectionTimeoutMS=int(timeout * 1000)
    )
    try:
        config = {"_id": _REPLICA_SET, "members": [{"_id": 0, "host": f"127.0.0.1:{port}"}]}
        try:
            client.admin.command("replSetInitiate", config)
        except OperationFailure as exc:
            if exc.code != 23:  # AlreadyInitialized
                raise
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if client.admin.command("hello").get("isWritablePrimary"):
                return
            time.sleep(0.1)
        raise ServerError(f"the one-node replica set did not elect a primary in {timeout:g} s")
    finally:
        client.close()


_shared: LocalMongo | None = None
_shared_lock = threading.Lock()


def shared_local_mongodb() -> LocalMongo:
    """One :func:`start_local_mongodb` per process, started on first use, stopped at exit."""
    global _shared
    with _shared_lock:
        if _shared is None or not _shared.is_running:
            _shared = start_local_mongodb()
        return _shared


def mongodb_uri() -> str:
    """The MongoDB of a command given no URI: ``AGGBOX_MONGODB_URI`` if set, else the server
    of ``aggbox local start`` if it runs (:mod:`aggbox.servers.persistent`), else the URI of
    :func:`shared_local_mongodb`, a throw-away server (announced on stderr).

    The embedded default: the first call may start a local server (seconds; the very first
    run on a machine also downloads jars).
    """
    uri = os.environ.get("AGGBOX_MONGODB_URI", "").strip()
    if uri:
        return uri
    local = persistent.running_local_server()
    if local is not None:
        return local.uri
    if _shared is None or not _shared.is_running:
        persistent.warn_throwaway_server()
    return shared_local_mongodb().uri
