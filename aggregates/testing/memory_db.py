"""The in-memory MongoDB test double behind :func:`aggregates.testing.memory_database`.

A mongomock database whose collections implement what the store writer needs and mongomock
lacks: ``bulk_write`` of pymongo's operation objects, unordered or ordered, with pymongo's
per-operation error reporting (``BulkWriteError`` whose ``details`` list ``writeErrors``
with ``index``, ``code`` and ``errmsg``). Each operation runs through mongomock's own
``insert_one``/``update_one``/``replace_one``/``delete_one`` (and the ``*_many`` forms), so
an upsert that collides on ``_id`` is an ``E11000`` at that operation's index, as on a
server. It is held to the same contract suite as the real server
(``tests/aggregates/test_store_mongomock.py`` and ``test_store_local.py`` both run
``tests/aggregates/contract.py``).

Imported only by :func:`aggregates.testing.memory_database`: mongomock is a development
dependency. Not thread-safe (mongomock is not): use ``pipeline_depth=1`` with it.
"""

from __future__ import annotations

from typing import Any

import mongomock
from pymongo import DeleteMany, DeleteOne, InsertOne, ReplaceOne, UpdateMany, UpdateOne
from pymongo.errors import BulkWriteError, OperationFailure, WriteError
from pymongo.results import BulkWriteResult

__all__ = ["MemoryClient", "MemoryCollection", "MemoryDatabase"]


# mongomock's classes, untyped here: the double overrides what pymongo's signatures fix.
_Collection: Any = mongomock.Collection
_Database: Any = mongomock.Database
_Client: Any = mongomock.MongoClient


def _arg(op: Any, name: str) -> Any:
    # pymongo's operation classes have no public accessors for what they carry; this test
    # double is the one place that reads them (the contract suite pins the behaviour).
    return getattr(op, f"_{name}", None)


class MemoryCollection(_Collection):  # type: ignore[misc]
    """A mongomock collection with pymongo's ``bulk_write`` semantics."""

    def with_options(self, *args: Any, **kwargs: Any) -> Any:
        coll = super().with_options(*args, **kwargs)
        coll.__class__ = MemoryCollection
        return coll

    def bulk_write(self, requests: Any, ordered: bool = True,
                   bypass_document_validation: bool = False, session: Any = None,
                   comment: Any = None, let: Any = None) -> BulkWriteResult:
        if bypass_document_validation or session is not None or let is not None:
            raise NotImplementedError(
                "memory_database: bulk_write supports the operations and `ordered` only (no "
                "bypass_document_validation, session or let); run a test that needs them "
                "against a real server")
        result: dict[str, Any] = {"writeErrors": [], "writeConcernErrors": [],
                                  "nInserted": 0, "nUpserted": 0, "nMatched": 0,
                                  "nModified": 0, "nRemoved": 0, "upserted": []}
        for index, op in enumerate(requests):
            try:
                self._run(op, index, result)
            except BulkWriteError:
                raise
            except OperationFailure as exc:  # DuplicateKeyError, WriteError, …
                errmsg = (exc.details or {}).get("errmsg") or str(exc)
                result["writeErrors"].append({"index": index, "code": exc.code,
                                              "errmsg": errmsg, "op": _describe(op)})
                if ordered:
                    break
        if result["writeErrors"]:
            raise BulkWriteError(result)
        return BulkWriteResult(result, True)

    def _run(self, op: Any, index: int, result: dict[str, Any]) -> None:
        if isinstance(op, InsertOne):
            self.insert_one(_arg(op, "doc"))
            result["nInserted"] += 1
        elif isinstance(op, DeleteOne | DeleteMany):
            _no_extras(op, "collation", "hint")
            delete = self.delete_one if isinstance(op, DeleteOne) else self.delete_many
            result["nRemoved"] += delete(_arg(op, "filter")).deleted_count
        elif isinstance(op, UpdateOne | UpdateMany | ReplaceOne):
            res = self._update_atomically(op)
            if res.upserted_id is not None:
                result["nUpserted"] += 1
                result["upserted"].append({"index": index, "_id": res.upserted_id})
            else:
                result["nMatched"] += res.matched_count
                result["nModified"] += res.modified_count
        else:
            raise TypeError(f"memory_database: unsupported bulk operation {op!r}")


    def _update_atomically(self, op: UpdateOne | UpdateMany | ReplaceOne[Any]) -> Any:
        """One update, all or nothing: mongomock raises ``TypeError`` half-way through an
        update a server refuses (``$inc`` of a string, ``$push`` onto a non-array) and keeps
        what it changed so far; here the documents are restored and the operation fails
        with a write error (code 14, TypeMismatch), as on a server."""
        _no_extras(op, "collation", "hint", "sort")
        filter_, doc, upsert = _arg(op, "filter"), _arg(op, "doc"), bool(_arg(op, "upsert"))
        before = list(self.find(filter_, limit=0 if isinstance(op, UpdateMany) else 1))
        try:
            if isinstance(op, ReplaceOne):
                return self.replace_one(filter_, doc, upsert=upsert)
            update = self.update_one if isinstance(op, UpdateOne) else self.update_many
            return update(filter_, doc, upsert=upsert, array_filters=_arg(op, "array_filters"))
        except (TypeError, ValueError) as exc:
            for old in before:
                self.replace_one({"_id": old["_id"]}, old)
            errmsg = f"TypeMismatch: {exc}"
            raise WriteError(errmsg, code=_TYPE_MISMATCH,
                             details={"code": _TYPE_MISMATCH, "errmsg": errmsg}) from exc


_TYPE_MISMATCH = 14


def _no_extras(op: Any, *names: str) -> None:
    used = [n for n in names if _arg(op, n) is not None]
    if used:
        raise NotImplementedError(f"memory_database: {type(op).__name__} with {used} is not "
                                  "supported (the writer never sends it); run a test that "
                                  "needs it against a real server")


def _describe(op: Any) -> dict[str, Any]:
    return {"q": _arg(op, "filter"), "u": _arg(op, "doc")}


class MemoryDatabase(_Database):  # type: ignore[misc]
    """A mongomock database whose collections are :class:`MemoryCollection`."""

    def get_collection(self, name: str, codec_options: Any = None,
                       read_preference: Any = None, write_concern: Any = None,
                       read_concern: Any = None) -> Any:
        coll = super().get_collection(name, codec_options=codec_options,
                                      read_preference=read_preference,
                                      write_concern=write_concern,
                                      read_concern=read_concern)
        if type(coll) is not MemoryCollection:
            coll.__class__ = MemoryCollection
        return coll


class MemoryClient(_Client):  # type: ignore[misc]
    """A mongomock client whose databases are :class:`MemoryDatabase`."""

    def get_database(self, name: str | None = None, **kwargs: Any) -> Any:
        db = super().get_database(name, **kwargs)
        if type(db) is not MemoryDatabase:
            db.__class__ = MemoryDatabase
        return db
