"""Fixtures of the Spark pipeline tests: ONE SparkSession (``local[2, 4]``: two cores, failed
tasks retried) for the whole test session — it takes ~10 s to start — with Spark's Kafka
source on the classpath, and a pipeline factory bound to the test's fresh database."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from aggregates.settings import AggboxSettings
from spark.pipeline import Pipeline
from spark.settings import SparkSettings

REPO = Path(__file__).resolve().parents[2]
AGGREGATES = "tests.spark.domain"

pytest.register_assert_rewrite("tests.spark.helpers")


@pytest.fixture(scope="session")
def spark_session() -> Iterator[Any]:
    from spark.session import build_session

    # Executors import the test aggregates module (tests.spark.domain): Python workers get
    # PYTHONPATH from the JVM's environment, so set it before the JVM starts.
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    settings = SparkSettings.load(
        master="local[2]",
        shuffle_partitions=3,
        arrow_batch_rows=128,  # small Arrow batches: aggregates span batches (carry-over)
        conf={"spark.ui.enabled": "false", "spark.sql.adaptive.enabled": "false",
              "spark.scheduler.mode": "FAIR"},
    )
    session = build_session(settings, kafka=True)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


PipelineFactory = Callable[..., Pipeline]


@pytest.fixture
def pipeline(spark_session: Any, db: Any, mongo_uri: str) -> PipelineFactory:
    """``pipeline(**aggbox_settings)`` → a Pipeline on the test's database."""

    def make(*, carry_over_max: int = 5_000, **overrides: Any) -> Pipeline:
        settings = AggboxSettings.load(mongodb_uri=mongo_uri, database=db.name, **overrides)
        spark_settings = SparkSettings.load(shuffle_partitions=3, carry_over_max=carry_over_max)
        return Pipeline(spark_session, aggregates=AGGREGATES, settings=settings,
                        spark_settings=spark_settings, mongodb_uri=mongo_uri)

    return make
