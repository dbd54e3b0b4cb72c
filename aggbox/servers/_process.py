"""Process plumbing shared by the local servers (private).

- free loopback ports chosen by Python;
- a :class:`ServerProcess` that starts a server with its output in a log file, waits for it
  to become ready, stops it (SIGTERM, then SIGKILL) and is stopped at interpreter exit;
- parent-death handling: the Java servers exit when their stdin pipe reaches end of file
  (the pipe is held only by this process); for other servers (``mongod``) a tiny Python
  sidecar holds that pipe instead and sends SIGTERM to the server when it closes.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Protocol

from aggbox.servers.errors import ServerError

LOOPBACK = "127.0.0.1"

_LOG_TAIL_CHARS = 6000

# Runs in a separate interpreter: waits for EOF on stdin, then terminates the server pid.
_SIDECAR = """
import os, signal, sys, time
pid = int(sys.argv[1])
try:
    while sys.stdin.buffer.read(65536):
        pass
except BaseException:
    pass
try:
    os.kill(pid, signal.SIGTERM)
except ProcessLookupError:
    sys.exit(0)
for _ in range(200):
    time.sleep(0.05)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit(0)
try:
    os.kill(pid, signal.SIGKILL)
except ProcessLookupError:
    pass
"""


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct ports that were free on ``host`` a moment ago.

    The sockets are held open together so the ports differ; another process may still grab
    one before the server binds it, so callers retry on bind failures.
    """
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port(host: str = LOOPBACK) -> int:
    """One port that was free on ``host`` a moment ago."""
    return free_ports(1, host)[0]


def port_accepts(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    """Whether a TCP connection to ``host:port`` succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def log_tail(path: Path, chars: int = _LOG_TAIL_CHARS) -> str:
    """The last ``chars`` characters of a log file ("" when unreadable)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - chars))
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return ("…" + text) if size > chars else text


class ServerProcess:
    """One server process with its output appended to ``log_path``.

    ``watch_stdin=True``: the program itself exits on stdin EOF (aggbox's Java launchers).
    ``watch_stdin=False``: a sidecar process terminates it when this process goes away.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        watch_stdin: bool,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.watch_stdin = watch_stdin
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self._proc: subprocess.Popen[bytes] | None = None
        self._sidecar: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def start(self) -> None:
        if self.is_running():
            raise ServerError(f"{self.name} is already running (pid {self.pid})")
        self._close_handles()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in _close_handles
        self._log.write(f"\n=== aggbox: starting {self.name}: {' '.join(self.argv)}\n".encode())
        self._log.flush()
        try:
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                # own session: a Ctrl-C in the terminal reaches only the Python process, which
                # then stops the server in order (atexit / context managers)
                start_new_session=True,
            )
        except OSError as exc:
            self._close_handles()
            raise ServerError(f"cannot start {self.name} ({self.argv[0]}): {exc}") from exc
        if not self.watch_stdin:
            self._sidecar = subprocess.Popen(
                [sys.executable, "-c", _SIDECAR, str(self._proc.pid)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        register_for_exit(self)

    def wait_ready(
        self,
        ready: Callable[[], bool],
        timeout: float,
        *,
        what: str,
        interval: float = 0.1,
    ) -> None:
        """Poll ``ready()`` until true; :class:`ServerError` with the log tail on death/timeout.

        ``ready`` may raise; its last exception is reported on timeout.
        """
        deadline = time.monotonic() + timeout
        last_error: BaseException | None = None
        while True:
            if not self.is_running():
                code = self.returncode()
                self.stop()  # close the pipe and the log, forget it at exit
                raise self.failure(f"{self.name} exited with code {code} {what}")
            try:
                if ready():
                    return
            except Exception as exc:
                last_error = exc
            if time.monotonic() >= deadline:
                detail = f" (last check: {last_error!r})" if last_error else ""
                self.stop()
                raise self.failure(f"{self.name} was not ready {what} within {timeout:g} s{detail}")
            time.sleep(interval)

    def failure(self, message: str) -> ServerError:
        return ServerError(
            f"{message}. Server log: {self.log_path}\n--- last lines of the log ---\n"
            f"{log_tail(self.log_path)}"
        )

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM, wait up to ``timeout`` s, then SIGKILL. No-op when not running."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_handles()
        unregister_for_exit(self)

    def kill(self) -> None:
        """SIGKILL, no shutdown at all (a crash)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        self._close_handles()
        unregister_for_exit(self)

    def _close_handles(self) -> None:
        proc = self._proc
        if proc is not None and proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        sidecar = self._sidecar
        if sidecar is not None:
            if sidecar.stdin is not None:
                with contextlib.suppress(OSError):
                    sidecar.stdin.close()  # the server is already gone: the sidecar just exits
            try:
                sidecar.wait(timeout=15)
            except subprocess.TimeoutExpired:
                sidecar.kill()
            self._sidecar = None
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None


class Stoppable(Protocol):
    def stop(self) -> None: ...


# Everything started and not yet stopped, in start order; stopped in reverse at exit.
_live: list[Stoppable] = []
_live_lock = threading.Lock()
_atexit_registered = False


def register_for_exit(item: Stoppable) -> None:
    """Call ``item.stop()`` at interpreter exit unless :func:`unregister_for_exit` ran first."""
    global _atexit_registered
    with _live_lock:
        if not any(existing is item for existing in _live):
            _live.append(item)
        if not _atexit_registered:
            atexit.register(_stop_all)
            _atexit_registered = True


def unregister_for_exit(item: Stoppable) -> None:
    with _live_lock:
        _live[:] = [existing for existing in _live if existing is not item]


def _stop_all() -> None:
    with _live_lock:
        items = list(reversed(_live))
    for item in items:
        try:
            item.stop()
        except (OSError, subprocess.SubprocessError, ServerError) as exc:
            # at interpreter exit: the next server must still be stopped; say what failed
            logging.getLogger("aggbox.servers").warning("could not stop %r at exit: %s",
                                                        item, exc)
