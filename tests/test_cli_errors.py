"""User-facing errors of the ``aggbox`` command: one line on stderr naming the setting, option
or environment variable and what to do (never a password), exit status 1; full traces go to
the log file (``$AGGBOX_LOG_FILE``); unknown config sections and ``AGGBOX_*`` variables are
warned about; ``parked list --json`` has one shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import aggbox.admin
import aggbox.cli
import aggbox.commands.run
from aggbox.cli import main
from aggbox.logs import configure

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "pa/ss"  # an unescaped "/" in the password
SECRET_PART = "ss@"  # what pymongo's own message would quote of it


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """No AGGBOX_* variable from the outside; the log file in the test's directory; run from
    there (relative paths, a default aggbox.log would land there)."""
    for name in list(os.environ):
        if name.upper().startswith("AGGBOX_") and name.upper() not in (
                "AGGBOX_CACHE_DIR", "AGGBOX_LOCAL_MONGO"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AGGBOX_HOME", str(tmp_path / "home"))  # no `aggbox local` server
    log_file = tmp_path / "trace.log"
    monkeypatch.setenv("AGGBOX_LOG_FILE", str(log_file))
    monkeypatch.chdir(tmp_path)
    yield log_file
    configure(log_file=False)  # drop the file handler that points into tmp_path


def error_line(err: str) -> str:
    """The single error line of stderr; anything else may only be one-line warnings."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if ": error: " in line]
    assert len(errors) == 1, err
    others = [line for line in lines if line not in errors]
    assert all("WARNING" in line or "warning:" in line for line in others), err
    return errors[0]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


RUN = ("run", "--input", "in.jsonl", "--aggregates", "aggbox.examples.orders", "--no-progress")


# -- 1. settings and URIs: one line, not a traceback ---------------------------------------------
@pytest.mark.parametrize(("name", "value", "expect"), [
    ("AGGBOX_SPARK_CONF", "notjson", "JSON object"),
    ("AGGBOX_SPARK_PY_FILES", "deps.zip", """AGGBOX_SPARK_PY_FILES='["deps.zip"]'"""),
    ("AGGBOX_SPARK_PY_FILES", '["missing.py"]', "'missing.py' is not a file"),
    ("AGGBOX_SPARK_SHUFFLE_PARTITIONS", "0", "greater than or equal to 1"),
])
def test_bad_spark_environment_variable_is_one_line(
        name: str, value: str, expect: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(name, value)
    rc, _, err = run(capsys, *RUN)
    line = error_line(err)
    assert rc == 1
    assert name in line and expect in line, line


def test_bad_dispatcher_list_variable_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AGGBOX_DISPATCHER_COLLECTIONS", "orders")
    rc, _, err = run(capsys, "dispatch", "--once")
    line = error_line(err)
    assert rc == 1
    assert "[dispatcher] collections" in line and "AGGBOX_DISPATCHER_COLLECTIONS" in line
    assert """AGGBOX_DISPATCHER_COLLECTIONS='["orders"]'""" in line


def test_not_a_mongodb_uri_names_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, *RUN, "--mongodb-uri", "http://db.example:27017")
    line = error_line(err)
    assert rc == 1
    assert "--mongodb-uri 'http://db.example:27017' is not a MongoDB URI" in line
    assert "mongodb://" in line


