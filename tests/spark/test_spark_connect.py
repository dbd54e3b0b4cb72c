"""The pipeline on Spark Connect: a real Connect server started from the installed PySpark
(``connect_server``), clients in their own processes (a Connect client has no JVM, and
``builder.remote`` turns all of ``pyspark.sql`` into Connect for the process). A batch run
through ``aggbox run --remote``, the Python API in batch and as an ``availableNow`` Kafka
stream (``foreachBatch`` running in the server's Python), then ``aggbox stream --remote``
resuming that stream's checkpoint. The client process fails if anything touches
``sparkContext`` or creates a SparkContext (tests/spark/connect_client.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from aggbox.servers import LocalKafka, create_topic
from tests.spark.conftest import AGGREGATES, REPO
from tests.spark.helpers import assert_matches_oracle, make_records, write_jsonl
from tests.spark.test_spark_bad_input import bad_lines
from tests.spark.test_spark_stream import in_pipeline_order

pytestmark = [pytest.mark.spark, pytest.mark.mongo]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SPARK_REMOTE", None)
    env["PYTHONPATH"] = str(REPO)
    return env


#: Spark waits a fixed 10 s for the Python process that runs a Connect stream's
#: foreachBatch function to connect back; on a heavily loaded machine its imports take
#: longer and the query fails to start (before it consumed anything): started again once.
_SLOW_PYTHON = "Timed out while waiting for the Python worker to connect back"


def client(request: dict[str, Any]) -> dict[str, Any]:
    for attempt in range(2):
        done = subprocess.run([sys.executable, "-m", "tests.spark.connect_client",
                               json.dumps(request)], capture_output=True, text=True,
                              timeout=600, env=_env(), cwd=REPO, check=False)
        if done.returncode == 0 or _SLOW_PYTHON not in done.stderr or attempt:
            break
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["is_connect"] and result["session"].startswith("pyspark.sql.connect.")
    assert result["touched"] == [] and not result["gateway"] and not result["active_context"]
    return result


def aggbox(*args: str) -> subprocess.CompletedProcess[str]:
    for attempt in range(2):
        done = subprocess.run([sys.executable, "-m", "aggbox.cli", *args],
                              capture_output=True, text=True, timeout=600, env=_env(),
                              cwd=REPO, check=False)
        if done.returncode == 0 or _SLOW_PYTHON not in done.stderr or attempt:
            return done
    raise AssertionError("unreachable")


def test_batch_run_on_spark_connect(connect_server: str, db: Any, mongo_uri: str,
                                    tmp_path: Path, domain_zip: Path) -> None:
    records = make_records(seed=70, accounts=20, ledgers=4)
    write_jsonl(tmp_path / "good.jsonl", records)
    write_jsonl(tmp_path / "bad.jsonl", bad_lines())
    bad = len(bad_lines())
    unique = len({r["message_id"] for r in records})

    # the command line
    done = aggbox("run", "--remote", connect_server, "--input", str(tmp_path / "*.jsonl"),
                  "--aggregates", AGGREGATES, "--mongodb-uri", mongo_uri, "--database",
                  db.name, "--shuffle-partitions", "3", "--no-progress", "--json",
                  "--py-files", str(domain_zip))
    # dead letters: not ok (docs/operations.md "Exit status and "ok""), each reason listed
    assert done.returncode == 3, done.stderr[-4000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["ok"] is False and summary["input"] == len(records) + bad
    assert sum(r["count"] for r in summary["by_reason"]) == bad
    for row in summary["by_reason"]:
        assert row["first_message_id"] and row["first_error"], row
        assert row["command"].startswith(f"aggbox deadletters list --reason {row['reason']} ")
    assert summary["applied"] == unique and summary["dead_lettered"] == bad
    assert summary["duplicate"] == len(records) - unique
    assert_matches_oracle(db, records)

    # the Python API, same input again: everything is a duplicate or dead-lettered again
    again = client({"remote": connect_server, "mongodb_uri": mongo_uri, "database": db.name,
                    "aggregates": AGGREGATES, "inputs": [str(tmp_path / "*.jsonl")],
                    "py_files": [str(domain_zip)]})
    assert again["input"] == again["outcome_rows"] == len(records) + bad
    assert again["counts"]["applied"] == 0 and again["counts"]["duplicate"] == len(records)
    assert again["counts"]["dead_lettered"] == bad
    assert again["progress_calls"] > 0, "progress comes through the Connect progress handler"
    assert_matches_oracle(db, records)


@pytest.mark.kafka
def test_kafka_stream_on_spark_connect(connect_server: str, db: Any, mongo_uri: str,
                                       tmp_path: Path, kafka_server: LocalKafka,
                                       domain_zip: Path) -> None:
    from confluent_kafka import Producer

    topic = f"aggbox-connect-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_server.bootstrap_servers, topic, partitions=2)
    producer = Producer({"bootstrap.servers": kafka_server.bootstrap_servers})

    def produce(recs: list[dict[str, Any]], *extra: tuple[str, bytes]) -> None:
        for r in recs:
            producer.produce(topic, key=r["aggregate_id"], value=json.dumps(r).encode())
        for key, value in extra:
            producer.produce(topic, key=key, value=value)
        assert producer.flush(30) == 0

    records = in_pipeline_order(make_records(seed=71, accounts=20, ledgers=4))
    produce(records, ("junk", b'{"message_id": "cut'))
    checkpoint = str(tmp_path / "checkpoint")
    unique = len({r["message_id"] for r in records})

    first = client({"remote": connect_server, "mongodb_uri": mongo_uri, "database": db.name,
                    "aggregates": AGGREGATES, "bootstrap_servers":
                    kafka_server.bootstrap_servers, "topic": topic, "checkpoint": checkpoint,
                    "max_offsets": 80, "py_files": [str(domain_zip)]})
    assert len(first["batches"]) >= 2, "maxOffsetsPerTrigger splits the backlog"
    assert first["batch_ids"] == first["on_batch"] == sorted(first["batch_ids"])
    assert first["input"] == sum(first["batches"]) == len(records) + 1
    assert first["counts"]["applied"] == unique
    assert first["counts"]["dead_lettered"] == 1
    assert first["reasons"] == [["dead_lettered", "invalid_json", 1]]
    assert_matches_oracle(db, records)

    # aggbox stream --remote resumes the checkpoint: only the new records
    more = in_pipeline_order(make_records(seed=72, accounts=6, ledgers=2, prefix="more-"))
    produce(more)
    done = aggbox("stream", "--remote", connect_server, "--kafka-bootstrap-servers",
                  kafka_server.bootstrap_servers, "--topic", topic, "--checkpoint", checkpoint,
                  "--aggregates", AGGREGATES, "--mongodb-uri", mongo_uri, "--database", db.name,
                  "--no-progress", "--json", "--timeout", "240", "--py-files", str(domain_zip))
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["ok"] and summary["input"] == len(more) and summary["batches"] >= 1
    assert "micro-batch" in done.stderr
    assert_matches_oracle(db, records + more)
