"""Issue 32: a wheel shipped with ``--py-files`` whose handler imports a helper package that
was not shipped. On a standalone cluster and on Spark Connect, ``aggbox run`` fails with one
line naming the module and how to ship it; nothing is dead-lettered and the documents stay as
they were — the input is still there: run again with the helper shipped too, everything is
applied (docs/design.md "Deployment errors")."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.spark.conftest import REPO
from tests.spark.servers import Cluster, spark_env, standalone_cluster

pytestmark = [pytest.mark.spark, pytest.mark.mongo]

HELPER = "deploy_helpers"

#: The team's aggregates module: ``Priced`` needs the helper package, ``Tick`` does not.
_MODULE = f'''
from dataclasses import dataclass, replace

from aggregates import AggregateType, Message


@dataclass(frozen=True)
class Meter:
    ticks: int = 0
    total: int = 0


meters = AggregateType("Meter", state=Meter, collection="meters")


@meters.handles("Tick")
def tick(state: Meter, msg: Message) -> Meter:
    return replace(state, ticks=state.ticks + 1)


@meters.handles("Priced")
def priced(state: Meter, msg: Message) -> Meter:
    import {HELPER}  # a dependency of the team's code, installed on the developer's machine

    return replace(state, total=state.total + {HELPER}.price(msg.payload))
'''


def _wheel(directory: Path, name: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel of ``files`` (path → text)."""
    wheel = directory / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
        info = f"{name}-1.0.dist-info"
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: aggbox-tests\n"
                                    "Root-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return wheel


@pytest.fixture
def shipped(tmp_path: Path) -> dict[str, Any]:
    """The team's wheel (without its helper package), the helper's own wheel, and input:
    meters m-0..m-2 created by ``Tick``, then ``Priced`` messages for them."""
    module = f"meters_{uuid.uuid4().hex[:8]}"
    d = tmp_path / "dist"
    d.mkdir()
    ticks = [_envelope(f"tick-{i}", "Tick", f"m-{i}") for i in range(3)]
    priced = [_envelope(f"priced-{i}", "Priced", f"m-{i % 3}", amount=i + 1) for i in range(6)]
    for name, records in (("ticks", ticks), ("priced", priced)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return {
        "module": module,
        "wheel": _wheel(d, module, {f"{module}.py": _MODULE}),
        "helper": _wheel(d, HELPER, {f"{HELPER}/__init__.py":
                                     "def price(payload):\n    return int(payload['amount'])\n"}),
        "ticks": tmp_path / "ticks.jsonl", "priced": tmp_path / "priced.jsonl",
    }


def _envelope(mid: str, mtype: str, aid: str, **payload: Any) -> dict[str, Any]:
    return {"message_id": mid, "type": mtype, "aggregate_type": "Meter", "aggregate_id": aid,
            "payload": payload, "occurred_at": "2024-05-01T12:00:00Z"}


def _check_failed(done: subprocess.CompletedProcess[str]) -> None:
    """Exit status 1, stdout one JSON object saying so (no summary of a run that did not
    happen; issue 40, item 7), and one ``aggbox run: error:`` line naming the module and how
    to ship it, no traceback."""
    assert done.returncode == 1, done.stderr[-4000:]
    failed = json.loads(done.stdout)
    assert failed["exit_status"] == 1 and f"cannot import module '{HELPER}'" in failed["error"]
    errors = [line for line in done.stderr.splitlines() if line.startswith("aggbox run:")]
    assert len(errors) == 1, done.stderr[-4000:]
    line = errors[0]
    assert line.startswith("aggbox run: error: the handler of Meter for 'Priced' cannot "
                           f"import module '{HELPER}' (ModuleNotFoundError: No module named "
                           f"'{HELPER}')"), line
    assert "--py-files" in line and "pip install" in line
    assert "Traceback" not in done.stderr


def _check_untouched(db: Any) -> None:
    assert db.aggbox_dead_letters.count_documents({}) == 0
    assert db.aggbox_parked.count_documents({}) == 0
    assert sorted((d["_id"], d["state"]) for d in db.meters.find()) == [
        (f"m-{i}", {"ticks": 1, "total": 0}) for i in range(3)]


def _summary(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"] is True
    return result


# -- a standalone cluster ------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with standalone_cluster(tmp_path_factory.mktemp("cluster"), workers=2,
                            worker_memory="640m") as c:
        yield c


def test_a_wheel_missing_its_dependency_on_a_standalone_cluster(
        cluster: Cluster, shipped: dict[str, Any], db: Any, mongo_uri: str) -> None:
    def run(inp: Path, *py_files: Path) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "aggbox.cli", "run", "--master", cluster.master,
               "--input", str(inp), "--aggregates", shipped["module"],
               "--mongodb-uri", mongo_uri, "--database", db.name, "--no-progress", "--json",
               "--shuffle-partitions", "2", "--conf", "spark.executor.memory=512m",
               "--conf", "spark.executor.cores=1", "--conf", "spark.cores.max=2",
               "--conf", "spark.driver.memory=512m", "--conf", "spark.ui.enabled=false"]
        for p in py_files:
            cmd += ["--py-files", str(p)]
        env = spark_env(pythonpath=[])  # the modules come from --py-files only
        env["AGGBOX_LOG_FILE"] = str(cluster.workdir / f"aggbox-{uuid.uuid4().hex[:6]}.log")
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env,
                              cwd=cluster.workdir, check=False)

    assert _summary(run(shipped["ticks"], shipped["wheel"]))["applied"] == 3

    _check_failed(run(shipped["priced"], shipped["wheel"]))
    _check_untouched(db)

    # Shipped with its dependency, the same input is applied: nothing was lost.
    fixed = _summary(run(shipped["priced"], shipped["wheel"], shipped["helper"]))
    assert fixed["applied"] == 6 and fixed["dead_lettered"] == 0
    assert sorted((d["_id"], d["state"]["total"]) for d in db.meters.find()) == [
        ("m-0", 1 + 4), ("m-1", 2 + 5), ("m-2", 3 + 6)]


