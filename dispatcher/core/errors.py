"""The dispatcher's error model (docs/design.md "The dispatcher", step 6).

A store error is looked at with :mod:`aggregates.core.storeerrors`: a fatal one (wrong password,
missing privilege, bad URI or option) becomes :class:`FatalStoreError` — the daemon stops
and exits non-zero with one line; anything else is retried after backoff.

Retried errors are logged as one line (:func:`describe_store_error`: no topology
description, no server reply) and at most once per period per kind
(:class:`RateLimitedLog`), the full trace going to the log file at DEBUG
(:data:`TRACE_LOGGER`). A server ``--once`` never reached at all is
:func:`never_reached` (docs/design.md "The dispatcher", step 7).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from pymongo.errors import (
    ConnectionFailure,
    NotPrimaryError,
    OperationFailure,
    ServerSelectionTimeoutError,
)

from aggregates.core.errors import AggboxError
from aggregates.core.storeerrors import error_codes, is_fatal
from aggregates.core.uri import redact_uri, redact_uris_in

__all__ = ["TRACE_LOGGER", "URI_OPTIONS", "FatalStoreError", "RateLimitedLog", "check_fatal",
           "describe_store_error", "is_unreachable", "never_reached", "one_line"]

#: Full tracebacks go to this logger; the command line sends it to the log file only
#: (``AGGBOX_LOG_FILE``), never to stderr.
TRACE_LOGGER = "aggbox.trace"


class FatalStoreError(AggboxError):
    """A store error no retry can fix. ``str()`` is the one line for the operator; the
    pymongo exception is its ``__cause__``."""


def one_line(exc: BaseException | str, limit: int = 300) -> str:
    """The error's first line, without pymongo's appended topology or full reply."""
    raw = str(exc).strip()
    text = raw.splitlines()[0] if raw else type(exc).__name__
    for cut in (", Timeout: ", ", full error: "):
        text = text.split(cut)[0]
    text = redact_uris_in(text)  # a URI quoted in a message keeps no password
    return text if len(text) <= limit else text[: limit - 3] + "..."


_HINTS = {
    18: "check the user name and password in the MongoDB URI (--mongodb-uri, "
        "AGGBOX_MONGODB_URI)",
    11: "check the user name in the MongoDB URI (--mongodb-uri, AGGBOX_MONGODB_URI)",
    13: "grant the dispatcher's user readWrite on the database (and changeStream for "
        "change streams)",
    8000: "grant the dispatcher's user readWrite on the database",
}


def check_fatal(exc: BaseException, where: str) -> None:
    """Raise :class:`FatalStoreError` (from ``exc``) when ``exc`` is fatal; log its trace to
    :data:`TRACE_LOGGER`. ``where`` names what was being done (e.g. the collection)."""
    if not is_fatal(exc):
        return
    codes = sorted(error_codes(exc))
    hint = next((_HINTS[c] for c in codes if c in _HINTS),
                "check the MongoDB URI and the client options")
    code = f" (code {codes[0]})" if codes else ""
    message = f"{where}: MongoDB refused{code}: {one_line(exc)}; {hint}"
    logging.getLogger(TRACE_LOGGER).error(message, exc_info=(type(exc), exc, exc.__traceback__))
    raise FatalStoreError(message) from exc


# -- retried errors: one line ----------------------------------------------------------------
#: pymongo appends " (configured timeouts: socketTimeoutMS: …ms, connectTimeoutMS: …ms)" to
#: network errors (pymongo/helpers_shared.py ``format_timeout_details``): noise in a line.
_CONFIGURED_TIMEOUTS = re.compile(r"\s*\(configured timeouts:[^)]*\)")
#: An OS error in a network error's text: "[Errno 111] Connect call failed ('h', 1)".
_OS_ERROR = re.compile(r"\[Errno (\d+)\] [^,(]*(?:\([^)]*\))?")


def _os_error(match: re.Match[str]) -> str:
    code = int(match.group(1))
    if code not in errno.errorcode:  # e.g. a resolver error (negative): keep the text
        return match.group(0).strip()
    return os.strerror(code).lower()  # "connection refused", "no route to host", …


def _network_text(text: str) -> str:
    text = _CONFIGURED_TIMEOUTS.sub("", text)
    return _OS_ERROR.sub(_os_error, text).strip()


def describe_store_error(exc: BaseException, limit: int = 240) -> str:
    """A retried (or any) store error as one line for the operator, e.g.
    ``ServerSelectionTimeoutError: 127.0.0.1:1: connection refused (no server reachable
    within 2.0s)`` or ``OperationFailure (code 91 ShutdownInProgress; labels
    RetryableWriteError): …`` — never pymongo's topology description or full server reply,
    no password; the full error belongs in the trace log (:class:`RateLimitedLog`)."""
    text, timeout = _describe(exc, limit)
    if isinstance(exc, ServerSelectionTimeoutError):
        within = f" within {timeout}s" if timeout else ""
        return f"{text} (no server reachable{within})"
    return text


def _describe(exc: BaseException, limit: int) -> tuple[str, str | None]:
    """The one line, and the server selection timeout pymongo reported (its text)."""
    name = type(exc).__name__
    if isinstance(exc, ServerSelectionTimeoutError):
        # pymongo has no structured form of this error (``details`` is empty): its text is
        # "<why>, Timeout: <n>s, Topology Description: <repr of every server>"
        # (pymongo/asynchronous/topology.py ``_select_servers_loop``). Cut at the first
        # ", Timeout: ": "<why>" is pymongo's own summary (the servers' errors, or "No
        # primary available for writes", …) and the topology repr only repeats it at length.
        raw = str(exc).strip()
        why, _, rest = raw.partition(", Timeout: ")
        timeout = rest.partition("s, ")[0] if rest else ""
        text = _network_text(why.splitlines()[0] if why else "") or "no server reachable"
        return (f"{name}: {one_line(text, limit)}",
                timeout if re.fullmatch(r"[0-9.]+", timeout) else None)
    if isinstance(exc, OperationFailure):
        details: Mapping[str, Any] = exc.details if isinstance(exc.details, Mapping) else {}
        parts = []
        if isinstance(exc.code, int):
            code_name = details.get("codeName")
            parts.append(f"code {exc.code}" + (f" {code_name}" if code_name else ""))
        labels = details.get("errorLabels")
        if isinstance(labels, list) and labels:
            parts.append("labels " + ", ".join(str(x) for x in labels))
        head = f"{name} ({'; '.join(parts)})" if parts else name
        return f"{head}: {one_line(exc, limit)}", None
    if isinstance(exc, ConnectionFailure):  # AutoReconnect, NetworkTimeout, NotPrimaryError
        return f"{name}: {one_line(_network_text(str(exc)) or name, limit)}", None
    return f"{name}: {one_line(exc, limit)}", None


def is_unreachable(exc: BaseException) -> bool:
    """No server could be reached at all (server selection timed out, or the connection
    itself failed) — as opposed to a server that answered with an error."""
    return isinstance(exc, ConnectionFailure) and not isinstance(exc, NotPrimaryError)


#: How long the ping waits before it looks whether every server refused the connection or
#: has a name that does not resolve (issue 44, item 5): pymongo itself keeps retrying those
#: until the whole server selection timeout has passed.
FIRST_LOOK_S: Final = 1.0

#: A connection attempt that ended in one of these is an answer: nobody listens there, or the
#: name does not exist. (errno 111/61/10061: refused; EAI_NONAME -2, EAI_NODATA -5, macOS 8.)
_DEFINITE = re.compile(r"\[Errno (111|61|10061|-2|-5|8)\]|connection refused"
                       r"|name or service not known|nodename nor servname", re.IGNORECASE)


def refused_everywhere(client: Any) -> bool:
    """Every server of ``client``'s topology was tried, and each attempt ended in a refused
    connection or a name that does not resolve: waiting longer would only repeat that."""
    servers = client.topology_description.server_descriptions().values()
    return bool(servers) and all(
        sd.error is not None and _DEFINITE.search(str(sd.error)) for sd in servers)


#: Where the dispatcher's MongoDB URI comes from, as :func:`never_reached` names it.
URI_OPTIONS = "--mongodb-uri (AGGBOX_MONGODB_URI)"


def never_reached(uri: str, exc: BaseException, timeout_s: float | None = None, *,
                  source: str = URI_OPTIONS) -> str:
    """The line ``--once`` ends with when the store was never reached since start (at most
    about 280 characters, with the default ``source``). ``aggbox run`` and the admin commands
    say the same, naming where their URI came from (``source``)."""
    text, reported = _describe(exc, 100)
    within = (f" within {timeout_s:g}s" if timeout_s is not None
              else f" within {reported}s" if reported else "")
    target = one_line(redact_uri(uri), limit=100)
    return (f"MongoDB at {target} not reachable{within} ({text}); check that the server "
            f"runs and that {source} names its host and port")


# -- retried errors: at most one line per period ---------------------------------------------
class RateLimitedLog:
    """Log lines that repeat while a condition lasts: per kind (a short key, e.g.
    ``"lease-round"``), the first line is logged at once, then at most one per ``every_s``
    seconds, the next one saying how many were left out; :meth:`reset` when the condition
    ended (the next line of that kind is logged at once). With ``exc``, the full trace goes
    to :data:`TRACE_LOGGER` (the log file) at DEBUG for each line logged.

        warn = RateLimitedLog(log, every_s=60, collection="orders")
        warn.warning("store", "%s: lease round failed: %s", name, describe_store_error(exc),
                     exc=exc)
    """

    def __init__(self, logger: logging.Logger, *, every_s: float = 60.0,
                 collection: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.every_s = every_s
        self.collection = collection
        self._clock = clock
        #: kind → (monotonic time logged last, lines left out since)
        self._last: dict[str, tuple[float, int]] = {}

    def warning(self, kind: str, msg: str, *args: Any, exc: BaseException | None = None,
                extra: Mapping[str, Any] | None = None) -> bool:
        return self.log(logging.WARNING, kind, msg, *args, exc=exc, extra=extra)

    def error(self, kind: str, msg: str, *args: Any, exc: BaseException | None = None,
              extra: Mapping[str, Any] | None = None) -> bool:
        return self.log(logging.ERROR, kind, msg, *args, exc=exc, extra=extra)

    def log(self, level: int, kind: str, msg: str, *args: Any,
            exc: BaseException | None = None, extra: Mapping[str, Any] | None = None) -> bool:
        """Log now, or count the line as left out; ``True`` when logged."""
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last[0] < self.every_s:
            self._last[kind] = (last[0], last[1] + 1)
            return False
        if last is not None and last[1]:
            msg += f" ({last[1]} more like this in the last {now - last[0]:.0f}s)"
        self._last[kind] = (now, 0)
        fields = dict(extra or {})
        if self.collection is not None:
            fields.setdefault("collection", self.collection)
        self.logger.log(level, msg, *args, extra=fields or None)
        if exc is not None:
            logging.getLogger(TRACE_LOGGER).debug(
                msg, *args, exc_info=(type(exc), exc, exc.__traceback__))
        return True

    def reset(self, kind: str | None = None) -> None:
        """The condition ended (``None``: every condition)."""
        if kind is None:
            self._last.clear()
        else:
            self._last.pop(kind, None)
