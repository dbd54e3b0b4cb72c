"""Running the checks against one server (I/O): connect (one line when nothing answers, or
when what answers is not a MongoDB server), make sure the scratch database is empty, run
every check in it, drop it.

Every check is isolated: whatever it raises — a server error, a reply the driver cannot read
(pymongo's ``KeyError: 'nModified'`` from a bulk reply without it), an error of aggbox's own
code — is that check's FAIL line with what was seen (UNSUPPORTED when the server says it
does not implement it and aggbox has a fallback), and the next check runs: the report
always has every line and a verdict.

Only the scratch database is written to; the server is otherwise only asked ``ping``,
``buildInfo`` and ``isMaster``/``hello`` (admin commands every user may run)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pymongo import MongoClient
from pymongo.errors import PyMongoError

from aggbox.checkstore.checks import CHECKS, LAST, Check, Context
from aggbox.checkstore.logic import client_options, describe_server, uri_options
from aggbox.checkstore.probe import not_mongodb, silent
from aggbox.checkstore.report import CheckResult, Report, Status
from aggbox.checkstore.streams import stream_checks, stream_failure
from aggregates.core.errors import AggboxError
from aggregates.core.settings import AggboxSettings
from aggregates.core.unsupported import not_implemented
from aggregates.core.uri import redact_uri
from dispatcher.core.errors import TRACE_LOGGER, describe_store_error, is_unreachable, one_line

__all__ = ["NotEmpty", "NotMongoDB", "Target", "Unreachable", "check_store", "seen_in"]


class Unreachable(AggboxError):
    """No server answered within the server selection timeout (or it refused us at once):
    ``str()`` is the one line for stderr."""


class NotMongoDB(Unreachable):
    """Something accepted the connection but does not speak MongoDB's protocol (a Kafka
    broker's port, a web server, …)."""


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
            ctx = Context(db, settings, hello, uri_options(target.uri), target.uri, options)
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
            errors = [d.error for d in
                      client.topology_description.server_descriptions().values()]
            why = None if silent(errors) else not_mongodb(
                target.uri, timeout / 1000 if timeout else 5.0)
            if why:
                raise NotMongoDB(
                    f"{why}: not a MongoDB server; check that {target.source} names the "
                    "host and port of a MongoDB") from None
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
    except Exception as exc:  # whatever the server or the driver did: this check's line
        _trace(check.id, exc)
        seen = seen_in(exc)
        if not_implemented(exc) and check.fallback:
            status, aggbox = Status.UNSUPPORTED, check.fallback
        else:
            status, aggbox = Status.FAIL, check.if_failed
    return CheckResult(check.id, check.title, status, seen, aggbox)


def seen_in(exc: BaseException) -> str:
    """What a check saw when it raised ``exc``, in one line: the server's error (code,
    name, message), or the driver failing to read the server's reply."""
    if not_implemented(exc):
        return f"not implemented by this server: {describe_store_error(exc)}"
    if isinstance(exc, PyMongoError | AggboxError):
        return describe_store_error(exc)
    frame = _last_frame(exc)
    if frame is not None and "/pymongo/" in frame:
        return (f"the driver could not read the server's reply: {type(exc).__name__} "
                f"{one_line(exc, 80)} in {frame.rpartition('/pymongo/')[2]} (a field MongoDB "
                "sends is missing)")
    return f"{type(exc).__name__}: {one_line(exc)}"


def _last_frame(exc: BaseException) -> str | None:
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return None if tb is None else tb.tb_frame.f_code.co_filename


def _trace(check: str, exc: BaseException) -> None:
    logging.getLogger(TRACE_LOGGER).debug("check-store: %s raised", check,
                                          exc_info=(type(exc), exc, exc.__traceback__))


def _streams(uri: str, options: Mapping[str, Any], database: str) -> list[CheckResult]:
    try:
        return asyncio.run(stream_checks(uri, options, database))
    except Exception as exc:  # whatever happened: the two stream lines say it
        _trace("change_stream", exc)
        return stream_failure(seen_in(exc))


def _drop(client: MongoClient[dict[str, Any]], database: str) -> bool:
    try:
        client.drop_database(database)
    except PyMongoError as exc:  # the header says "NOT dropped: drop it yourself"
        _trace("drop", exc)
        return False
    return True
