"""Reach MongoDB before a command does its real work, and say in one line when it cannot.

``aggbox run`` / ``aggbox stream`` ping the server before Spark starts, the admin commands
(:mod:`aggbox.admin`) before they read or write: a server that does not answer within the
server selection timeout ends the command with the dispatcher's line
(:func:`dispatcher.core.errors.never_reached`, docs/design.md "The dispatcher", step 7) — never
pymongo's topology description, never a password; the full error goes to the log file
(:data:`dispatcher.core.errors.TRACE_LOGGER`). A server that answers with a refusal no retry can
fix (wrong password, missing privilege: :func:`aggregates.core.storeerrors.is_fatal`) is one
line too. Anything else the server answers is left to the command.

Before the ping, :func:`check_before_spark` checks without a JVM what would otherwise fail
seconds into Spark (issue 34, item 2): the aggregates module (the current folder on the path),
the input, ``--master`` and Java — each failure one line saying what to do.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path
from typing import Any, Final

from aggregates.core.errors import AggboxError
from aggregates.core.uri import redact_uri
from dispatcher.core.errors import (
    FIRST_LOOK_S,
    TRACE_LOGGER,
    URI_OPTIONS,
    describe_store_error,
    never_reached,
    refused_everywhere,
)

__all__ = ["DEFAULT_TIMEOUT_S", "JAVA_MAJOR", "PreflightError", "StoreNotReached",
           "add_py_files_to_path", "check_aggregates", "check_archives", "check_before_spark",
           "check_former_collections",
           "check_inputs", "check_java", "check_master", "check_spark_start",
           "mongodb_uri_source", "ping", "reach_mongodb", "reach_store", "refused_everywhere",
           "run_uri_source", "spark_session_running", "store_problem"]

#: The server selection timeout of the pre-flight ping when the URI sets none (``aggbox
#: check-store``'s default too; pymongo's own 30 s would hide a typo in the port for that long).
DEFAULT_TIMEOUT_S: Final = 5.0


class StoreNotReached(AggboxError):
    """MongoDB did not answer, or refused: ``str()`` is the one line for the user."""


def mongodb_uri_source(option: str | None = None) -> str:
    """Where ``mongodb_uri`` came from, for messages: the option (when given), else
    ``AGGBOX_MONGODB_URI`` when set, else the config file. Re-exported by :mod:`aggbox.admin`;
    it lives here so that preflight imports nothing of the admin commands (no cycle)."""
    if option:
        return option
    if any(k.upper() == "AGGBOX_MONGODB_URI" for k in os.environ):
        return "AGGBOX_MONGODB_URI"
    return "mongodb_uri in the [aggbox] section of the config file"


def run_uri_source(option_given: bool) -> str:
    """Where ``aggbox run``'s URI came from, as the line names it: the dispatcher's words
    (:data:`~dispatcher.core.errors.URI_OPTIONS`) for the option or the environment variable,
    else the config file."""
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


def reach_store(uri: str, *, source: str, database: str, aggregates: str | None,
                appname: str = "aggbox") -> None:
    """:func:`reach_mongodb`, then :func:`check_archives` on the same server."""
    from pymongo import MongoClient

    reach_mongodb(uri, source=source, appname=appname)
    if not aggregates:
        return
    client: Any = MongoClient(uri, appname=appname, serverSelectionTimeoutMS=int(
        DEFAULT_TIMEOUT_S * 1000))
    try:
        check_former_collections(client[database], aggregates)
        check_archives(client[database], aggregates)
    finally:
        client.close()


def check_former_collections(db: Any, aggregates: str) -> None:
    """A type that names no collection and whose default changed in aggbox 0.2 (``Category``:
    ``categorys`` → ``categories``; :func:`~aggregates.domain.aggregate.default_collection`)
    while the former default still holds documents: one line saying how to keep them, before
    anything is written to the new, empty one (issue 44, item 7; docs/operations.md
    "Upgrading")."""
    from aggregates.domain.aggregate import Registry

    for atype in Registry.from_module(aggregates):
        former = atype.former_collection
        if former and db[former].find_one({}, {"_id": 1}) is not None:
            raise PreflightError(
                f"aggregate type {atype.name}: its documents are in the collection {former!r}, "
                f"its default before aggbox 0.2; the default is now {atype.collection!r}: "
                f"give the type collection={former!r} to keep them (or rename the collection "
                "when no aggbox command runs)")


def check_archives(db: Any, aggregates: str) -> None:
    """Before Spark (issue 40, item 8): the inbox archives' TTL index, the one thing of the
    run's store a MongoDB-wire server may not implement (FerretDB 1.x: code 238), is created
    first — as :meth:`~aggregates.store.writer.StoreWriter.ensure_indexes` would, idempotent
    — and on a server without TTL indexes the run stops here with the archive's own line,
    having dropped every collection this created: nothing is left on a server aggbox cannot
    run on (docs/operations.md "Before Spark starts")."""
    from aggregates.core.unsupported import UnsupportedByServer
    from aggregates.domain.aggregate import Registry

    archives = [a for a in (t.dedup.archive(db, t.collection)
                            for t in Registry.from_module(aggregates)) if a is not None]
    if not archives:
        return  # HighWater dedup only: no archive, no TTL index
    before = set(db.list_collection_names())
    try:
        for archive in archives:
            archive.ensure_indexes()
    except UnsupportedByServer as exc:
        for name in set(db.list_collection_names()) - before:
            db.drop_collection(name)  # what creating the index made
        logging.getLogger(TRACE_LOGGER).error("%s", exc, exc_info=exc)
        raise PreflightError(str(exc)) from None



def ping(client: Any, uri: str, *, source: str) -> None:
    """Ping any member through ``client`` (a ``MongoClient`` for ``uri``); raise
    :class:`StoreNotReached` as :func:`reach_mongodb` does — after about a second
    (:data:`FIRST_LOOK_S`) when every server refused the connection or has no address
    (:func:`refused_everywhere`), else when the client's server selection timeout passed."""
    import pymongo
    from pymongo import ReadPreference
    from pymongo.errors import PyMongoError

    def command() -> None:
        # Any member answers (nearest): a replica set without a primary was reached.
        client.admin.command("ping", read_preference=ReadPreference.NEAREST)

    total = client.options.server_selection_timeout
    try:
        if total > FIRST_LOOK_S:
            try:
                with pymongo.timeout(FIRST_LOOK_S):
                    command()
                return
            except PyMongoError as first:
                if refused_everywhere(client):
                    raise first from None
            with pymongo.timeout(total - FIRST_LOOK_S):  # the rest of the timeout
                command()
        else:
            command()
    except PyMongoError as exc:
        waited = FIRST_LOOK_S if total > FIRST_LOOK_S and refused_everywhere(client) else total
        message = store_problem(uri, exc, timeout_s=waited, source=source)
        if message is not None:
            raise StoreNotReached(message) from None


