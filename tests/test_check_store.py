"""``aggbox check-store`` (aggbox/checkstore/): against the suite's local server (the table,
exit 0, the scratch database dropped; a non-empty --database refused), against a
mongo-java-server started without its oplog (change streams refused: the dispatcher polls,
exit 0), against FerretDB 1.24.2 (a complete verdict whatever it answers), against Kafka's
port and a plain TCP server ("not a MongoDB server"), against a port nobody listens on (one
line, quickly; with --json one object), and the pure parts."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from aggbox.checkstore.logic import (
    DEFAULT_TIMEOUT_S,
    client_options,
    database_problem,
    padded,
    retryable_writes,
    scratch_name,
)
from aggbox.checkstore.report import CheckResult, Report, Status
from aggbox.cli import main
from aggbox.servers import LocalKafka, LocalMongo
from aggbox.servers.ferretdb import LocalFerretDB

CHECK_IDS = ["conditional_update", "bulk_errors", "upsert_race", "inbox_window",
             "set_on_insert", "outbox_pull", "bson_types", "indexes", "size_budget",
             "size_limit", "change_stream", "resume", "retryable_writes"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["check-store", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


# -- against the suite's server --------------------------------------------------------------
@pytest.mark.mongo
def test_the_local_server_passes_and_the_scratch_database_is_dropped(
        mongo_server: LocalMongo, mongo_client: MongoClient[dict[str, Any]],
        capsys: pytest.CaptureFixture[str]) -> None:
    # No --uri: AGGBOX_MONGODB_URI (the session fixture exports the server's URI).
    before = set(mongo_client.list_database_names())
    rc, out, err = run(capsys)
    assert rc == 0, out + err
    assert "aggbox_check_" in out and "(dropped)" in out
    for word in ("conditional update on {_id, _v}", "per-operation errors", "upsert race",
                 "$slice", "$setOnInsert", "$pull", "Decimal128", "TTL", "max_document_bytes",
                 "16 MiB", "change stream (the dispatcher's)", "resume after a stored token",
                 "retryable writes"):
        assert word in out, word
    assert out.count("PASS") >= 10 and "FAIL" not in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("aggbox's guarantees hold here")
    if not mongo_server.capabilities.enforces_16mb:  # mongo-java-server
        assert "aggbox's own budget guards it" in out
    after = set(mongo_client.list_database_names())
    assert not {d for d in after - before if d.startswith("aggbox_check_")}


@pytest.mark.mongo
def test_json_is_one_object_and_names_each_check(
        mongo_uri: str, mongo_server: LocalMongo, mongo_client: MongoClient[dict[str, Any]],
        capsys: pytest.CaptureFixture[str]) -> None:
    name = scratch_name()
    rc, out, err = run(capsys, "--uri", mongo_uri, "--database", name, "--json")
    assert rc == 0, out + err
    report = json.loads(out)  # the whole of stdout is one JSON object
    assert [c["id"] for c in report["checks"]] == CHECK_IDS
    statuses = {c["id"]: c["status"] for c in report["checks"]}
    assert "FAIL" not in statuses.values()
    for check in ("conditional_update", "bulk_errors", "upsert_race", "inbox_window",
                  "set_on_insert", "outbox_pull", "bson_types", "indexes", "size_budget"):
        assert statuses[check] == "PASS", report
    if mongo_server.capabilities.change_streams:
        assert statuses["change_stream"] == statuses["resume"] == "PASS"
        assert report["verdict"] == "aggbox's guarantees hold here"
    expected_limit = "PASS" if mongo_server.capabilities.enforces_16mb else "UNSUPPORTED"
    assert statuses["size_limit"] == expected_limit
    assert report["database"] == name and report["database_dropped"] is True
    assert report["exit_status"] == 0 and report["usable"] is True
    assert name not in mongo_client.list_database_names()


@pytest.mark.mongo
def test_a_non_empty_database_is_refused_and_left_alone(
        mongo_uri: str, mongo_client: MongoClient[dict[str, Any]],
        capsys: pytest.CaptureFixture[str]) -> None:
    name = scratch_name()
    mongo_client[name]["mine"].insert_one({"_id": 1})
    try:
        rc, out, err = run(capsys, "--uri", mongo_uri, "--database", name)
        assert rc == 2 and out == ""
        assert len(err.strip().splitlines()) == 1
        assert "not empty" in err and name in err
        assert mongo_client[name].list_collection_names() == ["mine"]
        assert mongo_client[name]["mine"].count_documents({}) == 1
    finally:
        mongo_client.drop_database(name)


@pytest.mark.mongo
def test_a_failing_check_fails_the_command(
        mongo_uri: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from aggbox.checkstore import checks, runner

    def stale_write_wins(ctx: checks.Context) -> checks.Outcome:
        return Status.FAIL, "stale _v matched 1", "effects could be lost"

    broken = checks.Check("conditional_update", "conditional update on {_id, _v}",
                          stale_write_wins, "")
    monkeypatch.setattr(runner, "CHECKS", (broken, *checks.CHECKS[1:2]))
    rc, out, err = run(capsys, "--uri", mongo_uri, "--json")
    assert rc == 1, err
    report = json.loads(out)
    assert report["verdict"] == ("aggbox's guarantees do not hold here: conditional update "
                                 "on {_id, _v}")
    assert report["usable"] is False and report["database_dropped"] is True


# -- a server that refuses change streams -------------------------------------------------------
@pytest.fixture(scope="module")
def no_oplog_server() -> Iterator[LocalMongo]:
    """mongo-java-server without its oplog: ``$changeStream`` refused with code 40573, as
    on a standalone mongod."""
    from aggbox.servers.mongo import start_mongo_java_server

    with start_mongo_java_server(oplog=False) as server:
        yield server


def test_without_change_streams_the_dispatcher_polls(
        no_oplog_server: LocalMongo, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "--uri", no_oplog_server.uri)
    assert rc == 0, out + err
    line = next(x for x in out.splitlines() if "change stream (the dispatcher's)" in x)
    assert line.lstrip().startswith("UNSUPPORTED")
    assert "40573" in out and "dispatcher will poll (mode auto falls back)" in out
    assert out.strip().splitlines()[-1] == (
        "aggbox's guarantees hold here with the dispatcher polling")
    assert "FAIL" not in out


# -- FerretDB: a MongoDB-wire server that is not MongoDB ------------------------------------------
#: What FerretDB 1.24.2 (SQLite) was seen to do (docs/operations.md, "Checking your MongoDB").
FERRETDB = {
    "conditional_update": "PASS",
    "bulk_errors": "FAIL",      # a bulk reply without nModified: pymongo raises KeyError
    "upsert_race": "FAIL",      # the same
    "inbox_window": "FAIL",     # nested arrays (the inbox's entries) refused, code 2
    "set_on_insert": "PASS",
    "outbox_pull": "FAIL",      # the conditional $pull is a silent no-op
    "bson_types": "FAIL",       # Decimal128 closes the connection; nested arrays refused
    "indexes": "FAIL",          # TTL: "not implemented yet" (238); sparse dropped
    "size_budget": "PASS",
    "size_limit": "UNSUPPORTED",  # an update past 16 MiB accepted
    "change_stream": "UNSUPPORTED",  # "$changeStream" not implemented (238): polling
    "resume": "UNSUPPORTED",
    "retryable_writes": "UNSUPPORTED",  # standalone
}


def test_ferretdb_gets_a_complete_verdict(ferretdb_server: LocalFerretDB,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "--uri", ferretdb_server.uri, "--json")
    assert rc == 1, err  # checks aggbox needs fail
    report = json.loads(out)
    assert report["server"].startswith("FerretDB v1.24.2 (reports MongoDB 7.0.42)")
    statuses = {c["id"]: c["status"] for c in report["checks"]}
    assert [c["id"] for c in report["checks"]] == CHECK_IDS
    assert statuses == FERRETDB, statuses
    details = {c["id"]: c["detail"] for c in report["checks"]}
    assert "KeyError 'nModified'" in details["bulk_errors"]
    assert "nested arrays are not supported" in details["inbox_window"]
    assert "the $pull removed nothing" in details["outbox_pull"]
    assert "TTL indexes (expireAfterSeconds" in details["indexes"]
    assert "238" in details["change_stream"]
    assert report["verdict"].startswith("aggbox's guarantees do not hold here: ")
    assert report["usable"] is False and report["exit_status"] == 1
    assert report["dispatcher"] == "poll" and report["database_dropped"] is True


def test_ferretdb_table_lists_every_check(ferretdb_server: LocalFerretDB,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "--uri", ferretdb_server.uri)
    assert rc == 1, err
    assert "error" not in err
    rows = [line.split()[0] for line in out.splitlines()
            if line.split() and line.split()[0] in ("PASS", "FAIL", "UNSUPPORTED")]
    assert rows == list(FERRETDB.values())
    flat = " ".join(out.split())  # the verdict wraps at the console's width
    verdict = flat[flat.index("aggbox's guarantees do not hold here: "):]
    assert verdict.endswith("indexes of writer and archive (TTL)")
    assert "per-operation errors, unordered bulk" in verdict


def test_a_server_that_ignores_slice_fails_the_window_check(
        ferretdb_server: LocalFerretDB) -> None:
    """FerretDB keeps every pushed id whatever $slice says (with bare ids: it refuses the
    inbox's [id, time, hash] entries before $slice matters); the window check's judgement
    of such a document."""
    from aggbox.checkstore.library import window_outcome

    client: MongoClient[dict[str, Any]] = MongoClient(ferretdb_server.uri)
    try:
        coll = client["slice_probe"]["w"]
        coll.insert_one({"_id": "w", "_v": 1, "inbox": ["m1", "m2"]})
        coll.update_one({"_id": "w"}, {"$inc": {"_v": 1},
                                       "$push": {"inbox": {"$each": ["m3", "m4", "m5"],
                                                           "$slice": -3}}})
        status, seen, _ = window_outcome(coll.find_one({"_id": "w"}),
                                         {"_v": 2, "inbox": ["m3", "m4", "m5"]})
    finally:
        client.drop_database("slice_probe")
        client.close()
    assert status is Status.FAIL
    assert seen == ("inbox holds 5 ids ['m1', 'm2', 'm3', 'm4', 'm5'] ($slice ignored), "
                    "expected ['m3', 'm4', 'm5']")


# -- not a MongoDB server ----------------------------------------------------------------------
def test_kafkas_port_is_not_a_mongodb_server(kafka_server: LocalKafka,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    uri = f"mongodb://{kafka_server.bootstrap_servers}/?serverSelectionTimeoutMS=2000"
    rc, out, err = run(capsys, "--uri", uri)
    assert rc == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert f"{kafka_server.bootstrap_servers} closed the connection" in lines[0]
    assert "not a MongoDB server" in lines[0] and "not reachable" not in lines[0]


@pytest.fixture
def garbage_server() -> Iterator[int]:
    """A plain TCP server on a free loopback port that answers anything with an HTTP 400."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn, contextlib.suppress(OSError):  # a client that went away
                conn.settimeout(5)
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(listener.getsockname()[1])
    stop.set()
    thread.join(10)
    listener.close()


def test_a_server_answering_garbage_is_not_a_mongodb_server(
        garbage_server: int, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "--uri", f"mongodb://127.0.0.1:{garbage_server}/",
                       "--timeout", "2", "--json")
    assert rc == 1
    report = json.loads(out)
    assert report["exit_status"] == 1 and report["checks"] == []
    assert report["error"] == (
        f"127.0.0.1:{garbage_server} answered MongoDB's hello with 'HTTP/1.1 400 Bad'…, "
        "which is no MongoDB reply: not a MongoDB server; check that --uri names the host "
        "and port of a MongoDB")
    assert err.strip() == f"aggbox check-store: error: {report['error']}"


# -- unreachable, usage errors -----------------------------------------------------------------
def test_an_unreachable_server_is_one_line_quickly(capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    rc, out, err = run(capsys, "--uri",
                       "mongodb://ada:s3cret@127.0.0.1:1/?serverSelectionTimeoutMS=2000")
    assert time.monotonic() - started < 10
    assert rc == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "not reachable" in lines[0] and "connection refused" in lines[0]
    assert "s3cret" not in err and "ada:***@" in err
    assert "Topology" not in err and "--uri" in err


def test_unreachable_with_json_prints_one_object(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "--uri",
                       "mongodb://ada:s3cret@127.0.0.1:1/?serverSelectionTimeoutMS=2000",
                       "--json")
    assert rc == 1
    report = json.loads(out)  # the whole of stdout: | jq gets one object
    assert "not reachable" in report["error"] and "connection refused" in report["error"]
    assert report["exit_status"] == 1 and report["usable"] is False
    assert report["uri"] == "mongodb://ada:***@127.0.0.1:1/?serverSelectionTimeoutMS=2000"
    assert "s3cret" not in out + err and len(err.strip().splitlines()) == 1


def test_a_missing_config_file_with_json_is_one_object(
        capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    rc, out, err = run(capsys, "--config", str(tmp_path / "missing.toml"), "--json")
    assert rc == 2 and "does not exist" in err  # a usage error, as a bad --uri
    assert json.loads(out)["error"] == f"config file {tmp_path / 'missing.toml'} does not exist"


@pytest.mark.parametrize(("text", "said"), [
    ("this is = not toml [\n", "is not valid TOML"),
    ("[agbox]\nmongodb_uri = 'mongodb://h/'\n", "unknown section [agbox]; did you mean [aggbox]?"),
    ("[aggbox]\nmax_document_bytes = 'x'\n", "max_document_bytes"),
])
def test_a_config_file_it_cannot_use_is_a_usage_error(text: str, said: str,
                                                      tmp_path: Path) -> None:
    """Issue 40, item 10: a config file that is not TOML exited 1, where usage errors (a bad
    URI, no MongoDB given) exit 2; so does every problem of the config file now, also with
    --json (one object) and for the unknown section the command line finds first."""
    config = tmp_path / "aggbox.toml"
    config.write_text(text)
    base = [sys.executable, "-m", "aggbox.cli", "check-store", "--config", str(config),
            "--uri", "mongodb://127.0.0.1:1/"]
    env = {k: v for k, v in os.environ.items() if k != "AGGBOX_MONGODB_URI"}
    done = subprocess.run(base, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("aggbox check-store: error: ") and said in done.stderr
    done = subprocess.run([*base, "--json"], capture_output=True, text=True, env=env,
                          check=False)
    assert done.returncode == 2, done.stderr
    report = json.loads(done.stdout)  # the whole of stdout
    assert report["exit_status"] == 2 and said in report["error"]
    assert report["checks"] == [] and report["usable"] is False


# -- what a pipe shows -------------------------------------------------------------------------
def test_the_last_line_is_the_whole_verdict_in_a_narrow_pipe(
        no_oplog_server: LocalMongo) -> None:
    """Issue 40, item 10: stdout a pipe, COLUMNS=40: the verdict (57 characters here) was
    wrapped over two lines; docs/operations.md says the last line is the verdict."""
    env = {**os.environ, "COLUMNS": "40"}
    done = subprocess.run([sys.executable, "-m", "aggbox.cli", "check-store", "--uri",
                           no_oplog_server.uri], capture_output=True, text=True, env=env,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == (
        "aggbox's guarantees hold here with the dispatcher polling")


# -- a server that accepts and never answers ---------------------------------------------------
@pytest.fixture
def silent_server() -> Iterator[tuple[int, list[bytes], list[threading.Thread]]]:
    """A TCP server on a free loopback port that accepts every connection, reads what comes
    and never answers; yields its port, the bytes each connection sent (noted as the
    connection ends) and the connections' threads."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()
    received: list[bytes] = []
    handlers: list[threading.Thread] = []

    def hold(conn: socket.socket) -> None:
        data = b""
        with conn, contextlib.suppress(OSError):
            conn.settimeout(0.2)
            while not stop.is_set():
                try:
                    chunk = conn.recv(65536)
                except TimeoutError:
                    continue
                if not chunk:
                    break
                data += chunk
        received.append(data)

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            handler = threading.Thread(target=hold, args=(conn,), daemon=True)
            handlers.append(handler)
            handler.start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(listener.getsockname()[1]), received, handlers
    stop.set()
    thread.join(10)
    for handler in handlers:
        handler.join(10)
    listener.close()


def test_a_silent_server_is_waited_for_once(
        silent_server: tuple[int, list[bytes], list[threading.Thread]]) -> None:
    """Issue 40, item 10: after pymongo's wait (the timeout) the hosts were asked again by
    hand, a second connection sending a bare ``hello`` that waited as long again. Told
    without a clock: pymongo's connections say who they are (the application name), the
    hand-made probe's does not — and must not come."""
    port, received, handlers = silent_server
    done = subprocess.run([sys.executable, "-m", "aggbox.cli", "check-store", "--uri",
                           f"mongodb://127.0.0.1:{port}/", "--timeout", "1", "--json"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 1, done.stderr
    assert "not reachable within 1s" in json.loads(done.stdout)["error"]
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    for handler in list(handlers):  # the command exited: every connection was closed
        handler.join(30)
    assert received, "pymongo never connected"
    for data in received:  # only pymongo's handshake, never the probe's bare hello
        assert b"aggbox-check-store" in data, data[:200]


def test_without_any_mongodb_it_says_so_and_starts_nothing(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Any) -> None:
    monkeypatch.delenv("AGGBOX_MONGODB_URI", raising=False)
    monkeypatch.delenv("AGGBOX_CONFIG", raising=False)
    monkeypatch.setenv("AGGBOX_HOME", str(tmp_path))  # no `aggbox local start` server here
    rc, out, err = run(capsys)
    assert rc == 2 and out == ""
    assert "no MongoDB to check" in err and "never starts a server" in err


@pytest.mark.parametrize("argv", [["--database", "admin"], ["--database", "a.b"],
                                  ["--timeout", "0"], ["--uri", "localhost:27017"]])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    rc, out, err = run(capsys, *argv, "--json")
    assert rc == 2 and json.loads(out)["exit_status"] == 2
    assert json.loads(out)["error"] in err


# -- pure parts ----------------------------------------------------------------------------------
def result(check: str, status: Status) -> CheckResult:
    return CheckResult(check, check.replace("_", " "), status, "seen", "aggbox")


def test_verdicts_and_exit_statuses() -> None:
    ok = [result("conditional_update", Status.PASS), result("size_limit", Status.UNSUPPORTED)]
    assert Report("u", "s", "d", ok).verdict == "aggbox's guarantees hold here"
    polling = [*ok, result("change_stream", Status.UNSUPPORTED)]
    assert Report("u", "s", "d", polling).verdict == (
        "aggbox's guarantees hold here with the dispatcher polling")
    assert Report("u", "s", "d", polling).exit_status == 0
    failed = Report("u", "s", "d", [*polling, result("bson_types", Status.FAIL)])
    assert failed.verdict == "aggbox's guarantees do not hold here: bson types"
    assert failed.exit_status == 1 and failed.as_dict()["usable"] is False


def test_timeouts_come_from_the_option_then_the_uri_then_the_default() -> None:
    plain = client_options("mongodb://h/", None)
    assert plain["serverSelectionTimeoutMS"] == DEFAULT_TIMEOUT_S * 1000
    in_uri = client_options("mongodb://h/?serverSelectionTimeoutMS=2000&connectTimeoutMS=9", None)
    assert "serverSelectionTimeoutMS" not in in_uri and "connectTimeoutMS" not in in_uri
    assert client_options("mongodb://h/?serverselectiontimeoutms=2000", 1.5)[
        "serverSelectionTimeoutMS"] == 1500


def test_database_names_and_sizes() -> None:
    assert scratch_name().startswith("aggbox_check_") and len(scratch_name()) == 21
    assert database_problem("aggbox_check_x") is None
    assert database_problem("local") and database_problem("a b") and database_problem("x" * 64)
    import bson

    for size in (100, 64 * 1024, 1_000_003):
        assert len(bson.encode(padded({"_id": "b", "state": {}}, size))) == size


def test_retryable_writes_need_a_replica_set_with_sessions() -> None:
    rs = {"setName": "rs0", "logicalSessionTimeoutMinutes": 30}
    assert retryable_writes(rs, {})[0] is True
    assert retryable_writes({"msg": "isdbgrid", "logicalSessionTimeoutMinutes": 30}, {})[0]
    assert retryable_writes(rs, {"retrywrites": "false"}) == (
        False, "replica set rs0, but retryWrites=false in the URI")
    assert retryable_writes({"logicalSessionTimeoutMinutes": 30}, {})[0] is False
