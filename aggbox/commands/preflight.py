"""Reach MongoDB before a command does its real work, and say in one line when it cannot.

``aggbox run`` / ``aggbox stream`` ping the server before Spark starts, the admin commands
(:mod:`aggbox.admin`) before they read or write: a server that does not answer within the
server selection timeout ends the command with the dispatcher's line
(:func:`dispatcher.core.errors.never_reached`, docs/design.md "The dispatcher", step 7) — never
pymongo's topology description, never a password; the full error goes to the log file
(:data:`dispatcher.core.errors.TRACE_LOGGER`). A server that answers with a refusal no retry can
fix (wrong password, missing privilege: :func:`aggregates.core.storeerrors.is_fatal`) is one
line too. Anything else the server answers is left to the command.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from aggregates.core.errors import AggboxError
from aggregates.core.uri import redact_uri
from dispatcher.core.errors import TRACE_LOGGER, URI_OPTIONS, describe_store_error, never_reached

__all__ = ["DEFAULT_TIMEOUT_S", "StoreNotReached", "ping", "reach_mongodb", "run_uri_source",
           "store_problem"]

#: The server selection timeout of the pre-flight ping when the URI sets none (``aggbox
#: check-store``'s default too; pymongo's own 30 s would hide a typo in the port for that long).
DEFAULT_TIMEOUT_S: Final = 5.0


class StoreNotReached(AggboxError):
    """MongoDB did not answer, or refused: ``str()`` is the one line for the user."""


def run_uri_source(option_given: bool) -> str:
    """Where ``aggbox run``'s URI came from, as the line names it: the dispatcher's words
    (:data:`~dispatcher.core.errors.URI_OPTIONS`) for the option or the environment variable,
    else the config file."""
    from aggbox.admin import mongodb_uri_source

    source = mongodb_uri_source("--mongodb-uri" if option_given else None)
    return URI_OPTIONS if source in ("--mongodb-uri", "AGGBOX_MONGODB_URI") else source


def store_problem(uri: str, exc: BaseException, *, timeout_s: float | None,
                  source: str) -> str | None:
    """The one line for ``exc`` met while reaching the server at ``uri`` (its full trace to
    the log file); ``None`` when the server answered with something the command should
    handle itself."""
    from aggregates.core.storeerrors import is_fatal
    from dispatcher.core.errors import is_unreachable

    if is_unreachable(exc):
        message = never_reached(uri, exc, timeout_s, source=source)
    elif is_fatal(exc):
        message = (f"MongoDB at {redact_uri(uri)} refused: {describe_store_error(exc)}; "
                   f"check the user, password and options in {source}")
    else:
        return None
    logging.getLogger(TRACE_LOGGER).error(message, exc_info=(type(exc), exc,
                                                             exc.__traceback__))
    return message


def reach_mongodb(uri: str, *, source: str, timeout_s: float | None = None,
                  appname: str = "aggbox") -> None:
    """Ping any member of the deployment at ``uri``; raise :class:`StoreNotReached` (one
    line) when none answers within ``timeout_s`` (else the URI's
    ``serverSelectionTimeoutMS``, else :data:`DEFAULT_TIMEOUT_S`) or the server refuses."""
    from pymongo import MongoClient
    from pymongo.errors import PyMongoError

    options: dict[str, Any] = {"appname": appname}
    if timeout_s is not None or "serverselectiontimeoutms" not in uri.lower():
        options["serverSelectionTimeoutMS"] = int((timeout_s or DEFAULT_TIMEOUT_S) * 1000)
    try:
        client: Any = MongoClient(uri, **options)
    except PyMongoError as exc:  # e.g. a mongodb+srv name that does not resolve
        raise StoreNotReached(f"MongoDB at {redact_uri(uri)}: {describe_store_error(exc)}; "
                              f"check {source}") from None
    try:
        ping(client, uri, source=source)
    finally:
        client.close()


def ping(client: Any, uri: str, *, source: str) -> None:
    """Ping any member through ``client`` (a ``MongoClient`` for ``uri``); raise
    :class:`StoreNotReached` as :func:`reach_mongodb` does."""
    from pymongo import ReadPreference
    from pymongo.errors import PyMongoError

    try:
        # Any member answers (nearest): a replica set without a primary was reached.
        client.admin.command("ping", read_preference=ReadPreference.NEAREST)
    except PyMongoError as exc:
        message = store_problem(uri, exc, timeout_s=client.options.server_selection_timeout,
                                source=source)
        if message is not None:
            raise StoreNotReached(message) from None
