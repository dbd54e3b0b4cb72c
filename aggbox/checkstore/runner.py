"""Running the checks against one server (I/O): connect (one line when nothing answers),
make sure the scratch database is empty, run every check in it, drop it.

Only the scratch database is written to; the server is otherwise only asked ``ping``,
``buildInfo`` and ``isMaster``/``hello`` (admin commands every user may run)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pymongo import MongoClient
from pymongo.errors import PyMongoError

from aggbox.checkstore.checks import CHECKS, LAST, Check, Context
from aggbox.checkstore.logic import client_options, describe_server, uri_options
from aggbox.checkstore.report import CheckResult, Report, Status
from aggbox.checkstore.streams import stream_checks, stream_failure
from aggregates.core.errors import AggboxError, StoreError
from aggregates.core.settings import AggboxSettings
from aggregates.core.uri import redact_uri
from dispatcher.errors import describe_store_error, is_unreachable

__all__ = ["NotEmpty", "Target", "Unreachable", "check_store"]


class Unreachable(AggboxError):
    """No server answered within the server selection timeout (or it refused us at once):
    ``str()`` is the one line for stderr."""


class NotEmpty(AggboxError):
    """The scratch database already holds collections: the check refuses to use it."""


@dataclass(frozen=True)
class Target:
    uri: str
    #: where the URI came from, for messages ("--uri", "AGGBOX_MONGODB_URI", …)
    source: str
    database: str
    timeout_s: float | None


def check_store(target: Target, settings: AggboxSettings) -> Report:
    """Run every check in ``target.database`` (created and dropped here). Raises
    :class:`Unreachable` or :class:`NotEmpty` before anything is written."""
    options = client_options(target.uri, target.timeout_s)
    try:
        client: MongoClient[dict[str, Any]] = MongoClient(target.uri, **options)
    except PyMongoError as exc:  # e.g. a mongodb+srv name that does not resolve
        raise Unreachable(f"MongoDB at {redact_uri(target.uri)}: "
                          f"{describe_store_error(exc)}; check {target.source}") from None
    try:
        build, hello = _introduce(client, target, options)
        db = client[target.database]
        try:
            existing = db.list_collection_names()
        except PyMongoError as exc:
            raise Unreachable(f"cannot list the collections of {target.database!r}: "
                              f"{describe_store_error(exc)}") from None
        if existing:
            raise NotEmpty(
                f"database {target.database!r} is not empty ({len(existing)} collection(s), "
                f"e.g. {sorted(existing)[0]!r}): check-store only runs in an empty scratch "
                "database that it creates and drops; choose another --database")
        results: list[CheckResult] = []
        dropped = False
        try:
            ctx = Context(db, settings, hello, uri_options(target.uri))
            results = [_run(check, ctx) for check in CHECKS]
            results += _streams(target.uri, options, target.database)
            results.append(_run(LAST, ctx))
        finally:
            dropped = _drop(client, target.database)
        return Report(redact_uri(target.uri), describe_server(build, hello), target.database,
                      results, dropped=dropped)
    finally:
        client.close()


def _introduce(client: MongoClient[dict[str, Any]], target: Target,
               options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        client.admin.command("ping")
        build = client.admin.command("buildInfo")
        try:
            hello = client.admin.command("hello")
        except PyMongoError:  # mongo-java-server has no hello
            hello = client.admin.command("isMaster")
    except PyMongoError as exc:
        shown = redact_uri(target.uri)
        timeout = options.get("serverSelectionTimeoutMS")
        if is_unreachable(exc):
            within = f" within {timeout / 1000:g}s" if timeout else ""
            raise Unreachable(
                f"MongoDB at {shown} not reachable{within} ({describe_store_error(exc)}); "
                f"check that the server runs and that {target.source} names its host and "
                "port") from None
        raise Unreachable(f"MongoDB at {shown} refused: {describe_store_error(exc)}; check "
                          f"the user, password and options in {target.source}") from None
    return dict(build), dict(hello)


def _run(check: Check, ctx: Context) -> CheckResult:
    try:
        status, seen, aggbox = check.run(ctx)
    except (PyMongoError, StoreError) as exc:  # StoreError: e.g. a write concern error
        status, seen, aggbox = Status.FAIL, describe_store_error(exc), check.if_failed
    return CheckResult(check.id, check.title, status, seen, aggbox)


def _streams(uri: str, options: Mapping[str, Any], database: str) -> list[CheckResult]:
    try:
        return asyncio.run(stream_checks(uri, options, database))
    except PyMongoError as exc:
        return stream_failure(exc)


def _drop(client: MongoClient[dict[str, Any]], database: str) -> bool:
    try:
        client.drop_database(database)
    except PyMongoError:
        return False
    return True
