"""Logging set-up shared by the command line, the pipeline and the dispatcher.

Log records go to stderr. Full tracebacks go to a log file instead, ``$AGGBOX_LOG_FILE`` or
``logs/aggbox.log`` in the aggbox state directory (``$AGGBOX_HOME``, default ``~/.aggbox``,
as the local server's), created only when a trace is written to it — never in the working
directory unless asked (docs/operations.md "Errors and logs"): the
command line prints one line per error and says where the full trace is (:func:`write_trace`);
a Spark session started by the command line logs the JVM's errors there too."""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

#: Environment variable naming the log file; default :data:`DEFAULT_LOG_FILE` under the state
#: directory (:func:`aggbox.servers.persistent.home_dir`'s rule, not imported: it is heavier).
LOG_FILE_ENV = "AGGBOX_LOG_FILE"
DEFAULT_LOG_FILE = "logs/aggbox.log"

#: Records of this logger go to the log file only (never to stderr): full tracebacks.
TRACE_LOGGER = "aggbox.trace"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and any ``extra`` fields."""

    _skip = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in vars(record).items():
            if k not in self._skip:
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class _LogFileHandler(logging.FileHandler):
    """Appends to the log file, which is created at the first record. If the file cannot be
    written, the handler turns itself off (``failed``) and says so in one WARNING line on
    stderr instead of logging's own multi-line error."""

    failed = False
    #: create the file's directory (the default location); a configured path must exist
    make_parent = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.failed:
            return
        try:
            if self.stream is None and self.make_parent:  # the default file's first record
                Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
            super().emit(record)  # opens the file at the first record (an error is raised)
        except OSError as exc:
            self._turn_off(exc)

    def handleError(self, record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        self._turn_off(exc if exc is not None else OSError("unknown error"))

    def turn_off(self, exc: BaseException) -> None:
        """The log file cannot be written (``exc``): off, with one WARNING line."""
        self._turn_off(exc)

    def _turn_off(self, exc: BaseException) -> None:
        self.failed = True
        logging.getLogger("aggbox").warning(
            "cannot write the log file %s (%s: %s); full traces are not kept (set %s to "
            "a writable path)", self.baseFilename, type(exc).__name__, exc, LOG_FILE_ENV)


_file_handler: _LogFileHandler | None = None


def log_file_path() -> Path:
    """Where traces are written: ``$AGGBOX_LOG_FILE`` (relative: to the working directory),
    else ``logs/aggbox.log`` under ``$AGGBOX_HOME`` (default ``~/.aggbox``)."""
    configured = os.environ.get(LOG_FILE_ENV, "").strip()
    if configured:
        return Path(configured).expanduser().absolute()
    home = os.environ.get("AGGBOX_HOME", "").strip()
    state = Path(home).expanduser() if home else Path.home() / ".aggbox"
    return (state / DEFAULT_LOG_FILE).absolute()


def current_log_file() -> Path | None:
    """The log file :func:`configure` set up (None: no log file, e.g. library use). Its
    directory exists (the default one is created here): callers hand the path to writers
    of their own (the Spark JVM's log4j, its stderr)."""
    if _file_handler is None or _file_handler.failed:
        return None
    path = Path(_file_handler.baseFilename)
    if _file_handler.make_parent:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            _file_handler.turn_off(exc)
            return None
    return path


def configure(*, level: str = "INFO", json_logs: bool = False, log_file: bool = True) -> None:
    """Records at ``level`` and above on stderr; with ``log_file``, the traces of
    :func:`write_trace` go to :func:`log_file_path`."""
    global _file_handler
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_logs else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    trace = logging.getLogger(TRACE_LOGGER)
    if _file_handler is not None:
        trace.removeHandler(_file_handler)
        _file_handler.close()
        _file_handler = None
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    trace.propagate = False
    trace.setLevel(logging.DEBUG)
    if log_file:
        _file_handler = _LogFileHandler(log_file_path(), delay=True, encoding="utf-8")
        _file_handler.make_parent = not os.environ.get(LOG_FILE_ENV, "").strip()
        _file_handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s: %(message)s"))
        trace.handlers[:] = [_file_handler]
    for noisy in ("py4j", "pymongo", "kafka"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    proxy = logging.getLogger("py4j.clientserver")
    if not any(isinstance(f, _ProxyErrorFilter) for f in proxy.filters):
        proxy.addFilter(_ProxyErrorFilter())


class _ProxyErrorFilter(logging.Filter):
    """Drops py4j's traceback of an exception raised in a Python callback (a stream's
    ``foreachBatch``): the streaming query fails with the same text, which the command
    reports in one line, its trace in the log file."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("There was an exception while executing the "
                                              "Python Proxy")


def write_trace(message: str, exc: BaseException) -> Path | None:
    """Write ``message`` and the traceback of ``exc`` to the log file only (not stderr);
    the file's path, or None when there is no log file or it cannot be written."""
    if _file_handler is None or _file_handler.failed:
        return None
    logging.getLogger(TRACE_LOGGER).error(message, exc_info=(type(exc), exc, exc.__traceback__))
    _file_handler.flush()
    return current_log_file()
