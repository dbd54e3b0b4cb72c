"""The dispatcher's error model (docs/design.md "The dispatcher", step 6).

A store error is looked at with :mod:`aggregates.storeerrors`: a fatal one (wrong password,
missing privilege, bad URI or option) becomes :class:`FatalStoreError` — the daemon stops
and exits non-zero with one line; anything else is retried after backoff.
"""

from __future__ import annotations

import logging
import re

from aggregates.errors import AggboxError
from aggregates.storeerrors import error_codes, is_fatal

__all__ = ["TRACE_LOGGER", "FatalStoreError", "check_fatal", "one_line"]

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
    text = _CREDENTIALS.sub("//***@", text)  # a URI quoted in a message keeps no password
    return text if len(text) <= limit else text[: limit - 3] + "..."


_CREDENTIALS = re.compile(r"//[^/@\s]*@")

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
