"""The pipeline on a standalone Spark cluster (tests/spark/servers.py: a master and two
workers with one core each, on loopback, from the installed PySpark), driven by the
``aggbox`` command in its own process with ``--master spark://…``.

The aggregates module is shipped only with ``--py-files`` (a wheel, a zip): neither the
workers' nor the driver's PYTHONPATH has it (``clusterdomain``: the text of
tests/spark/domain.py, whose handlers the oracle folds, with a 2 ms pause in ``Deposited``
so that the writer stage lasts long enough to be interrupted). An executor JVM killed in the
middle of the writer stage changes nothing: every record still ends in exactly one outcome
and the stored state is the undisturbed run's (the oracle). ``AGGBOX_CLUSTER_KILL_RUNS=5``
repeats that test five times."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
import zipfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aggbox.servers import LocalKafka, create_topic
from tests.spark.helpers import assert_matches_oracle, make_records, write_jsonl
from tests.spark.servers import Cluster, spark_env, standalone_cluster
from tests.spark.test_spark_stream import in_pipeline_order

pytestmark = [pytest.mark.spark, pytest.mark.mongo]

REPO = Path(__file__).resolve().parents[2]
MODULE = "clusterdomain"
KILL_RUNS = int(os.environ.get("AGGBOX_CLUSTER_KILL_RUNS", "1"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with standalone_cluster(tmp_path_factory.mktemp("cluster"), workers=2,
                            worker_memory="640m") as c:
        yield c


def _module_text() -> str:
    text = (REPO / "tests" / "spark" / "domain.py").read_text()
    anchor = '    amount = int(msg.payload["amount"])\n'
    assert anchor in text
    return text.replace(anchor, '    __import__("time").sleep(0.002)\n' + anchor, 1)


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The aggregates module as a pure-Python wheel and as a zip, in a directory that is on
    nobody's PYTHONPATH."""
    d = tmp_path_factory.mktemp("shipped")
    text = _module_text()
    wheel = d / f"{MODULE}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(f"{MODULE}.py", text)
        info = f"{MODULE}-1.0.dist-info"
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {MODULE}\n"
                                       "Version: 1.0\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: aggbox-tests\n"
                                    "Root-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    plain = d / f"{MODULE}.zip"
    with zipfile.ZipFile(plain, "w") as z:
        z.writestr(f"{MODULE}.py", text)
    return {"wheel": wheel, "zip": plain}


def aggbox(cluster: Cluster, command: str, db: Any, mongo_uri: str, py_file: Path,
           *args: str) -> subprocess.Popen[str]:
    """``aggbox <command>`` against the cluster, as its own process (its own driver JVM);
    PYTHONPATH empty, so ``clusterdomain`` comes only from ``--py-files``."""
    cmd = [sys.executable, "-m", "aggbox.cli", command, "--master", cluster.master,
           "--py-files", str(py_file), "--aggregates", MODULE, "--mongodb-uri", mongo_uri,
           "--database", db.name, "--shuffle-partitions", "4", "--no-progress", "--json",
           "--conf", "spark.executor.memory=512m", "--conf", "spark.executor.cores=1",
           "--conf", "spark.cores.max=2", "--conf", "spark.driver.memory=512m",
           "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.adaptive.enabled=false",
           *args]
    env = spark_env(pythonpath=[])
    env.pop("AGGBOX_CLUSTER_KILL_RUNS", None)  # a test setting, not an aggbox one
    env["AGGBOX_LOG_FILE"] = str(cluster.workdir / f"aggbox-{uuid.uuid4().hex[:6]}.log")
    env["TMPDIR"] = str(client_tmp(cluster))
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cluster.workdir)


def client_tmp(cluster: Cluster) -> Path:
    """The ``aggbox`` processes' temporary directory (``TMPDIR``)."""
    path = cluster.workdir / "client-tmp"
    path.mkdir(exist_ok=True)
    return path


def finish(proc: subprocess.Popen[str], timeout: float = 600) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{err[-4000:]}"
    summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return summary


def outcome_ids(path: Path) -> Counter[str]:
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["message_id", "from_parked"])
    rows = table.to_pylist()
    return Counter(r["message_id"] for r in rows if not r["from_parked"])


def earlier_attempt_rows(path: Path) -> list[str]:
    """The details of the outcome rows ``applied`` by an earlier attempt of the run."""
    import pyarrow.parquet as pq

    rows = pq.read_table(path, columns=["outcome", "reason", "detail"]).to_pylist()
    assert {r["outcome"] for r in rows if r["reason"] == "earlier_attempt"} <= {"applied"}
    return [str(r["detail"]) for r in rows if r["reason"] == "earlier_attempt"]


def test_run_ships_the_module_as_a_wheel(cluster: Cluster, shipped: dict[str, Path], db: Any,
                                         mongo_uri: str, tmp_path: Path) -> None:
    records = make_records(seed=80, accounts=30, ledgers=5)
    write_jsonl(tmp_path / "in.jsonl", records)
    unique = len({r["message_id"] for r in records})
    summary = finish(aggbox(cluster, "run", db, mongo_uri, shipped["wheel"],
                            "--input", str(tmp_path / "in.jsonl")))
    assert summary["ok"] and summary["input"] == len(records)
    assert summary["applied"] == unique and summary["duplicate"] == len(records) - unique
    assert_matches_oracle(db, records)
    # the wheel's <wheel>.zip copy is removed when the command exits
    assert list(client_tmp(cluster).glob("aggbox-pyfiles-*")) == []


