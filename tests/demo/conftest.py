"""Fixtures of the demo tests.

- ``spark_session`` (tests/conftest.py): the one Spark session of the test process (one JVM
  per process: the first session fixes its packages, e.g. Spark's Kafka source, so the demo
  must not start a differently configured one in the same process). The demo reuses it.
- ``local_run``: a small scenario run through the real loop, the real dispatcher and the real
  store writer — without Spark — once per module; the checks' tests corrupt copies of it.
  :func:`run_locally` makes such a run on demand (e.g. with a bug patched into the library).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from aggbox.demo.engine import DispatcherDrain
from aggbox.demo.generate import Scenario, ScenarioSpec, generate, write_lines
from aggbox.demo.model import RunRecord
from aggbox.demo.oracle import Expected, expect
from aggbox.demo.rounds import run_rounds
from aggbox.demo.store import StoreView, pending_outbox, read_store
from aggbox.examples.orders import registry as orders_registry
from aggregates.core.settings import AggboxSettings
from aggregates.domain.aggregate import Registry
from tests.demo.local import LocalRound


@dataclass
class LocalRun:
    scenario: Scenario
    expected: Expected
    record: RunRecord
    store: StoreView
    registry: Registry
    db: Any
    settings: AggboxSettings


def run_locally(mongo_client: MongoClient[dict[str, Any]], mongo_uri: str, workdir: Path,
                spec: ScenarioSpec, *, max_rounds: int | None = None) -> LocalRun:
    """Generate ``spec``, run it through the loop in a new database (the caller drops
    ``run.db``), compute the oracle and read the store. With ``max_rounds`` the loop stops
    after that many rounds, and the oracle after as many generations."""
    name = f"t_demo_local_{uuid.uuid4().hex[:8]}"
    settings = AggboxSettings.load(mongodb_uri=mongo_uri, database=name)
    db = mongo_client[name]
    scenario = generate(spec)
    inputs = write_lines(workdir / "input", scenario.files())
    record = run_rounds(
        inputs, workdir=workdir,
        process=LocalRound(db, orders_registry, settings),
        drain=DispatcherDrain(aggregates="aggbox.examples.orders", settings=settings),
        pending=lambda: pending_outbox(db, orders_registry),
        redeliver_rate=0.2, rng=random.Random(3), max_rounds=max_rounds or 6,
    )
    return LocalRun(scenario, expect(scenario.lines, orders_registry, generations=max_rounds),
                    record, read_store(db, orders_registry, settings), orders_registry, db,
                    settings)


@pytest.fixture(scope="module")
def local_run(mongo_client: MongoClient[dict[str, Any]], mongo_uri: str,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRun]:
    run = run_locally(mongo_client, mongo_uri, tmp_path_factory.mktemp("demo-local"),
                      ScenarioSpec(customers=8, orders=40, seed=11))
    yield run
    mongo_client.drop_database(run.db.name)
