"""Progress in the user's units (issue 34, item 3), through the ``aggbox`` command: the
summary says how many messages at what rate, with thousands separators; on a terminal the
live display counts messages written (of the input's records) and the outcomes, Spark
stages only with ``-v``, and no log line or JVM warning is printed into it.

Before: the summary title was ``aggbox run ID (41.2 s)`` and the table ``200000``; the display
showed ``stage 2 … 3/4`` bars only, with ``INFO aggbox.spark`` lines and the JVM's
``WARNING: Using incubator modules`` printed into it.

Before the first write the display names the run's phase and its Spark tasks — starting the
job, reading and validating input, sorting by aggregate — with no rate and no ETA, which come
from the writing phase only (issue 44, item 3). Before: ``0/200,000`` with no rate, ETA or
stage for minutes, then a first ETA 3.6 times too long (its rate counted the minutes before
the first write). ``--no-progress`` prints the summary without the pipeline's raw ``INFO …
{'run_id': …}`` line (issue 44, item 7)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aggbox.cli import main
from tests.spark.helpers import make_records, write_jsonl

pytestmark = [pytest.mark.spark, pytest.mark.mongo]

AGGBOX = str(Path(sys.executable).with_name("aggbox"))
REPO = Path(__file__).resolve().parents[2]
AGG = "tests.spark.domain"


def _input(tmp_path: Path) -> int:
    records = make_records(seed=34, accounts=150, per_account=8, ledgers=0, dup_rate=0)
    write_jsonl(tmp_path / "in.jsonl", records)
    assert len(records) >= 1000
    return len(records)


def test_summary_has_the_rate_and_thousands_separators(
        spark_session: Any, db: Any, mongo_uri: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    n = _input(tmp_path)
    rc = main(["run", "--input", str(tmp_path / "in.jsonl"), "--aggregates", AGG,
               "--mongodb-uri", mongo_uri, "--database", db.name])
    captured = capsys.readouterr()
    err = captured.out + captured.err  # the tables are on stdout
    assert rc == 0, err
    title = re.search(r"\n([\d,]+) messages in ([\d.]+) s \(([\d,]+) msgs/s\)\n", err)
    assert title is not None, err
    assert title.group(1) == f"{n:,}" and "," in title.group(1), err
    assert int(title.group(3).replace(",", "")) > 0
    assert re.search(rf"│ input\s+│\s+│\s+{n:,} │", err), err
    assert "messages written" not in err  # not a terminal: no live display


def test_live_display_counts_messages_on_a_terminal(mongo_uri: str, db: Any,
                                                    tmp_path: Path) -> None:
    n = _input(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGGBOX_")}
    env.update(FORCE_COLOR="1", COLUMNS="160", AGGBOX_HOME=str(tmp_path / "home"),
               AGGBOX_LOG_FILE=str(tmp_path / "aggbox.log"))
    argv = [AGGBOX, "run", "--input", str(tmp_path / "in.jsonl"), "--aggregates", AGG,
            "--mongodb-uri", mongo_uri, "--database", db.name, "--master", "local[2]"]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900, check=False)  # a hang guard, not a time limit
    err = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", done.stderr)  # the terminal's control codes
    assert done.returncode == 0, err
    assert "messages written" in err and f"{n:,}/{n:,}" in err, err
    assert re.search(rf"read {n:,}/{n:,} · applied {n:,} · duplicate 0 · dead-lettered 0 · "
                     r"parked 0", err), err
    assert "msg/s" in err
    assert "stage " not in err  # Spark's stages only with -v
    assert "INFO aggbox.spark" not in err and "Using incubator modules" not in err, err
    log = (tmp_path / "aggbox.log").read_text()
    assert "INFO aggbox.spark: run " in log and "Using incubator modules" in log, log[-2000:]
    assert db["aggbox_progress"].count_documents({}) == 0  # deleted at the end


def test_live_counts_count_a_retried_partition_by_its_latest_attempt(db: Any) -> None:
    """Each task attempt sets its partition's running totals; a retry replaces the failed
    attempt's counts instead of adding to them (real server, no Spark)."""
    from aggregates.message.outcomes import Outcome
    from spark.live import PROGRESS_COLLECTION, LiveCounts, read_counts

    def applied(n: int) -> list[Outcome]:
        return [Outcome(f"m-{i}", "Account", "a", "applied") for i in range(n)]

    db[PROGRESS_COLLECTION].insert_one({"_id": "run-1", "p": {}})
    first, other = LiveCounts(db, "run-1", 0, 0), LiveCounts(db, "run-1", 1, 0)
    first.add(10, applied(8))
    other.add(5, [*applied(4), Outcome("d", "Account", "a", "duplicate")])
    first.flush()
    other.flush()
    assert read_counts(db, "run-1") == {"read": 15, "applied": 12, "duplicate": 1,
                                        "dead_lettered": 0, "parked": 0}
    retry = LiveCounts(db, "run-1", 0, 1)  # partition 0 again, from the start
    retry.add(10, applied(3))
    retry.flush()
    assert read_counts(db, "run-1") == {"read": 15, "applied": 7, "duplicate": 1,
                                        "dead_lettered": 0, "parked": 0}
    first.add(0, applied(2))  # the failed attempt, still writing: ignored
    first.flush()
    assert read_counts(db, "run-1")["applied"] == 7


