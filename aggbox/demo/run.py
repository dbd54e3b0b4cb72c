"""``aggbox demo`` end to end: generate the input, start (or reuse) MongoDB and Spark, run
pipeline rounds and dispatcher drains until no outbox entry is pending, check everything against
the oracle, print the tables. Returns the exit code: 0 when every check passes, else 1."""

from __future__ import annotations

import contextlib
import logging
import random
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from aggbox.demo.checks import Check, Evidence, run_checks
from aggbox.demo.errors import DemoError
from aggbox.demo.generate import ScenarioSpec, generate, write_lines
from aggbox.demo.model import RunRecord
from aggbox.demo.oracle import Expected, expect
from aggbox.demo.progress import Stages
from aggbox.demo.report import print_report, scenario_lines
from aggbox.demo.rounds import run_rounds
from aggbox.demo.store import pending_outbox, read_store
from aggregates.core.settings import AggboxSettings
from aggregates.domain.aggregate import Registry

__all__ = ["AGGREGATES", "DemoOptions", "run_demo"]

#: The demo's domain, written the way a domain team would write it.
AGGREGATES = "aggbox.examples.orders"

#: Loggers that would interleave INFO lines with the progress display.
_CHATTY = ("aggbox.spark", "aggbox.dispatcher", "aggbox.writer", "aggbox.servers")


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoOptions:
    scenario: ScenarioSpec
    #: keep the input and the published files here (default: a temporary directory)
    workdir: Path | None = None
    #: database name (default: ``aggbox_demo_<random>``)
    database: str | None = None
    #: keep the work directory and the database
    keep: bool = False
    max_rounds: int = 6

    def check(self) -> None:
        self.scenario.check()
        if self.max_rounds < 1:
            raise DemoError(f"--max-rounds {self.max_rounds}: at least 1 round is needed")


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """INFO logs of the components would break the progress display; warnings still show.
    With ``--log-level DEBUG`` nothing is silenced."""
    if logging.getLogger().getEffectiveLevel() <= logging.DEBUG:
        yield
        return
    saved = {name: logging.getLogger(name).level for name in _CHATTY}
    for name in _CHATTY:
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def _workdir(option: Path | None) -> tuple[Path, bool]:
    if option is None:
        return Path(tempfile.mkdtemp(prefix="aggbox-demo-")), True
    option.mkdir(parents=True, exist_ok=True)
    if any(option.iterdir()):
        raise DemoError(f"--workdir {option} is not empty; give a new or empty directory "
                        "(earlier published files would be read as input)")
    return option, False


def _console(stderr: bool = False) -> Console:
    probe = Console(stderr=stderr)
    # Logs and CI: wide enough that the checks table stays readable.
    return probe if probe.is_terminal else Console(stderr=stderr, width=120)


def run_demo(options: DemoOptions, *, console: Console | None = None,
             progress_console: Console | None = None) -> int:
    options.check()
    started = time.monotonic()
    out = console or _console()
    registry = Registry.from_module(AGGREGATES)
    scenario = generate(options.scenario)
    workdir, temporary = _workdir(options.workdir)
    database = options.database or f"aggbox_demo_{uuid.uuid4().hex[:8]}"
    try:
        with _quiet_logs(), Stages(progress_console or _console(stderr=True)) as stages:
            with stages.step(f"Generating {len(scenario.lines):,} input messages and the "
                             "oracle"):
                inputs = write_lines(workdir / "input", scenario.files())
                expected = expect(scenario.lines, registry)
            checks, record, mongo = _run(options, stages, registry, expected, inputs,
                                         workdir, database)
    finally:
        if temporary and not options.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    header = scenario_lines(scenario, mongo=mongo, database=database, workdir=str(workdir),
                            keep_database=options.keep,
                            keep_workdir=options.keep or not temporary)
    print_report(out, header=header, record=record, checks=checks,
                 seconds=time.monotonic() - started)
    return 0 if all(c.passed for c in checks) else 1


def _run(options: DemoOptions, stages: Stages, registry: Registry, expected: Expected,
         inputs: list[Path], workdir: Path, database: str
         ) -> tuple[list[Check], RunRecord, str]:
    """Start MongoDB and Spark, run the rounds, check; the database is dropped (unless
    ``--keep``) and what was started here is stopped, whatever happens."""
    from pymongo import MongoClient

    from aggbox.demo.engine import DispatcherDrain, SparkRound, spark_session
    from aggbox.servers import start_local_mongodb

    with stages.step("Starting MongoDB (AGGBOX_MONGODB_URI, else a local server)"):
        server = start_local_mongodb()
    client: MongoClient[dict[str, Any]] = MongoClient(server.uri, tz_aware=True)
    try:
        settings = AggboxSettings.load(mongodb_uri=server.uri, database=database)
        db = client[database]
        with stages.step("Starting Spark"):
            spark, own_session = spark_session(workdir)
        try:
            record = run_rounds(
                inputs,
                workdir=workdir,
                process=SparkRound(spark, aggregates=AGGREGATES, settings=settings),
                drain=DispatcherDrain(aggregates=AGGREGATES, settings=settings),
                pending=lambda: pending_outbox(db, registry),
                redeliver_rate=options.scenario.duplicate_rate,
                rng=random.Random(options.scenario.seed + 1),
                max_rounds=options.max_rounds,
                step=stages.step,
            )
            with stages.step("Checking the store against the oracle and the invariants"):
                store = read_store(db, registry, settings)
                checks = run_checks(Evidence(expected, store, record, registry))
        finally:
            if own_session:
                spark.stop()
    finally:
        if not options.keep:
            client.drop_database(database)
        client.close()
        server.stop()
    return checks, record, server.kind
