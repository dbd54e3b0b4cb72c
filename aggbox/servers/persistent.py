"""The one local MongoDB that outlives a command (``aggbox local start|status|stop``).

Without ``AGGBOX_MONGODB_URI`` each ``aggbox`` command would start its own throw-away server
(:func:`aggbox.servers.mongodb_uri`), so ``aggbox run`` and ``aggbox dispatch`` would not see
each other's data. :func:`start_persistent_mongodb` starts one mongo-java-server as a detached
background process (its own session, ``stdin`` from ``/dev/null``, output to a log file) and
records it in a state file; :func:`running_local_server` finds it again from any command.

The server is mongo-java-server with its H2 (MVStore) backend
(``de.bwaldvogel:mongo-java-server-h2-backend``), launched by ``java/h2server/`` (main class
``AggboxMongoH2Server``):
the same stand-in as the throw-away server (same capabilities: oplog and the partial change
streams the dispatcher uses), with its data in one file, so it survives ``aggbox local stop``
and the next ``aggbox local start``. H2 commits about once a second, so a crash (SIGKILL,
power loss) may lose the last second of writes; ``aggbox local stop`` closes the file cleanly.

The launcher replaces mongo-java-server's oplog (never trimmed, read whole by every change-stream
read) with a bounded one indexed by timestamp, and registers H2's version for every request
(without it, long reads under writes failed with ``MVStoreException: Chunk N not found``); see
the comments in ``java/h2server/`` and docs/design.md "The local server". The oplog keeps at most
``AGGBOX_LOCAL_OPLOG_MAX_ENTRIES`` entries (default 250,000) and none older than
``AGGBOX_LOCAL_OPLOG_MAX_HOURS`` (default 168, a week), trimmed every
``AGGBOX_LOCAL_OPLOG_TRIM_INTERVAL_S`` seconds (default 10); ``0`` turns a bound off. A change
stream resumed from a trimmed point fails with code 286 (ChangeStreamHistoryLost), as on MongoDB.

Files under the state directory (``$AGGBOX_HOME``, default ``~/.aggbox``)::

    local-mongodb.json       state: pid, port, uri, started_at, kind, data, log (atomic writes)
    local-mongodb.lock       fcntl lock serialising start/stop
    mongodb/aggbox.mv        the data (H2 MVStore file)
    mongodb/server.log       the server's output

A state file whose pid is gone, is not our launcher, or whose port does not answer is stale:
it is ignored and removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aggbox.servers import _process, maven
from aggbox.servers.errors import ServerError
from aggregates.core.files import write_atomic

__all__ = [
    "LOCAL_KIND",
    "LocalServerState",
    "home_dir",
    "local_mongodb_uri",
    "running_local_server",
    "start_persistent_mongodb",
    "state_path",
    "stop_persistent_mongodb",
    "warn_throwaway_server",
]

#: ``kind`` recorded in the state file.
LOCAL_KIND = "mongo-java-server-h2"

_POM = "mongo-java-server-h2"
_LAUNCHER = "AggboxMongoH2Server"
#: The launcher's sources: the folder ``aggbox/servers/java/h2server/``, compiled together.
_SOURCES = "h2server"
_READY = b"AGGBOX-MJS READY"
_BIND_FAILED_EXIT = 3
_PORT_ATTEMPTS = 5
_STATE_FILE = "local-mongodb.json"

#: The oplog's bounds (environment variable, default); 0 turns a bound off.
OPLOG_MAX_ENTRIES_ENV = "AGGBOX_LOCAL_OPLOG_MAX_ENTRIES"
OPLOG_MAX_HOURS_ENV = "AGGBOX_LOCAL_OPLOG_MAX_HOURS"
OPLOG_TRIM_INTERVAL_ENV = "AGGBOX_LOCAL_OPLOG_TRIM_INTERVAL_S"
DEFAULT_OPLOG_MAX_ENTRIES = 250_000
DEFAULT_OPLOG_MAX_HOURS = 168.0
DEFAULT_OPLOG_TRIM_INTERVAL_S = 10
_LOCK_FILE = "local-mongodb.lock"


def home_dir() -> Path:
    """The aggbox state directory: ``$AGGBOX_HOME`` or ``~/.aggbox`` (created by ``start``
    and ``stop`` only, so looking for a server leaves no trace)."""
    configured = os.environ.get("AGGBOX_HOME", "").strip()
    return Path(configured).expanduser() if configured else Path.home() / ".aggbox"


def state_path() -> Path:
    """Where the running local server is recorded."""
    return home_dir() / _STATE_FILE


def data_dir() -> Path:
    """Directory of the local server's data file and log."""
    return home_dir() / "mongodb"


