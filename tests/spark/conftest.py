"""Fixtures of the Spark pipeline tests: a pipeline factory bound to the test's fresh database
(the session-wide ``spark_session`` lives in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from aggregates.core.settings import AggboxSettings
from spark.pipeline import Pipeline
from spark.settings import SparkSettings

REPO = Path(__file__).resolve().parents[2]
AGGREGATES = "tests.spark.domain"

pytest.register_assert_rewrite("tests.spark.helpers")


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


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Spark Connect server from the installed PySpark on loopback, with Spark's Kafka
    source (the jars the ``aggbox`` command resolves); yields ``sc://127.0.0.1:<port>``.
    Its Python processes have aggbox (installed) but not the repository: a test ships its
    aggregates module with ``--py-files`` (``tests.spark.domain``: :func:`domain_zip`)."""
    from aggbox.session import kafka_jars
    from tests.spark.servers import connect_server as start

    with start(tmp_path_factory.mktemp("connect"), jars=kafka_jars()) as url:
        yield url


@pytest.fixture(scope="session")
def domain_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tests.spark.domain`` (with its packages' ``__init__.py``) as a zip for
    ``--py-files``: the suite's Connect server cannot import it otherwise."""
    import zipfile

    path = tmp_path_factory.mktemp("domain-zip") / "tests-spark-domain.zip"
    with zipfile.ZipFile(path, "w") as z:
        for name in ("tests/__init__.py", "tests/spark/__init__.py", "tests/spark/domain.py"):
            z.write(REPO / name, name)
    return path
