"""The pure parts of ``aggbox check-store``: the client's options from the URI and
``--timeout``, the scratch database's name, what a server says it is, documents of an exact
BSON size. No I/O."""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qsl

import bson

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "MIB",
    "SCRATCH_PREFIX",
    "Probe",
    "client_options",
    "database_problem",
    "describe_server",
    "padded",
    "retryable_writes",
    "scratch_name",
    "uri_options",
]

#: ``serverSelectionTimeoutMS`` when neither ``--timeout`` nor the URI sets it.
DEFAULT_TIMEOUT_S: Final = 5.0
SCRATCH_PREFIX: Final = "aggbox_check_"
MIB: Final = 1024 * 1024
#: Databases a check never writes into, whatever ``--database`` says.
RESERVED: Final = frozenset({"admin", "local", "config"})
_BAD_NAME: Final = re.compile(r'[/\\. "$*<>:|?\x00]')


@dataclass(frozen=True)
class Probe:
    """The state of the scratch aggregate types the checks write (indexes, inbox window);
    here, below both, so that :mod:`~aggbox.checkstore.library` need not import
    :mod:`~aggbox.checkstore.checks`, which imports it."""

    n: int = 0


def uri_options(uri: str) -> dict[str, str]:
    """The options in a MongoDB URI's query string, names lower-cased (URI options are
    case-insensitive). Never resolves DNS (``mongodb+srv``) nor validates."""
    query = uri.partition("?")[2]
    return {k.lower(): v for k, v in parse_qsl(query, keep_blank_values=True)}


def client_options(uri: str, timeout_s: float | None) -> dict[str, Any]:
    """Keyword arguments for ``MongoClient``: the server selection timeout is ``--timeout``
    when given, else the URI's, else :data:`DEFAULT_TIMEOUT_S` (pymongo's own 30 s is too
    long for a check); the connect timeout likewise, unless the URI sets one."""
    options = uri_options(uri)
    kwargs: dict[str, Any] = {"tz_aware": True, "appname": "aggbox-check-store"}
    if timeout_s is not None or "serverselectiontimeoutms" not in options:
        kwargs["serverSelectionTimeoutMS"] = int(
            (timeout_s if timeout_s is not None else DEFAULT_TIMEOUT_S) * 1000)
    if "connecttimeoutms" not in options:
        kwargs["connectTimeoutMS"] = int(
            min(timeout_s if timeout_s is not None else DEFAULT_TIMEOUT_S, 20.0) * 1000)
    return kwargs


def scratch_name(token: str | None = None) -> str:
    """``aggbox_check_<8 hex digits>``: the database a check creates and drops."""
    return SCRATCH_PREFIX + (token or secrets.token_hex(4))


def database_problem(name: str) -> str | None:
    """Why ``name`` cannot be the scratch database (``None``: it can)."""
    if not name:
        return "the database name is empty"
    if name.lower() in RESERVED:
        return f"{name!r} is one of MongoDB's own databases"
    if _BAD_NAME.search(name):
        return (f"{name!r} is not a valid database name (no /, \\, ., space, \", $, *, <, "
                ">, :, |, ?)")
    if len(name.encode()) > 63:
        return f"{name!r} is longer than 63 bytes"
    return None


def describe_server(build: Mapping[str, Any], hello: Mapping[str, Any]) -> str:
    """What the server says it is, e.g. ``MongoDB 7.0.4, replica set rs0`` or
    ``mongo-java-server (reports MongoDB 5.0.0), standalone``."""
    version = str(build.get("version") or "?")
    if build.get("ferretdbVersion"):
        what = f"FerretDB {build['ferretdbVersion']} (reports MongoDB {version})"
    elif "gitVersion" not in build:  # mongo-java-server reports no gitVersion
        what = f"mongo-java-server (reports MongoDB {version})"
    else:
        what = f"MongoDB {version}"
    if hello.get("msg") == "isdbgrid":
        return f"{what}, sharded cluster (mongos)"
    if hello.get("setName"):
        return f"{what}, replica set {hello['setName']}"
    return f"{what}, standalone"


def retryable_writes(hello: Mapping[str, Any], options: Mapping[str, str]
                     ) -> tuple[bool, str]:
    """Whether the driver retries writes here (a replica set or ``mongos`` with logical
    sessions, and ``retryWrites`` not turned off in the URI), and why (one phrase)."""
    sessions = hello.get("logicalSessionTimeoutMinutes") is not None
    topology = ("mongos" if hello.get("msg") == "isdbgrid" else
                f"replica set {hello['setName']}" if hello.get("setName") else None)
    if topology is None:
        return False, "standalone server: no replica set, no failover to retry through"
    if not sessions:
        return False, f"{topology} without logical sessions"
    if options.get("retrywrites", "true").lower() == "false":
        return False, f"{topology}, but retryWrites=false in the URI"
    return True, f"{topology} with logical sessions; retryWrites on"


def padded(doc: Mapping[str, Any], size: int, field: str = "pad") -> dict[str, Any]:
    """``doc`` plus a string ``field`` such that the BSON document is exactly ``size``
    bytes."""
    base = len(bson.encode({**doc, field: ""}))
    if size < base:
        raise ValueError(f"{size} bytes is less than the document without padding ({base})")
    return {**doc, field: "x" * (size - base)}
