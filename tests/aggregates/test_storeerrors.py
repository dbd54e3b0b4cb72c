"""aggregates.core.storeerrors: retry decisions from pymongo's error types, codes and labels."""

from __future__ import annotations

import pytest
from pymongo.errors import (
    AutoReconnect,
    BulkWriteError,
    ConfigurationError,
    ConnectionFailure,
    DuplicateKeyError,
    ExecutionTimeout,
    InvalidURI,
    NetworkTimeout,
    NotPrimaryError,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
    WriteError,
)

from aggregates.core.storeerrors import error_codes, is_fatal, is_transient


def failure(code: int, labels: list[str] | None = None, name: str = "") -> OperationFailure:
    """What pymongo raises for a server reply ``{ok: 0, code, codeName, errorLabels}``."""
    details = {"ok": 0.0, "errmsg": f"error {code}", "code": code, "codeName": name}
    if labels:
        details["errorLabels"] = labels
    return OperationFailure(f"error {code}", code=code, details=details)


FATAL = [
    pytest.param(failure(18, name="AuthenticationFailed"), id="wrong-password"),
    pytest.param(failure(13, name="Unauthorized"), id="missing-privilege"),
    pytest.param(failure(11, name="UserNotFound"), id="unknown-user"),
    pytest.param(failure(8000, name="AtlasError"), id="atlas-not-allowed"),
    pytest.param(ConfigurationError("unknown option foo"), id="configuration"),
    pytest.param(InvalidURI("Invalid URI scheme"), id="invalid-uri"),
    pytest.param(BulkWriteError({"writeErrors": [{"index": 0, "code": 13,
                                                  "errmsg": "not authorized"}]}),
                 id="bulk-unauthorized"),
]

TRANSIENT = [
    pytest.param(AutoReconnect("connection reset"), id="auto-reconnect"),
    pytest.param(NetworkTimeout("timed out"), id="network-timeout"),
    pytest.param(ConnectionFailure("refused"), id="connection-failure"),
    pytest.param(ServerSelectionTimeoutError("no servers"), id="server-selection"),
    pytest.param(NotPrimaryError("not primary", {"code": 10107}), id="not-primary"),
    pytest.param(failure(2, ["RetryableWriteError"]), id="label-retryable-write"),
    pytest.param(failure(280, ["ResumableChangeStreamError"]), id="label-resumable-stream"),
    pytest.param(failure(112, ["TransientTransactionError"]), id="label-transient-txn"),
    pytest.param(failure(189, name="PrimarySteppedDown"), id="stepped-down"),
    pytest.param(failure(91, name="ShutdownInProgress"), id="shutting-down"),
    pytest.param(ExecutionTimeout("time limit", code=50), id="max-time-ms"),
    pytest.param(BulkWriteError({"writeErrors": [], "writeConcernErrors": [
        {"code": 91, "errmsg": "shutdown"}]}), id="bulk-write-concern-shutdown"),
]

NEITHER = [
    pytest.param(DuplicateKeyError("E11000", code=11000), id="duplicate-key"),
    pytest.param(WriteError("bad", code=2), id="bad-value"),
    pytest.param(failure(2, name="BadValue"), id="bad-value-command"),
    pytest.param(PyMongoError("something"), id="plain"),
]


@pytest.mark.parametrize("exc", FATAL)
def test_fatal(exc: Exception) -> None:
    assert is_fatal(exc) and not is_transient(exc)


@pytest.mark.parametrize("exc", TRANSIENT)
def test_transient(exc: Exception) -> None:
    assert is_transient(exc) and not is_fatal(exc)


@pytest.mark.parametrize("exc", NEITHER)
def test_neither(exc: Exception) -> None:
    assert not is_transient(exc) and not is_fatal(exc)


def test_fatal_wins_over_a_retry_label() -> None:
    exc = failure(18, ["RetryableWriteError"])
    assert is_fatal(exc) and not is_transient(exc)


def test_the_label_counts_not_the_message() -> None:
    assert not is_transient(failure(2))
    assert not is_fatal(OperationFailure("Authentication failed.", code=2))


def test_non_pymongo_errors_are_neither() -> None:
    assert not is_transient(TimeoutError()) and not is_fatal(ValueError("x"))


def test_error_codes_of_a_bulk_write() -> None:
    exc = BulkWriteError({"writeErrors": [{"code": 11000}, {"code": 13}],
                          "writeConcernErrors": [{"code": 64}]})
    assert error_codes(exc) == {65, 11000, 13, 64}