# -- before Spark starts (issue 34, item 2) ---------------------------------------------------

#: The Java that Spark 4 needs.
JAVA_MAJOR: Final = 17
_JAVA_HINT = (f"aggbox needs Java {JAVA_MAJOR} or later: install openjdk-{JAVA_MAJOR} or set "
              "JAVA_HOME")
_MASTER = re.compile(r"local(\[(\d+|\*)(,\s*\d+)?\])?|local-cluster\[\d+,\s*\d+,\s*\d+\]"
                     r"|spark://[^/:,\s]+:\d+(,[^/:,\s]+:\d+)*|yarn|k8s://\S+")
_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


class PreflightError(AggboxError):
    """A check before Spark failed: ``str()`` is the one line for the user."""


def check_before_spark(spark_settings: Any, args: Any, *, remote: str | None,
                       session_exists: bool) -> None:
    """What ``aggbox run`` / ``aggbox stream`` check first (docs/operations.md "Before Spark
    starts"): the aggregates module and the input; then MongoDB is pinged
    (:func:`reach_mongodb`), then :func:`check_spark_start`."""
    local = remote is None and not session_exists and spark_settings.master.startswith("local")
    add_py_files_to_path(getattr(spark_settings, "py_files", None) or [])
    check_aggregates(spark_settings.aggregates, executors_path=local)
    check_inputs(getattr(args, "input", None) or [])
    directory = getattr(args, "directory", None)
    if directory and "://" not in directory and not Path(directory).is_dir():
        raise PreflightError(f"--directory {directory}: no such directory (in {Path.cwd()}): "
                             "create it or give the folder the JSON Lines files arrive in")


def spark_session_running() -> bool:
    """A SparkSession runs in this process (spark-submit, tests), found without importing
    pyspark (~1.5 s) when nothing imported it yet."""
    sql = sys.modules.get("pyspark.sql")
    return sql is not None and sql.SparkSession.getActiveSession() is not None


def check_spark_start(spark_settings: Any, *, remote: str | None,
                      session_exists: bool) -> None:
    """``--master`` and Java, unless the session is remote (Spark Connect) or exists already
    (spark-submit, tests: ``session_exists``)."""
    if remote is None and not session_exists:
        check_master(spark_settings.master)
        check_java()


def add_py_files_to_path(py_files: list[str]) -> None:
    """The local ``--py-files`` on this process's ``sys.path`` (a ``.zip``, ``.whl`` or
    ``.egg`` itself, a ``.py`` file's folder), as Spark puts them on the driver's: an
    aggregates module shipped only that way imports here too."""
    for path in py_files:
        local = path.removeprefix("file://")
        if "://" in local or not Path(local).expanduser().exists():
            continue  # a remote file: Spark fetches it
        file = Path(local).expanduser().resolve()
        entry = str(file.parent if file.suffix == ".py" else file)
        if entry not in sys.path:
            sys.path.insert(0, entry)