@pytest.mark.parametrize("where", ["option", "env"])
def test_password_with_a_slash_is_never_printed(where: str, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    uri = f"mongodb://ops:{PASSWORD}@db.example:27017/"
    if where == "option":
        rc, _, err = run(capsys, *RUN, "--mongodb-uri", uri)
        source = "--mongodb-uri"
    else:
        monkeypatch.setenv("AGGBOX_MONGODB_URI", uri)
        rc, _, err = run(capsys, *RUN)
        source = "AGGBOX_MONGODB_URI"
    line = error_line(err)
    assert rc == 1
    assert PASSWORD not in err and SECRET_PART not in err
    assert line.startswith(f"aggbox run: error: {source} 'mongodb://ops:***@db.example:27017/'")
    assert "unescaped '/'" in line and "quote_plus" in line


@pytest.mark.parametrize("uri", [f"mongodb://ops:{PASSWORD}@db.example/", "http://db.example"])
def test_admin_command_with_a_bad_uri(uri: str, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AGGBOX_MONGODB_URI", uri)
    rc, out, err = run(capsys, "deadletters", "list", "--timeout", "0.2")
    line = error_line(err)
    assert rc == 1 and out == ""
    assert "AGGBOX_MONGODB_URI" in line and SECRET_PART not in err


def test_dispatch_with_a_bad_uri_logs_no_password(clean_env: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "dispatch", "--once", "--collection", "orders",
                     "--mongodb-uri", f"mongodb://ops:{PASSWORD}@db.example/")
    line = error_line(err)
    assert rc == 1 and "--mongodb-uri" in line and SECRET_PART not in err
    assert not clean_env.exists() or SECRET_PART not in clean_env.read_text()


def test_redact_uri_hides_passwords_with_reserved_characters() -> None:
    redact = aggbox.admin.redact_uri
    assert redact("mongodb://a:b@h/x") == "mongodb://a:***@h/x"
    assert redact("mongodb://a:p/w@h/x") == "mongodb://a:***@h/x"
    assert redact("mongodb://a:p@w@h/x") == "mongodb://a:***@h/x"
    assert redact("mongodb://h:27017/x") == "mongodb://h:27017/x"


# -- 2. unknown environment variables: a warning with the closest name (sections: test_cli_small)
def test_unknown_section_and_variable_are_warned_about(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "typo.toml"
    config.write_text('database = "top"\n[spark]\nmaster = "local[1]"\n')
    monkeypatch.setenv("AGGBOX_DATABSE", "x")
    monkeypatch.setenv("AGGBOX_SPARK_MASTR", "local[1]")
    monkeypatch.setenv("AGGBOX_SPARK_MASTER", "local[1]")  # known: no warning
    monkeypatch.setenv("AGGBOX_MONGODB_URI", "http://stop.here")  # fail fast, after warning
    rc, _, err = run(capsys, "deadletters", "list", "--config", str(config))
    assert rc == 1
    warnings = [line for line in err.splitlines() if "WARNING" in line]
    assert len(warnings) == 3, err
    text = "\n".join(warnings)
    assert "unknown environment variable AGGBOX_DATABSE is ignored; did you mean " \
           "AGGBOX_DATABASE?" in text
    assert "AGGBOX_SPARK_MASTR is ignored; did you mean AGGBOX_SPARK_MASTER?" in text
    assert "setting 'database' outside any [section] is ignored; put it in [aggbox]" in text
    assert "AGGBOX_SPARK_MASTER " not in text


# -- 3. a failed Spark job: the line that matters, the trace in the log file ---------------------
class Py4JJavaError(Exception):
    """Stands in for py4j's exception: a JVM stack of hundreds of lines."""

    __module__ = "py4j.protocol"


JVM_TRACE = "\n".join([
    "An error occurred while calling o97.collectToPython.",
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 5.0 "
    "failed 4 times, most recent failure: Lost task 0.3 (TID 9): "
    "org.apache.spark.api.python.PythonException: Traceback (most recent call last):",
    '  File "/work/spark/executor.py", line 210, in write_partition',
    "aggregates.core.errors.RetryableError: downstream unavailable for down-1",
    *[f"\tat org.apache.spark.Frame{i}.run(Frame.scala:{i})" for i in range(300)],
])


def test_failed_spark_job_is_one_line_with_the_trace_in_the_log_file(
        clean_env: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    class FailingPipeline:
        def run_batch(self, inputs: Any, **options: Any) -> Any:
            raise Py4JJavaError(JVM_TRACE)

    monkeypatch.setattr(aggbox.commands.run._Context, "start", lambda self: None)
    monkeypatch.setattr(aggbox.commands.run._Context, "pipeline", lambda self: FailingPipeline())
    rc, _, err = run(capsys, *RUN, "--mongodb-uri", "mongodb://127.0.0.1:9/")
    line = error_line(err)
    assert rc == 1
    assert line == ("aggbox run: error: the Spark job failed: "
                    "aggregates.core.errors.RetryableError: "
                    f"downstream unavailable for down-1 (full trace in {clean_env})")
    logged = clean_env.read_text()
    assert "Frame299" in logged and "Traceback" in logged


def test_failed_jvm_call_without_python_error_shows_the_java_cause(
        clean_env: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    def start(self: Any) -> None:
        raise Py4JJavaError("An error occurred while calling o42.addFile.\n"
                            ": java.io.FileNotFoundException: File file:/x/deps.zip does not "
                            "exist\n\tat org.apache.hadoop.fs.RawLocalFileSystem.stat(X.java:1)")

    monkeypatch.setattr(aggbox.commands.run._Context, "start", start)
    rc, _, err = run(capsys, *RUN, "--mongodb-uri", "mongodb://127.0.0.1:9/")
    line = error_line(err)
    assert rc == 1
    assert ("the Spark job failed: java.io.FileNotFoundException: File file:/x/deps.zip does "
            "not exist (full trace in") in line


@pytest.mark.spark
@pytest.mark.mongo
def test_real_failed_spark_job_keeps_the_jvm_stack_off_stderr(
        clean_env: Path, tmp_path: Path, mongo_uri: str, db: Any) -> None:
    """A fresh process starts its own Spark: the JVM's task failures go to the log file."""
    envelope = {"message_id": "down-1", "type": "Unavailable", "aggregate_type": "Account",
                "aggregate_id": "acc-bad", "payload": {"amount": 1},
                "occurred_at": "2024-01-01T00:00:01Z"}
    (tmp_path / "in.jsonl").write_text(json.dumps(envelope) + "\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "aggbox.cli", "run", "--input", "in.jsonl", "--aggregates",
         "tests.spark.domain", "--mongodb-uri", mongo_uri, "--database", db.name,
         "--no-progress"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 1, done.stderr
    line = error_line(done.stderr)
    assert "downstream unavailable for down-1" in line and f"full trace in {clean_env}" in line
    assert len(done.stderr.splitlines()) <= 4, done.stderr  # was ~250 lines of JVM stack
    logged = clean_env.read_text()
    assert "Exception in task" in logged and "Traceback" in logged


# -- 4. parked list --json: always an object -------------------------------------------------------
@pytest.mark.mongo
def test_parked_list_json_is_always_an_object(mongo_uri: str, db: Any,
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AGGBOX_MONGODB_URI", mongo_uri)
    rc, out, _ = run(capsys, "parked", "list", "--json", "--database", db.name)
    assert rc == 0 and json.loads(out) == {"items": [], "total": 0, "blocked": []}
    rc, out, _ = run(capsys, "parked", "list", "--json", "--database", db.name,
                     "--aggregates", "aggbox.examples.orders")
    assert rc == 0 and json.loads(out) == {"items": [], "total": 0, "blocked": []}


# -- any other exception: one line, trace in the log file; Ctrl-C stays 130 ---------------------
def test_unexpected_exception_is_one_line_with_the_trace_in_the_log_file(
        clean_env: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    def broken(module: str) -> Any:
        raise RuntimeError("registry exploded\nsecond line")

    monkeypatch.setattr(aggbox.admin, "_registry", broken)
    rc, _, err = run(capsys, "indexes", "--aggregates", "aggbox.examples.orders")
    line = error_line(err)
    assert rc == 1
    assert line == ("aggbox indexes: error: RuntimeError: registry exploded … "
                    f"(full trace in {clean_env})")
    logged = clean_env.read_text()
    assert "Traceback (most recent call last)" in logged and "in broken" in logged
    assert "second line" in logged


def test_ctrl_c_exits_130(monkeypatch: pytest.MonkeyPatch,
                          capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(module: str) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(aggbox.admin, "_registry", interrupted)
    rc, _, err = run(capsys, "indexes", "--aggregates", "aggbox.examples.orders")
    assert rc == 130 and "Traceback" not in err


def test_unwritable_log_file_still_gives_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AGGBOX_LOG_FILE", str(tmp_path / "no" / "such" / "dir" / "x.log"))

    def broken(module: str) -> Any:
        raise RuntimeError("registry exploded")

    monkeypatch.setattr(aggbox.admin, "_registry", broken)
    rc, _, err = run(capsys, "indexes", "--aggregates", "aggbox.examples.orders")
    line = error_line(err)
    assert rc == 1 and "RuntimeError: registry exploded" in line
    assert "full trace in" not in line


# -- 5. the command line resolves "no URI" to the embedded server, once ---------------------------
def test_run_without_uri_hands_the_embedded_server_to_the_pipeline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/design.md "Layering": the pipeline never starts a server; `aggbox run` does."""
    import aggbox.servers
    import spark.pipeline

    calls: list[str] = []

    def embedded() -> str:
        calls.append("started")
        return "mongodb://127.0.0.1:9/?embedded=1"

    made: dict[str, Any] = {}
    monkeypatch.setattr(aggbox.servers, "mongodb_uri", embedded)
    monkeypatch.setattr(spark.pipeline, "Pipeline", lambda spark, **kw: made.update(kw))
    parser = aggbox.cli.build_parser()
    ctx = aggbox.commands.run._Context(parser.parse_args(list(RUN)), kafka=False)
    ctx.pipeline()
    assert calls == ["started"] and made["mongodb_uri"] == "mongodb://127.0.0.1:9/?embedded=1"
    monkeypatch.setenv("AGGBOX_MONGODB_URI", "mongodb://given:27017/")
    ctx = aggbox.commands.run._Context(parser.parse_args(list(RUN)), kafka=False)
    ctx.pipeline()
    assert calls == ["started"] and made["mongodb_uri"] == "mongodb://given:27017/"


def test_dispatch_without_uri_hands_the_embedded_server_to_the_daemon(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import aggbox.servers
    import dispatcher.daemon
    from dispatcher.observe.metrics import Metrics

    stores: list[Any] = []

    class FakeDispatcher:
        def __init__(self, settings: Any, *, store: Any) -> None:
            stores.append(store)
            self.metrics = Metrics()  # --once prints its counters
            self.once_left: dict[str, tuple[int, int]] = {}  # and what is left

        async def run(self, **_kw: Any) -> int:
            return 0

    monkeypatch.setattr(aggbox.servers, "mongodb_uri", lambda: "mongodb://127.0.0.1:9/?e=1")
    monkeypatch.setattr(dispatcher.daemon, "Dispatcher", FakeDispatcher)
    assert main(["dispatch", "--once", "--collection", "orders"]) == 0
    assert stores[0].mongodb_uri == "mongodb://127.0.0.1:9/?e=1"


def test_pipeline_requires_a_uri_and_never_starts_a_server() -> None:
    from aggregates.core.errors import ConfigurationError
    from aggregates.core.settings import AggboxSettings
    from spark.pipeline import Pipeline

    class Session:  # what check_session reads (spark.conf, also on Spark Connect)
        conf: dict[str, str] = {}  # noqa: RUF012

    with pytest.raises(ConfigurationError, match="no MongoDB URI"):
        Pipeline(Session(), aggregates="aggbox.examples.orders", settings=AggboxSettings())
