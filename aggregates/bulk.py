"""Unordered bulk writes with per-operation errors.

pymongo's ``bulk_write`` is used for every real server. mongomock (fast unit tests of
pure logic only) cannot run pymongo ≥ 4.9's bulk operation objects, so for it the same
operations are replayed one by one with the same error reporting (index + code)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pymongo import DeleteOne, UpdateOne
from pymongo.collection import Collection
from pymongo.errors import BulkWriteError, DuplicateKeyError


def _is_mongomock(coll: Any) -> bool:
    return type(coll).__module__.startswith("mongomock")


def bulk_write_unordered(coll: Collection[Any], ops: Sequence[UpdateOne | DeleteOne]
                         ) -> list[dict[str, Any]]:
    """Run ``ops`` unordered; return the write errors (``{"index", "code", "errmsg"}``)."""
    if not ops:
        return []
    if not _is_mongomock(coll):
        try:
            coll.bulk_write(list(ops), ordered=False)
        except BulkWriteError as exc:
            wc = exc.details.get("writeConcernErrors") or []
            if wc:
                # The writes may not be durable (e.g. no majority in time): never report
                # them as done. Failing makes the caller retry the input (idempotent).
                from aggregates.errors import StoreError

                raise StoreError(
                    f"write concern not satisfied on {coll.name}: {wc[0].get('errmsg')} "
                    f"(code {wc[0].get('code')}); the batch fails so it is retried"
                ) from exc
            return list(exc.details.get("writeErrors", []))
        return []
    errors: list[dict[str, Any]] = []
    for i, op in enumerate(ops):
        try:
            if isinstance(op, UpdateOne):
                coll.update_one(op._filter, op._doc, upsert=bool(op._upsert))
            else:
                coll.delete_one(op._filter)
        except DuplicateKeyError as exc:
            errors.append({"index": i, "code": 11000, "errmsg": str(exc)})
    return errors


def raise_on_errors(errors: list[dict[str, Any]]) -> None:
    if errors:
        from aggregates.errors import StoreError

        e = errors[0]
        raise StoreError(f"{len(errors)} write(s) failed; first at op {e.get('index')}: "
                         f"code {e.get('code')}: {e.get('errmsg')}")


def upsert_all(coll: Collection[Any], ops: Sequence[UpdateOne | DeleteOne]) -> None:
    """Run idempotent upserts (side records: archive, dead letters, parked); raise on any
    error but this one: two writers upserting the same ``_id`` at once may see E11000
    (MongoDB ≥ 4.2 retries most such upserts itself; mongo-java-server and mongomock do not).
    The loser's operation is re-run once, and then matches the winner's document."""
    errors = bulk_write_unordered(coll, ops)
    raced = [ops[int(e["index"])] for e in errors if e.get("code") == 11000]
    others = [e for e in errors if e.get("code") != 11000]
    if raced and not others:
        others = bulk_write_unordered(coll, raced)
    raise_on_errors(others)