@pytest.mark.parametrize("attempt", range(KILL_RUNS))
def test_an_executor_killed_in_the_writer_stage(cluster: Cluster, shipped: dict[str, Path],
                                                db: Any, mongo_uri: str, tmp_path: Path,
                                                attempt: int) -> None:
    records = make_records(seed=90 + attempt, accounts=300, per_account=8, ledgers=20,
                           per_ledger=20)
    write_jsonl(tmp_path / "in.jsonl", records)
    outcomes = tmp_path / "outcomes"
    expected_accounts = len({r["aggregate_id"] for r in records
                             if r["aggregate_type"] == "Account"})
    before = set(cluster.executor_pids())
    # Arrow batches of 100 rows: a writer task stores its aggregates batch after batch
    # (with the default 10,000 a task's partition is one batch, written at its very end).
    proc = aggbox(cluster, "run", db, mongo_uri, shipped["zip"], "--input",
                  str(tmp_path / "in.jsonl"), "--outcomes", str(outcomes),
                  "--conf", "spark.sql.execution.arrow.maxRecordsPerBatch=100")
    killed: list[tuple[int, int]] = []  # (pid, accounts stored when it was killed)

    def kill_in_writer_stage() -> None:
        # An executor whose Python worker (the writer) has been running for two seconds
        # (several Arrow batches written), while some but not half of the accounts are
        # stored: it is in the middle of writing.
        writing_since: dict[int, float] = {}
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            now = time.monotonic()
            for pid in cluster.executor_pids():
                if pid not in before and cluster.python_workers(pid):
                    writing_since.setdefault(pid, now)
            stored = db["accounts"].count_documents({})
            ready = [p for p, t in writing_since.items() if now - t >= 2.0]
            if ready and 0 < stored < expected_accounts // 2:
                os.kill(ready[0], signal.SIGKILL)
                killed.append((ready[0], stored))
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_in_writer_stage, daemon=True)
    killer.start()
    summary = finish(proc)
    killer.join(timeout=5)

    assert killed, "the writer stage ended before an executor could be killed"
    print(f"killed executor pid {killed[0][0]} with {killed[0][1]}/{expected_accounts} "
          f"accounts stored; applied {summary['applied']}, duplicate {summary['duplicate']}")
    assert summary["ok"] and summary["input"] == len(records)
    assert summary["dead_lettered"] == 0 and summary["parked"] == 0
    # the retried tasks find what the killed executor wrote and count it applied, once
    # (run stamps, docs/design.md "Counts that survive retries"): the undisturbed run's counts
    unique = len({r["message_id"] for r in records})
    assert summary["applied"] == unique
    assert summary["duplicate"] == len(records) - unique
    # exactly one outcome row per input record, from the surviving attempts
    (run_dir,) = outcomes.iterdir()
    assert outcome_ids(run_dir) == Counter(r["message_id"] for r in records)
    # the audit log says which attempt wrote what the killed one applied
    earlier = earlier_attempt_rows(run_dir)
    print(f"{len(earlier)} applied by the killed attempt, e.g. {earlier[:1]}")
    assert earlier, "the killed attempt had written nothing"
    assert all(d.startswith("written by task ") and "(TID " in d for d in earlier)
    assert_matches_oracle(db, records)  # the undisturbed run's final state


@pytest.mark.kafka
def test_kafka_stream_on_the_cluster(cluster: Cluster, shipped: dict[str, Path], db: Any,
                                     mongo_uri: str, tmp_path: Path,
                                     kafka_server: LocalKafka) -> None:
    from confluent_kafka import Producer

    topic = f"aggbox-cluster-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_server.bootstrap_servers, topic, partitions=2)
    records = in_pipeline_order(make_records(seed=95, accounts=30, ledgers=5))
    producer = Producer({"bootstrap.servers": kafka_server.bootstrap_servers})
    for r in records:
        producer.produce(topic, key=r["aggregate_id"], value=json.dumps(r).encode())
    producer.produce(topic, key="junk", value=b"not json")
    assert producer.flush(30) == 0
    unique = len({r["message_id"] for r in records})

    summary = finish(aggbox(cluster, "stream", db, mongo_uri, shipped["zip"],
                            "--kafka-bootstrap-servers", kafka_server.bootstrap_servers,
                            "--topic", topic, "--checkpoint", str(tmp_path / "checkpoint"),
                            "--max-offsets-per-trigger", "150", "--timeout", "240",
                            "--max-dead-letters", "1"))  # the junk record
    assert summary["ok"] and summary["batches"] >= 2
    assert summary["input"] == len(records) + 1
    assert summary["applied"] == unique and summary["dead_lettered"] == 1
    assert_matches_oracle(db, records)