# -- Spark Connect -------------------------------------------------------------------------


def test_a_wheel_missing_its_dependency_on_spark_connect(
        connect_server: str, shipped: dict[str, Any], db: Any, mongo_uri: str) -> None:
    def run(inp: Path, *py_files: Path) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "aggbox.cli", "run", "--remote", connect_server,
               "--input", str(inp), "--aggregates", shipped["module"],
               "--mongodb-uri", mongo_uri, "--database", db.name, "--no-progress", "--json",
               "--shuffle-partitions", "2"]
        for p in py_files:
            cmd += ["--py-files", str(p)]
        # The client imports the team's module from its wheel (as on the developer's
        # machine); the server gets it with --py-files.
        env = spark_env(pythonpath=[str(REPO), str(shipped["wheel"])])
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env,
                              cwd=REPO, check=False)

    assert _summary(run(shipped["ticks"], shipped["wheel"]))["applied"] == 3

    _check_failed(run(shipped["priced"], shipped["wheel"]))
    _check_untouched(db)

    fixed = _summary(run(shipped["priced"], shipped["wheel"], shipped["helper"]))
    assert fixed["applied"] == 6 and fixed["dead_lettered"] == 0
    assert sorted((d["_id"], d["state"]["total"]) for d in db.meters.find()) == [
        ("m-0", 1 + 4), ("m-1", 2 + 5), ("m-2", 3 + 6)]


# -- local mode: the attempts ----------------------------------------------------------------


def test_a_deployment_error_is_not_retried(spark_session: Any, db: Any, mongo_uri: str,
                                           tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 40, item 6: the error fails every attempt the same way, yet Spark retried the
    task (``local[2, 4]``: 4 attempts; on a cluster 8 failed attempts, 511 s). The handler
    notes the task attempt of each call in a file: one attempt (the first: attempt number
    0), then the one line (and with --json one object), nothing written."""
    from aggbox.cli import main

    calls = tmp_path / "calls.txt"
    record = _envelope("priced-1", "Priced", "m-0", touch=str(calls))
    (tmp_path / "in.jsonl").write_text(json.dumps(record) + "\n")
    rc = main(["run", "--input", str(tmp_path / "in.jsonl"), "--aggregates",
               "tests.spark.deploy_domain", "--mongodb-uri", mongo_uri, "--database",
               db.name, "--no-progress", "--json", "--shuffle-partitions", "2"])
    out, err = capsys.readouterr()
    assert rc == 1, err
    attempts = set(calls.read_text().splitlines())
    assert len(attempts) == 1 and attempts.pop().endswith(".0"), calls.read_text()  # no retry
    line = ("the handler of Meter for 'Priced' cannot import module "
            "'aggbox_helper_never_shipped' (ModuleNotFoundError: No module named "
            "'aggbox_helper_never_shipped')")
    errors = [x for x in err.splitlines() if x.startswith("aggbox run:")]
    assert len(errors) == 1 and errors[0].startswith(f"aggbox run: error: {line}"), err
    obj = json.loads(out)  # --json: one object on stdout (item 7)
    assert obj["exit_status"] == 1 and obj["error"].startswith(line)
    assert db.deploy_meters.count_documents({}) == 0
    assert db.aggbox_dead_letters.count_documents({}) == 0
    assert db.aggbox_parked.count_documents({}) == 0
