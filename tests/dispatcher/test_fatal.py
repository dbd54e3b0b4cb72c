"""Fatal store errors end the dispatcher within seconds, with one line and a non-zero exit
status (the trace goes to the log file); transient ones are retried.

MongoDB's answer to a wrong password comes from :class:`tests.dispatcher.authserver.
RefusingMongo`: a wire-protocol server (BSON over OP_QUERY/OP_MSG) answering ``saslStart``
with ``mongod``'s AuthenticationFailed reply (code 18). mongo-java-server, the suite's local
server, has no authentication to fail, and ``mongod`` is not installed here."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from aggregates import AggboxSettings
from dispatcher.core.errors import FatalStoreError
from dispatcher.core.settings import DispatcherSettings
from dispatcher.daemon import Dispatcher
from tests.dispatcher.authserver import RefusingMongo
from tests.dispatcher.helpers import ROOT, ListPublisher


def settings(**over: Any) -> DispatcherSettings:
    return DispatcherSettings.load(**{"collections": ["emitters"], "metrics_port": 0,
                                      "backoff_initial_ms": 50, "backoff_max_ms": 400,
                                      **over})


def test_wrong_password_exits_non_zero_within_seconds_with_one_line(tmp_path: Path) -> None:
    log_file = tmp_path / "aggbox.log"
    with RefusingMongo() as server:
        uri = server.uri(password="s3cret-wrong")
        env = {**os.environ, "AGGBOX_MONGODB_URI": uri, "AGGBOX_DATABASE": "shop",
               "AGGBOX_LOG_FILE": str(log_file), "PYTHONUNBUFFERED": "1"}
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "aggbox.commands.dispatch", "--collection", "emitters",
             "--publisher", "stdout", "--metrics-port", "0"],
            cwd=ROOT, env=env, capture_output=True, timeout=50, check=False)
        elapsed = time.monotonic() - started
        assert "saslStart" in server.commands  # the driver really tried to log in
    stderr = done.stderr.decode()
    assert done.returncode == 1, stderr
    assert elapsed < 15, elapsed  # the daemon itself: start-up plus one refused login
    errors = [x for x in stderr.splitlines() if "error:" in x]
    assert len(errors) == 1, stderr
    assert "Authentication failed" in errors[0] and "code 18" in errors[0], errors[0]
    assert "password" in errors[0]  # what to check
    assert "Traceback" not in stderr and "s3cret-wrong" not in stderr
    trace = log_file.read_text()
    assert "Traceback" in trace and "OperationFailure" in trace
    assert "s3cret-wrong" not in trace


def test_wrong_password_in_process_raises_fatal_store_error() -> None:
    with RefusingMongo() as server:
        store = AggboxSettings.load(mongodb_uri=server.uri(), database="shop")
        d = Dispatcher(settings(), store=store, publisher=ListPublisher())
        started = time.monotonic()
        with pytest.raises(FatalStoreError, match="code 18") as info:
            asyncio.run(asyncio.wait_for(d.run(), 30))
        assert time.monotonic() - started < 10
    assert "emitters" in str(info.value) and "\n" not in str(info.value)


def test_no_uri_is_a_configuration_error_not_a_local_server() -> None:
    d = Dispatcher(settings(), store=AggboxSettings.load(mongodb_uri="", database="x"),
                   publisher=ListPublisher())
    with pytest.raises(Exception, match="no MongoDB URI"):
        asyncio.run(d.run())
