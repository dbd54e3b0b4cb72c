"""Pre-flight before Spark (issue 34, item 2): ``aggbox run`` / ``aggbox stream`` check the
aggregates module, the input, ``--master`` and Java before any JVM starts, each failure one
line on stderr naming the thing and what to do, exit status 1. Real processes of the
``aggbox`` command; for the checks other than Java, ``JAVA_HOME`` names no Java, so a command
that reached Spark would fail with a different line.

Before: ``--aggregates libary`` failed after 12.6 s, a missing input after 10 s with
``[PATH_NOT_FOUND]``, a bad ``--master`` with a JVM stack trace, no Java with
``JAVA_HOME is not set``; a domain module in the current folder could not be imported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.spark.helpers import make_records, write_jsonl

AGGBOX = str(Path(sys.executable).with_name("aggbox"))
REPO = Path(__file__).resolve().parents[1]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.upper().startswith("AGGBOX_") and k != "PYTHONPATH"}
    env.update({"AGGBOX_HOME": str(tmp_path / "home"),
                "AGGBOX_LOG_FILE": str(tmp_path / "trace.log"),
                "JAVA_HOME": str(tmp_path / "no-java"), **extra})
    return env


def _fails(tmp_path: Path, argv: list[str], **env: str) -> str:
    """Run ``aggbox ARGV`` in ``tmp_path``: exit status 1 and the one line on stderr."""
    done = subprocess.run([AGGBOX, *argv, "--no-progress"], cwd=tmp_path,
                          env=_env(tmp_path, **env), capture_output=True, text=True,
                          timeout=600, check=False)  # a hang guard, not a time limit
    lines = [x for x in done.stderr.splitlines() if x.strip()]
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr and "JAVA_GATEWAY" not in done.stderr
    return lines[0]


@pytest.fixture
def messages(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text('{"message_id": "m-1"}\n')
    return path


def test_aggregates_module_checked_before_spark(tmp_path: Path, messages: Path) -> None:
    line = _fails(tmp_path, ["run", "--input", str(messages), "--aggregates", "libary"])
    assert line.startswith("aggbox run: error: --aggregates libary: cannot import aggregates "
                           "module 'libary': no module of that name in the current folder"), line
    line = _fails(tmp_path, ["run", "--input", str(messages), "--aggregates", "json"])
    assert "--aggregates json" in line and "defines no aggregate types" in line, line
    # A module that exists but fails to import: its own error, named.
    (tmp_path / "broken.py").write_text("import not_installed_dependency\n")
    line = _fails(tmp_path, ["run", "--input", str(messages), "--aggregates", "broken"])
    assert "--aggregates broken" in line and "not_installed_dependency" in line, line


def test_input_checked_before_spark(tmp_path: Path, messages: Path) -> None:
    agg = ["--aggregates", "aggbox.examples.orders"]
    line = _fails(tmp_path, ["run", "--input", "missing.jsonl", *agg])
    assert "--input missing.jsonl" in line and "no such file" in line, line
    line = _fails(tmp_path, ["run", "--input", str(messages), "nothing-*.jsonl", *agg])
    assert "--input nothing-*.jsonl" in line and "matches no file" in line, line
    line = _fails(tmp_path, ["stream", "--directory", "incoming", "--checkpoint", "ck", *agg])
    assert "--directory incoming" in line and "no such directory" in line, line


def test_master_checked_before_spark(tmp_path: Path, messages: Path) -> None:
    line = _fails(tmp_path, ["run", "--input", str(messages), "--aggregates",
                             "aggbox.examples.orders", "--master", "lokal[2]"])
    assert line.startswith("aggbox run: error: --master lokal[2]: not a Spark master"), line


def test_java_checked_before_spark(tmp_path: Path, messages: Path) -> None:
    argv = ["run", "--input", str(messages), "--aggregates", "aggbox.examples.orders"]
    line = _fails(tmp_path, argv)  # JAVA_HOME names no Java
    assert "aggbox needs Java 17 or later: install openjdk-17 or set JAVA_HOME" in line, line
    assert f"JAVA_HOME={tmp_path / 'no-java'}" in line, line
    old = tmp_path / "jdk11"  # a Java that says it is 11
    (old / "bin").mkdir(parents=True)
    (old / "bin" / "java").write_text(
        '#!/bin/sh\necho \'openjdk version "11.0.22" 2024-01-16\' >&2\n')
    (old / "bin" / "java").chmod(0o755)
    line = _fails(tmp_path, argv, JAVA_HOME=str(old))
    assert "is Java 11: aggbox needs Java 17 or later" in line, line
    no_java_path = tmp_path / "bin"
    no_java_path.mkdir()
    env = _env(tmp_path, PATH=str(no_java_path))
    env.pop("JAVA_HOME")
    done = subprocess.run([AGGBOX, *argv, "--no-progress"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        "aggbox run: error: no Java found (JAVA_HOME is not set, no java on PATH): aggbox needs "
        "Java 17 or later: install openjdk-17 or set JAVA_HOME"], done.stderr


@pytest.mark.spark
@pytest.mark.mongo
def test_a_domain_module_in_the_current_folder_runs_end_to_end(
        tmp_path: Path, mongo_uri: str, db: Any) -> None:
    """``--aggregates bankdomain`` with ``bankdomain.py`` in the current folder, no
    PYTHONPATH: the driver and the local executors import it."""
    shutil.copy(REPO / "tests" / "spark" / "domain.py", tmp_path / "bankdomain.py")
    records = make_records(seed=7, accounts=5, ledgers=2, dup_rate=0)
    write_jsonl(tmp_path / "in.jsonl", records)
    java_home = os.environ.get("JAVA_HOME")
    env = _env(tmp_path)
    if java_home:
        env["JAVA_HOME"] = java_home
    else:
        env.pop("JAVA_HOME")
    done = subprocess.run(
        [AGGBOX, "run", "--input", "in.jsonl", "--aggregates", "bankdomain", "--master",
         "local[2]", "--mongodb-uri", mongo_uri, "--database", db.name, "--json",
         "--no-progress"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["applied"] == len(records) and summary["ok"] is True, summary
    assert sum(db[c].count_documents({}) for c in db.list_collection_names()) > 0


@pytest.mark.parametrize("as_json", [False, True])
def test_a_server_without_ttl_indexes_is_refused_before_spark_and_left_empty(
        tmp_path: Path, ferretdb_server: Any, as_json: bool) -> None:
    """Issue 40, item 8: against FerretDB 1.24.2 (no TTL indexes) ``aggbox run`` refused only
    after the Spark JVM started and after it had created the collections, their indexes,
    ``aggbox_dead_letters`` and ``aggbox_parked``. Now the pre-flight refuses (``JAVA_HOME``
    names no Java: Spark could not have started) with the ``aggbox run: error:`` line of
    every other run error, and the database holds no collection. With ``--json``: stdout
    is one JSON object saying it (item 7)."""
    from pymongo import MongoClient

    write_jsonl(tmp_path / "in.jsonl", make_records(seed=32, accounts=2, ledgers=1,
                                                    dup_rate=0))
    database = f"t_preflight_ttl_{int(as_json)}"
    client: MongoClient[dict[str, Any]] = MongoClient(ferretdb_server.uri)
    client.drop_database(database)
    argv = ["run", "--input", str(tmp_path / "in.jsonl"), "--aggregates", "tests.spark.domain",
            "--mongodb-uri", ferretdb_server.uri, "--database", database, "--no-progress"]
    done = subprocess.run([AGGBOX, *argv, *(["--json"] if as_json else [])], cwd=tmp_path,
                          env=_env(tmp_path, PYTHONPATH=str(REPO)), capture_output=True,
                          text=True, timeout=600, check=False)  # a hang guard
    try:
        assert done.returncode == 1, done.stderr
        assert done.stderr.strip().splitlines() == [
            "aggbox run: error: the server does not support TTL indexes (expireAfterSeconds; "
            "code 238): aggbox needs one on accounts_inbox_archive to forget the ids of Inbox "
            "dedup after the dedup horizon; use MongoDB (types with HighWater dedup need no "
            "archive), and run `aggbox check-store` to see what else this server lacks"
        ], done.stderr
        if as_json:
            obj = json.loads(done.stdout)
            assert obj["exit_status"] == 1 and obj["error"].startswith(
                "the server does not support TTL indexes")
        else:
            assert done.stdout == ""
        assert client[database].list_collection_names() == []  # nothing created
    finally:
        client.drop_database(database)
        client.close()
