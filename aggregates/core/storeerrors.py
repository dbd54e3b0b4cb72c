"""Which store (pymongo) errors are worth retrying and which are fatal.

Pure: decides from pymongo's exception type, server error code and error labels — never from
the message text. Used by the dispatcher (retry with backoff, or exit with one line) and
meant for the writer as well.

- **fatal** (:func:`is_fatal`): retrying cannot help and an operator must act — wrong user
  name or password (code 18 ``AuthenticationFailed``), a missing privilege (13
  ``Unauthorized``, Atlas's 8000 ``AtlasError``), an unknown user (11 ``UserNotFound``), a
  malformed or unusable URI or client option (:class:`~pymongo.errors.ConfigurationError`,
  :class:`~pymongo.errors.InvalidURI`).
- **transient** (:func:`is_transient`): the same call may succeed later — network errors and
  timeouts (:class:`~pymongo.errors.ConnectionFailure` and its subclasses
  ``AutoReconnect``, ``NetworkTimeout``, ``NotPrimaryError``, ``ServerSelectionTimeoutError``),
  an error the server labels ``RetryableWriteError``, ``ResumableChangeStreamError`` or
  ``TransientTransactionError``, and the server codes pymongo itself retries on (primary
  stepped down, shutting down, host unreachable, …) plus operation time limits (50, 262).

An error can be neither (e.g. a duplicate key, a bad query): the caller decides; the
dispatcher backs off on those too, the error being more likely in one document than
everywhere. Fatal wins over transient.
"""

from __future__ import annotations

from typing import Final

from pymongo.errors import (
    BulkWriteError,
    ConfigurationError,
    ConnectionFailure,
    OperationFailure,
    PyMongoError,
)

__all__ = [
    "FATAL_CODES",
    "TRANSIENT_CODES",
    "TRANSIENT_LABELS",
    "error_codes",
    "is_fatal",
    "is_transient",
]

#: Server codes no retry can fix: 11 UserNotFound, 13 Unauthorized, 18 AuthenticationFailed,
#: 8000 AtlasError (Atlas's "user is not allowed to do action").
FATAL_CODES: Final = frozenset({11, 13, 18, 8000})

#: Server codes of conditions that pass: pymongo's own retryable set (6 HostUnreachable,
#: 7 HostNotFound, 89 NetworkTimeout, 91 ShutdownInProgress, 134
#: ReadConcernMajorityNotAvailableYet, 189 PrimarySteppedDown, 9001 SocketException, 10058,
#: 10107 NotWritablePrimary, 11600 InterruptedAtShutdown, 11602
#: InterruptedDueToReplStateChange, 13435, 13436 NotPrimary…), 50 MaxTimeMSExpired and 262
#: ExceededTimeLimit.
TRANSIENT_CODES: Final = frozenset({6, 7, 50, 89, 91, 134, 189, 262, 9001, 10058, 10107,
                                    11600, 11602, 13435, 13436})

#: Error labels the server (or pymongo) attaches to errors worth retrying.
TRANSIENT_LABELS: Final = ("RetryableWriteError", "ResumableChangeStreamError",
                           "TransientTransactionError")


def error_codes(exc: BaseException) -> frozenset[int]:
    """The server error codes an exception carries: its own, and for a bulk write those of
    its write errors and write concern errors."""
    codes: set[int] = set()
    if isinstance(exc, OperationFailure):
        if isinstance(exc.code, int):
            codes.add(exc.code)
        if isinstance(exc, BulkWriteError):
            details = exc.details or {}
            for key in ("writeErrors", "writeConcernErrors"):
                for err in details.get(key) or ():
                    code = err.get("code") if isinstance(err, dict) else None
                    if isinstance(code, int):
                        codes.add(code)
    return frozenset(codes)


def is_fatal(exc: BaseException) -> bool:
    """Retrying cannot help: bad credentials, missing privileges, a bad URI or option."""
    if isinstance(exc, ConfigurationError):  # InvalidURI is one
        return True
    return bool(error_codes(exc) & FATAL_CODES)


def is_transient(exc: BaseException) -> bool:
    """The same call may succeed later (and :func:`is_fatal` is false)."""
    if not isinstance(exc, PyMongoError) or is_fatal(exc):
        return False
    if isinstance(exc, ConnectionFailure):
        return True
    if any(exc.has_error_label(label) for label in TRANSIENT_LABELS):
        return True
    return bool(error_codes(exc) & TRANSIENT_CODES)
