"""Issue 34: ``aggbox stream --remote … --py-files`` with the aggregates module shipped only as
a wheel or a zip. The suite's Connect server has an empty PYTHONPATH (aggbox is installed in
its Python, the repository is not on its path), so the module reaches the executors' Python
workers (``addArtifacts``) and the server's ``foreachBatch`` process (the pipeline carries the
files, spark/pyfiles.py) only from ``--py-files``. The client imports it from the same file
(as from the developer's own environment). The wheel's ``<wheel>.zip`` copy
(``aggbox-pyfiles-*``) is gone from the client's temporary directory afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.spark.conftest import REPO
from tests.spark.helpers import assert_matches_oracle, make_records, write_jsonl
from tests.spark.servers import spark_env

pytestmark = [pytest.mark.spark, pytest.mark.mongo]

MODULE = "connectshipped"


def _slow_python(stderr: str) -> bool:
    """Spark waits a fixed 10 s for the foreachBatch Python process to connect back; on a
    loaded machine its imports take longer and the query fails before it consumed
    anything (tests/spark/test_spark_connect.py): such a run is started again once."""
    return ("Timed out while waiting for the Python worker to connect back" in stderr
            or "Python worker failed to connect back" in stderr)


def _shipped(directory: Path, kind: str) -> Path:
    """tests/spark/domain.py as module ``connectshipped``, in a pure-Python wheel or a zip."""
    text = (REPO / "tests" / "spark" / "domain.py").read_text()
    if kind == "zip":
        path = directory / f"{MODULE}.zip"
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(f"{MODULE}.py", text)
        return path
    path = directory / f"{MODULE}-1.0-py3-none-any.whl"
    info = f"{MODULE}-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{MODULE}.py", text)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {MODULE}\nVersion: 1.0\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: aggbox-tests\n"
                                    "Root-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


@pytest.mark.parametrize("kind", ["wheel", "zip"])
def test_stream_on_connect_with_the_module_only_in_py_files(
        kind: str, connect_server: str, db: Any, mongo_uri: str, tmp_path: Path) -> None:
    shipped = _shipped(tmp_path, kind)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    records = make_records(seed=34, accounts=12, ledgers=3)
    write_jsonl(inbox / "part-1.jsonl", records)
    temp = tmp_path / "client-tmp"
    temp.mkdir()
    env = spark_env(pythonpath=[str(REPO), str(shipped)])
    env["TMPDIR"] = str(temp)
    env["AGGBOX_LOG_FILE"] = str(tmp_path / "aggbox.log")
    for attempt in range(2):
        done = subprocess.run(
            [sys.executable, "-m", "aggbox.cli", "stream", "--remote", connect_server,
             "--directory", str(inbox), "--checkpoint", str(tmp_path / "checkpoint"),
             "--aggregates", MODULE, "--py-files", str(shipped), "--mongodb-uri", mongo_uri,
             "--database", db.name, "--shuffle-partitions", "2", "--timeout", "240",
             "--no-progress", "--json"],
            capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path, check=False)
        if done.returncode == 0 or not _slow_python(done.stderr) or attempt:
            break
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    unique = len({r["message_id"] for r in records})
    assert summary["ok"] and summary["input"] == len(records)
    assert summary["applied"] == unique
    assert_matches_oracle(db, records)
    assert sorted(p.name for p in temp.glob("aggbox-pyfiles-*")) == []