def check_aggregates(module: str, *, executors_path: bool = False) -> None:
    """Import the aggregates module (the current folder first on ``sys.path``, as pytest and
    uvicorn do: :func:`~aggbox.commands.importpath.use_current_folder`) and check it defines
    aggregate types. ``executors_path``: local mode, whose Python workers are started by this
    process's JVM: the current folder goes on their ``PYTHONPATH`` too (a cluster's executors
    need ``--py-files``), and a folder there named like one of aggbox's packages, which the
    workers would import instead of aggbox's, stops the run (issue 44, item 6)."""
    import importlib
    import importlib.util

    from aggbox.commands.importpath import use_current_folder

    cwd = os.getcwd()
    shadows = use_current_folder()
    if shadows and executors_path:  # the workers would import the team's folder instead
        raise PreflightError(shadows[0].line())
    for shadow in shadows:  # this process keeps aggbox's own packages
        print(f"aggbox: warning: {shadow.line()}", file=sys.stderr)
    if executors_path:
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if cwd not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([cwd, *paths])
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a parent package that is missing, or ".x"
        found = None
    if found is None:
        raise PreflightError(
            f"--aggregates {module}: cannot import aggregates module {module!r}: no module of "
            f"that name in the current folder ({cwd}) or the installed packages: check the "
            "name, or pip install the package that defines it")
    from aggregates.domain.aggregate import AggregateType, Registry

    try:
        loaded = importlib.import_module(module)
    except Exception as exc:
        line = " ".join(f"{type(exc).__name__}: {exc}".split())
        logging.getLogger(TRACE_LOGGER).error("importing %s failed", module, exc_info=True)
        raise PreflightError(f"--aggregates {module}: importing it failed: {line}") from None
    if not isinstance(getattr(loaded, "registry", None), Registry) and not any(
            isinstance(v, AggregateType) for v in vars(loaded).values()):
        where = getattr(loaded, "__file__", None) or module
        raise PreflightError(
            f"--aggregates {module}: module {module} ({where}) defines no aggregate types "
            "(no AggregateType at its top level, no `registry`): name the module of your "
            "domain that defines them")


def check_inputs(inputs: list[str]) -> None:
    """Each local ``--input`` exists (a glob matches at least one file); URLs (``s3a://``,
    ``hdfs://`` …) are left to Spark."""
    import glob

    for path in inputs:
        if "://" in path and not path.startswith("file://"):
            continue
        local = path.removeprefix("file://")
        if glob.has_magic(local):
            if not glob.glob(os.path.expanduser(local), recursive=True):
                raise PreflightError(f"--input {path}: matches no file (in {Path.cwd()}): "
                                     "check the pattern")
        elif not Path(local).expanduser().exists():
            raise PreflightError(f"--input {path}: no such file or directory (in "
                                 f"{Path.cwd()}): check the path")


def check_master(master: str) -> None:
    """``master`` is a form Spark knows; else one line naming ``--master``."""
    if not _MASTER.fullmatch(master.strip()):
        raise PreflightError(
            f"--master {master}: not a Spark master URL: use local, local[N], local[*], "
            "spark://HOST:PORT, yarn or k8s://https://HOST:PORT (or --remote sc://HOST:PORT "
            "for Spark Connect)")


def check_java() -> int:
    """Java of ``$JAVA_HOME``, else of ``PATH``, is there and recent enough; its major
    version."""
    import shutil
    import subprocess

    home = os.environ.get("JAVA_HOME")
    if home:
        java: str | None = str(Path(home) / "bin" / "java")
        if not Path(java or "").is_file():
            raise PreflightError(f"JAVA_HOME={home} holds no bin/java: {_JAVA_HINT} to a "
                                 f"JDK {JAVA_MAJOR}+")
    else:
        java = shutil.which("java")
        if java is None:
            raise PreflightError(f"no Java found (JAVA_HOME is not set, no java on PATH): "
                                 f"{_JAVA_HINT}")
    assert java is not None
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PreflightError(f"{java} -version failed ({exc}): {_JAVA_HINT}") from None
    m = _VERSION.search(done.stderr + done.stdout)
    if done.returncode != 0 or m is None:
        raise PreflightError(f"{java} -version did not say its version: {_JAVA_HINT}")
    major = int(m.group(2) or 0) if m.group(1) == "1" else int(m.group(1))  # "1.8.0" is 8
    if major < JAVA_MAJOR:
        raise PreflightError(f"{java} is Java {major}: {_JAVA_HINT} to a JDK {JAVA_MAJOR}+")
    return major