@dataclass(frozen=True)
class LocalServerState:
    """What ``aggbox local start`` recorded about the server it started."""

    pid: int
    port: int
    uri: str
    started_at: str  # ISO 8601, UTC
    kind: str
    data: str = ""
    log: str = ""

    def uptime_seconds(self) -> float:
        try:
            started = datetime.fromisoformat(self.started_at)
        except ValueError:
            return 0.0
        return max(0.0, (datetime.now(UTC) - started).total_seconds())


def warn_throwaway_server() -> None:
    """The one-line warning of a command about to start a throw-away MongoDB (on stderr)."""
    print(
        "aggbox: warning: no AGGBOX_MONGODB_URI and no `aggbox local start` server: starting a "
        "throw-away MongoDB; results are lost when this command exits; run `aggbox local "
        "start` first, or set AGGBOX_MONGODB_URI",
        file=sys.stderr,
        flush=True,
    )


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    home = home_dir()
    home.mkdir(parents=True, exist_ok=True)
    with open(home / _LOCK_FILE, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _read_state() -> LocalServerState | None:
    try:
        raw: Any = json.loads(state_path().read_text(encoding="utf-8"))
        return LocalServerState(
            pid=int(raw["pid"]),
            port=int(raw["port"]),
            uri=str(raw["uri"]),
            started_at=str(raw["started_at"]),
            kind=str(raw["kind"]),
            data=str(raw.get("data", "")),
            log=str(raw.get("log", "")),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_state(state: LocalServerState) -> None:
    """Write the state file atomically (temporary file in the same directory, then rename)."""
    write_atomic(state_path(), json.dumps(asdict(state), indent=2) + "\n")


def _remove_state() -> None:
    with contextlib.suppress(FileNotFoundError):
        state_path().unlink()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (our own child not yet reaped, or one whose reaper is slow) is not alive
    with contextlib.suppress(ChildProcessError, OSError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    with contextlib.suppress(OSError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return False
    return True


def _is_our_server(pid: int) -> bool:
    """``pid`` is alive and (where ``/proc`` tells) runs our launcher, not a reused pid."""
    if not _pid_alive(pid):
        return False
    cmdline = Path(f"/proc/{pid}/cmdline")
    try:
        return _LAUNCHER.encode() in cmdline.read_bytes()
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # no /proc (macOS): trust the pid
    except OSError:
        return True


def running_local_server() -> LocalServerState | None:
    """The server of ``aggbox local start`` if it runs and answers; a stale state file is
    removed. ``None`` when there is none."""
    state = _read_state()
    if state is None:
        if state_path().exists():
            _remove_state()  # unreadable
        return None
    if _is_our_server(state.pid) and _process.port_accepts(state.port):
        return state
    _remove_state()
    return None


def local_mongodb_uri() -> str | None:
    """URI of the running ``aggbox local start`` server, else ``None`` (never starts one)."""
    state = running_local_server()
    return state.uri if state is not None else None


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ServerError(f"{name} must be a number, not {raw!r}") from None
    if value < 0:
        raise ServerError(f"{name} must not be negative, not {raw!r}")
    return value


def oplog_options() -> list[str]:
    """The launcher's oplog options from the environment (``AGGBOX_LOCAL_OPLOG_*``)."""
    entries = int(_env_number(OPLOG_MAX_ENTRIES_ENV, DEFAULT_OPLOG_MAX_ENTRIES))
    age_s = int(_env_number(OPLOG_MAX_HOURS_ENV, DEFAULT_OPLOG_MAX_HOURS) * 3600)
    interval_s = max(1, int(_env_number(OPLOG_TRIM_INTERVAL_ENV, DEFAULT_OPLOG_TRIM_INTERVAL_S)))
    return ["--oplog-max-entries", str(entries), "--oplog-max-age-seconds", str(age_s),
            "--oplog-trim-interval-seconds", str(interval_s)]


def _wait_ready(proc: subprocess.Popen[bytes], log_path: Path, offset: int, uri: str,
                timeout: float) -> None:
    from pymongo import MongoClient

    deadline = time.monotonic() + timeout
    while True:
        code = proc.poll()
        if code is not None:
            raise ServerError(
                f"the local MongoDB exited with code {code} while starting; log: {log_path}\n"
                f"{_process.log_tail(log_path)}"
            )
        with open(log_path, "rb") as f:
            f.seek(offset)
            if _READY in f.read():
                break
        if time.monotonic() >= deadline:
            _terminate(proc.pid, 10.0)
            raise ServerError(
                f"the local MongoDB was not ready within {timeout:g} s; log: {log_path}\n"
                f"{_process.log_tail(log_path)}"
            )
        time.sleep(0.1)
    client: MongoClient[dict[str, Any]] = MongoClient(
        uri, serverSelectionTimeoutMS=int(max(1.0, deadline - time.monotonic()) * 1000)
    )
    try:
        client.admin.command("ping")
    finally:
        client.close()


def _spawn(argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start the server detached from this command, its output appended to ``log_path``."""
    with open(log_path, "ab") as log:
        log.write(f"\n=== aggbox local start: {' '.join(argv)}\n".encode())
        log.flush()
        try:
            return subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives this command and its terminal
                close_fds=True,
            )
        except OSError as exc:
            raise ServerError(f"cannot start the local MongoDB ({argv[0]}): {exc}") from exc


def start_persistent_mongodb(*, timeout: float = 60.0) -> tuple[LocalServerState, bool]:
    """Start the local server unless one runs; ``(state, started)``.

    Raises :class:`ServerError` (with the log tail) when it cannot be started.
    """
    with _locked():
        running = running_local_server()
        if running is not None:
            return running, False
        java = maven.java_executable()
        jars = maven.resolve_classpath(_POM)
        classes = maven.compile_java(_SOURCES, jars)
        classpath = maven.classpath_string([classes, *jars])
        oplog = oplog_options()
        directory = data_dir()
        directory.mkdir(parents=True, exist_ok=True)
        data_file = directory / "aggbox.mv"
        log_path = directory / "server.log"
        for _attempt in range(_PORT_ATTEMPTS):
            port = _process.free_port()
            argv = [java, "-XX:+UseParallelGC", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                    "-Dorg.slf4j.simpleLogger.showDateTime=true", "-cp", classpath, _LAUNCHER,
                    str(port), str(data_file), *oplog]
            offset = log_path.stat().st_size if log_path.exists() else 0
            proc = _spawn(argv, log_path)
            uri = f"mongodb://127.0.0.1:{port}/?directConnection=true"
            try:
                _wait_ready(proc, log_path, offset, uri, timeout)
            except ServerError:
                if proc.poll() == _BIND_FAILED_EXIT:
                    continue  # the port was taken between choosing and binding
                raise
            except Exception as exc:
                _terminate(proc.pid, 10.0)
                raise ServerError(
                    f"the local MongoDB started but does not answer: {exc}; log: {log_path}"
                ) from exc
            state = LocalServerState(
                pid=proc.pid,
                port=port,
                uri=uri,
                started_at=datetime.now(UTC).isoformat(timespec="seconds"),
                kind=LOCAL_KIND,
                data=str(data_file),
                log=str(log_path),
            )
            _write_state(state)
            return state, True
        raise ServerError(
            f"the local MongoDB could not bind a free loopback port in {_PORT_ATTEMPTS} "
            f"attempts; log: {log_path}\n{_process.log_tail(log_path)}"
        )


def _terminate(pid: int, timeout: float) -> bool:
    """SIGTERM, wait up to ``timeout`` s, then SIGKILL; True when the process is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return True
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    for _ in range(50):
        if not _pid_alive(pid):
            return True
        time.sleep(0.1)
    return False


def stop_persistent_mongodb(*, timeout: float = 30.0,
                            delete_data: bool = False) -> LocalServerState | None:
    """Stop the local server (SIGTERM, then SIGKILL after ``timeout`` s) and remove the state
    file; the state of the stopped server, or ``None`` when none ran (idempotent).
    ``delete_data`` also deletes the data directory."""
    with _locked():
        state = _read_state()
        stopped: LocalServerState | None = None
        if state is not None and _is_our_server(state.pid):
            if not _terminate(state.pid, timeout):
                raise ServerError(f"the local MongoDB (pid {state.pid}) did not stop")
            stopped = state
        _remove_state()
        if delete_data:
            shutil.rmtree(data_dir(), ignore_errors=True)
        return stopped
