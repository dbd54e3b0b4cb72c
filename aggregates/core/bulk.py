"""Unordered bulk writes with per-operation errors, through pymongo's ``bulk_write``.

The database must implement ``bulk_write`` with pymongo's ``BulkWriteError`` details
(``writeErrors`` with ``index``/``code``/``errmsg``, ``writeConcernErrors``): every MongoDB
server does, and so does the test double :func:`aggregates.testing.memory_database`.

Errors keep the server's code and labels (:class:`WriteError`, :class:`StoreError`), so
callers decide from them, never from the text."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pymongo import DeleteOne, InsertOne, UpdateOne
from pymongo.collection import Collection
from pymongo.errors import BulkWriteError, OperationFailure, PyMongoError

from aggregates.core.errors import StoreError

DUPLICATE_KEY = 11000

#: Labels looked for on a pymongo error besides the ones its details list.
KNOWN_LABELS = ("RetryableWriteError", "TransientTransactionError",
                "UnknownTransactionCommitResult", "NoWritesPerformed",
                "ResumableChangeStreamError")


def error_labels(exc: BaseException) -> frozenset[str]:
    """The error labels of a pymongo exception (those its details list, and the known ones
    it answers to), empty for anything else."""
    if not isinstance(exc, PyMongoError):
        return frozenset()
    labels = {label for label in KNOWN_LABELS if exc.has_error_label(label)}
    details = getattr(exc, "details", None)
    if isinstance(details, dict):
        labels.update(str(label) for label in details.get("errorLabels") or ())
    return frozenset(labels)


@dataclass(frozen=True, slots=True)
class WriteError:
    """One operation of a bulk write that failed (the others may have succeeded)."""

    index: int
    code: int | None
    message: str
    labels: frozenset[str]
    #: The ``BulkWriteError`` that reported it.
    bulk: BulkWriteError

    @property
    def duplicate_key(self) -> bool:
        return self.code == DUPLICATE_KEY

    def failure(self) -> OperationFailure:
        """This operation's error as a pymongo exception (for
        :func:`aggregates.core.storeerrors.is_transient` and friends)."""
        details: dict[str, Any] = {"code": self.code, "errmsg": self.message}
        if self.labels:
            details["errorLabels"] = sorted(self.labels)
        exc = OperationFailure(self.message, code=self.code, details=details)
        exc.__cause__ = self.bulk
        return exc

    def store_error(self, what: str) -> StoreError:
        """A :class:`StoreError` for this operation, caused by :meth:`failure`."""
        err = StoreError(f"{what} failed at op {self.index}: code {self.code}: "
                         f"{self.message}", code=self.code, labels=self.labels)
        err.__cause__ = self.failure()
        return err


def bulk_write_unordered(coll: Collection[Any],
                         ops: Sequence[UpdateOne | DeleteOne | InsertOne[Any]]
                         ) -> list[WriteError]:
    """Run ``ops`` unordered; return the operations that failed.

    A write-concern error raises :class:`StoreError`: the writes may not be durable (e.g. no
    majority in time), so they are never reported as done; failing makes the caller retry
    the input (idempotent)."""
    if not ops:
        return []
    try:
        coll.bulk_write(list(ops), ordered=False)
    except BulkWriteError as exc:
        labels = error_labels(exc)
        wc = exc.details.get("writeConcernErrors") or []
        if wc:
            code = wc[0].get("code")
            raise StoreError(
                f"write concern not satisfied on {coll.name}: {wc[0].get('errmsg')} "
                f"(code {code}); the batch fails so it is retried",
                code=code if isinstance(code, int) else None, labels=labels,
            ) from exc
        return [_write_error(e, labels, exc) for e in exc.details.get("writeErrors") or []]
    return []


def _write_error(err: dict[str, Any], labels: frozenset[str], exc: BulkWriteError
                 ) -> WriteError:
    code = err.get("code")
    return WriteError(int(err.get("index", -1)), code if isinstance(code, int) else None,
                      str(err.get("errmsg", "")), labels, exc)


def raise_on_errors(errors: Sequence[WriteError], what: str) -> None:
    if errors:
        first = errors[0]
        raise first.store_error(f"{len(errors)} write(s) to {what}; the first")


def upsert_all(coll: Collection[Any], ops: Sequence[UpdateOne | DeleteOne]) -> None:
    """Run idempotent upserts (side records: archive, dead letters, parked); raise on any
    error but this one: two writers upserting the same ``_id`` at once may see E11000
    (MongoDB ≥ 4.2 retries most such upserts itself; mongo-java-server does not).
    The loser's operation is re-run once, and then matches the winner's document."""
    errors = bulk_write_unordered(coll, ops)
    raced = [ops[e.index] for e in errors if e.duplicate_key]
    others = [e for e in errors if not e.duplicate_key]
    if raced and not others:
        others = bulk_write_unordered(coll, raced)
    raise_on_errors(others, coll.name)
