"""docs/operations.md "Starting Spark from pip's PySpark" shows exactly the commands and the
environment the suite's fixtures run (issue 44, item 8): one class builds both,
``tests.spark.servers.SparkServers`` — the page shows ``DOCUMENTED`` (its settings as shell
variables), the fixtures the same methods with their own values. No port is written into a
command, the worker's directory is set (outside the virtualenv), and ``PYSPARK_PYTHON`` — not
``spark.pyspark.python`` — names the servers' Python.

Before: the page hard-coded ports 7077/8080/8081/15002 in the commands, left the worker's
directory at ``$SPARK_HOME/work`` (inside the venv), and the fixtures added
``SPARK_LOCAL_IP``, the work directory, the daemons' memory … that the page did not show."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from tests.docs.markdown import fenced_blocks
from tests.spark.servers import DOCUMENTED, SparkServers, suite_servers

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def _block() -> str:
    (block,) = [b for b in fenced_blocks(PAGE)
                if b.language == "bash" and "SparkConnectServer" in b.source]
    return block.source


def _commands(source: str) -> list[list[str]]:
    text = source.replace("\\\n", " ")
    return [shlex.split(line) for line in text.splitlines()
            if line.startswith('"$SPARK_HOME/bin/')]


def _exported(source: str) -> dict[str, str]:
    """``export NAME=VALUE …`` (and ``export NAME`` of a name set before) → name: value."""
    assigned: dict[str, str] = {}
    for line in source.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0] == "export":
            for word in words[1:]:
                name, _, value = word.partition("=")
                assigned[name] = value or assigned.get(name, "")
        elif all(re.fullmatch(r"[A-Z_]+=.*", w) for w in words):
            for word in words:
                name, _, value = word.partition("=")
                assigned.setdefault(name, value)
    return assigned


def test_the_page_shows_what_the_class_builds() -> None:
    source = _block()
    assert _commands(source) == [DOCUMENTED.master(), DOCUMENTED.worker(), DOCUMENTED.connect()]


def test_the_page_sets_the_environment_the_servers_get() -> None:
    source = _block()
    exported = _exported(source)
    # every variable of the servers' environment is exported by the page
    assert set(DOCUMENTED.env()) <= set(exported), sorted(set(DOCUMENTED.env()) - set(exported))
    assert all(value == f"${name}" for name, value in DOCUMENTED.env().items())
    assert "export PYSPARK_PYTHON=" in source and "spark.pyspark.python" not in source
    # the worker's directory is not $SPARK_HOME/work (inside the virtualenv)
    assert not exported["SPARK_WORKER_DIR"].startswith("$SPARK_HOME"), exported


def test_no_port_is_written_into_a_command() -> None:
    """Every port of a command is one of the page's variables, set in one line."""
    source = _block()
    for command in _commands(source):
        assert not any(re.search(r"(?<![\w$])(7077|8080|8081|15002)\b", w) for w in command), \
            command
    ports = ("MASTER_PORT", "MASTER_UI_PORT", "WORKER_UI_PORT", "CONNECT_PORT")
    exported = _exported(source)
    assert all(exported.get(p, "").isdigit() for p in ports), exported


def test_the_fixtures_run_the_same_methods() -> None:
    """What a fixture runs differs from the page only in the values of the settings."""
    mine = suite_servers(master_port="4242", worker_dir="/tmp/x/work")
    assert isinstance(mine, SparkServers)
    assert mine.worker()[:3] == [f"{mine.spark_home}/bin/spark-class",
                                 "org.apache.spark.deploy.worker.Worker",
                                 "spark://127.0.0.1:4242"]
    assert mine.worker()[-2:] == ["--work-dir", "/tmp/x/work"]
    assert mine.env()["SPARK_WORKER_DIR"] == "/tmp/x/work"
    masked = [re.sub(r"\$[A-Z_]+", "V", w) for w in DOCUMENTED.connect()]
    assert len(masked) - 2 == len(mine.connect())  # no --jars in the suite's default