#: tests.spark.domain whose writer tasks start 2 s late (the module sleeps when a task imports
#: it, never in the driver), so that the sort phase is on the display for a few polls.
SLOW_WRITERS = """
import time

from pyspark import TaskContext

from tests.spark.domain import accounts, ledgers  # noqa: F401  (the aggregate types)

if TaskContext.get() is not None:
    time.sleep(2)
"""

_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def frames(stderr: str) -> list[str]:
    """The lines a terminal showed, each redraw of the display one after the other."""
    parts = re.split(r"\r|\x1b\[2K|\x1b\[1A|\x1b\[\?25l", stderr)
    return [text for text in (_CONTROL.sub("", p).strip() for p in parts) if text]


def test_the_display_names_each_phase_before_the_first_write(mongo_uri: str, db: Any,
                                                             tmp_path: Path) -> None:
    team = tmp_path / "team"
    team.mkdir()
    (team / "slow_writers.py").write_text(SLOW_WRITERS)
    n = _input(team)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGGBOX_")}
    env.update(FORCE_COLOR="1", COLUMNS="160", AGGBOX_HOME=str(tmp_path / "home"),
               AGGBOX_LOG_FILE=str(tmp_path / "aggbox.log"), PYTHONPATH=str(REPO))
    # Input splits of 4 KB: the read is ~50 tasks, several polls of the display long.
    argv = [AGGBOX, "run", "--input", "in.jsonl", "--aggregates", "slow_writers",
            "--mongodb-uri", mongo_uri, "--database", db.name, "--master", "local[2]",
            "--conf", "spark.sql.files.maxPartitionBytes=4096",
            "--conf", "spark.sql.files.openCostInBytes=0"]
    done = subprocess.run(argv, cwd=team, env=env, capture_output=True, text=True,
                          timeout=900, check=False)  # a hang guard, not a time limit
    shown = frames(done.stderr)
    assert done.returncode == 0, "\n".join(shown[-40:])
    bars = [line for line in shown if not line.startswith(("read ", "⠋", "⠙", "⠹", "⠸", "⠼",
                                                           "⠴", "⠦", "⠧", "⠇", "⠏"))]
    order = []
    for line in bars:
        phase = next((p for p in PHASES if line.startswith(p)), None)
        if phase is not None and (not order or order[-1] != phase):
            order.append(phase)
    assert order == list(PHASES), (order, bars[:20])
    reading = [line for line in bars if line.startswith("reading and validating input")]
    assert any(re.search(r" \d+/\d+ tasks", line) for line in reading), reading
    before_writes = [line for line in bars if not line.startswith("messages written")]
    assert not any("ETA" in line or "msg/s" in line for line in before_writes), before_writes
    written = [line for line in bars if line.startswith("messages written")]
    assert any(f"{n:,}/{n:,}" in line and "msg/s" in line for line in written), written


PHASES = ("starting the job", "reading and validating input", "sorting by aggregate",
          "messages written")


def test_no_progress_prints_no_raw_info_line(mongo_uri: str, db: Any, tmp_path: Path) -> None:
    n = _input(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGGBOX_")}
    env.update(AGGBOX_HOME=str(tmp_path / "home"), AGGBOX_LOG_FILE=str(tmp_path / "aggbox.log"))
    argv = [AGGBOX, "run", "--input", str(tmp_path / "in.jsonl"), "--aggregates", AGG,
            "--mongodb-uri", mongo_uri, "--database", db.name, "--master", "local[2]",
            "--no-progress"]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900, check=False)  # a hang guard, not a time limit
    assert done.returncode == 0, done.stderr
    assert "{'run_id'" not in done.stderr and "INFO aggbox.spark" not in done.stderr, \
        done.stderr
    assert f"{n:,} messages in " in done.stdout, done.stdout
    assert "{'run_id'" in (tmp_path / "aggbox.log").read_text()  # kept in the log file
