"""What a MongoDB server can do (:class:`MongoCapabilities`, :func:`detect_capabilities`) and
its cluster time (:func:`server_operation_time`): used by the local servers
(:mod:`aggbox.servers.mongo`) and the tests to tell what the stand-in cannot do."""

from __future__ import annotations

import calendar
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bson import Timestamp
from pymongo import MongoClient

__all__ = ["MongoCapabilities", "detect_capabilities", "server_operation_time"]


@dataclass(frozen=True)
class MongoCapabilities:
    """What the server behind a URI can do (beyond plain CRUD, which all kinds support)."""

    #: collection-level change streams exist (possibly partial, see below)
    change_streams: bool
    #: change events are complete: plain ``watch()`` works; ``updateDescription``, ``ns``,
    #: ``wallTime`` and ``documentKey`` are present and right
    change_streams_complete: bool
    #: ``getMore`` on a change stream waits (``max_await_time_ms``) instead of returning at once
    change_streams_await: bool
    #: logical sessions (causal consistency, ``operationTime`` in replies)
    sessions: bool
    #: multi-document transactions
    transactions: bool
    #: updates that would grow a document beyond 16 MB fail on the server
    enforces_16mb: bool

    @classmethod
    def replica_set(cls) -> MongoCapabilities:
        """A real replica set member or ``mongos``: everything."""
        return cls(
            change_streams=True,
            change_streams_complete=True,
            change_streams_await=True,
            sessions=True,
            transactions=True,
            enforces_16mb=True,
        )

    @classmethod
    def standalone(cls) -> MongoCapabilities:
        """A standalone ``mongod``: no oplog, hence no change streams and no transactions."""
        return cls(
            change_streams=False,
            change_streams_complete=False,
            change_streams_await=False,
            sessions=True,
            transactions=False,
            enforces_16mb=True,
        )

    @classmethod
    def mongo_java_server(cls) -> MongoCapabilities:
        """mongo-java-server with its oplog: partial change streams, no sessions, no 16 MB."""
        return cls(
            change_streams=True,
            change_streams_complete=False,
            change_streams_await=False,
            sessions=False,
            transactions=False,
            enforces_16mb=False,
        )


def detect_capabilities(client: MongoClient[Any]) -> MongoCapabilities:
    """Ask the server behind ``client`` what it is (used for ``AGGBOX_MONGODB_URI``).

    mongo-java-server is recognised by its ``buildInfo`` (no ``gitVersion``); a replica set
    member or ``mongos`` has change streams and transactions; a standalone ``mongod`` has
    neither.
    """
    build = client.admin.command("buildInfo")
    if "gitVersion" not in build:
        return MongoCapabilities.mongo_java_server()
    hello = client.admin.command("isMaster")
    if hello.get("setName") or hello.get("msg") == "isdbgrid":
        return MongoCapabilities.replica_set()
    return MongoCapabilities.standalone()


def server_operation_time(client: MongoClient[Any]) -> Timestamp:
    """A start point for ``watch(start_at_operation_time=...)`` taken *before* a sweep.

    The server's ``operationTime`` when it reports one (replica sets); otherwise (mongo-java-
    server) the server's ``localTime`` rounded down to the second, which errs on the side of
    replaying a few events rather than missing one.
    """
    reply = client.admin.command("ping")
    op_time = reply.get("operationTime")
    if isinstance(op_time, Timestamp):
        return op_time
    local_time = client.admin.command("isMaster").get("localTime")
    if isinstance(local_time, datetime):
        seconds = calendar.timegm(local_time.utctimetuple())
    else:
        seconds = int(time.time())
    return Timestamp(seconds, 0)
