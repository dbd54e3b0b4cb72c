"""The SparkSession aggbox creates when it runs the pipeline itself.

Under ``spark-submit`` (or in a notebook) pass your own session to the pipeline functions;
:func:`check_session` tells what it needs. What is set here and why:

- ``spark.speculation=false`` — a speculative copy of a writer task writes the same
  aggregates concurrently with the original: the two attempts collide on every aggregate
  (version conflicts, doubled load on MongoDB, hot aggregates may exhaust their conflict
  retries and get parked), and whichever attempt loses has its outcome rows discarded, so
  the audit log shows as ``duplicate`` what the other attempt applied. Retries after a
  *failure* are fine and stay on (``spark.task.maxFailures``).
- ``local[N]`` → ``local[N, F]``: plain ``local`` masters never retry a failed task.
- ``PYSPARK_PYTHON`` = this interpreter: executors need the same packages (pymongo,
  aggregates, your aggregates module).
- Spark's Kafka source ``org.apache.spark:spark-sql-kafka-0-10_2.13:<pyspark version>``
  through ``spark.jars.packages``, only when a Kafka stream is wanted (Ivy downloads it from
  Maven Central once into ``~/.ivy2.5.2``).
- ``spark.sql.session.timeZone=UTC``: ``occurred_at`` is compared and ordered in UTC.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from aggregates.errors import ConfigurationError
from spark.settings import SparkSettings

__all__ = ["build_session", "check_session", "kafka_package", "local_master"]

_LOCAL = re.compile(r"^local\[(\d+|\*)\]$")


def kafka_package(settings: SparkSettings | None = None) -> str:
    """The Maven coordinate of Spark's Kafka source matching the installed PySpark."""
    if settings is not None and settings.kafka_package:
        return settings.kafka_package
    import pyspark

    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"


def local_master(master: str, max_failures: int) -> str:
    """``local[N]`` → ``local[N, max_failures]`` (other masters unchanged)."""
    m = _LOCAL.match(master.replace(" ", ""))
    if m and max_failures > 1:
        return f"local[{m.group(1)}, {max_failures}]"
    return master


def build_session(
    settings: SparkSettings | None = None,
    *,
    kafka: bool = False,
    packages: Iterable[str] = (),
    conf: Mapping[str, str] | None = None,
    show_console_progress: bool = False,
) -> Any:
    """Create (or return the active) SparkSession configured for the pipeline.

    ``kafka=True`` adds Spark's Kafka source; ``packages`` adds other Maven coordinates;
    ``conf`` overrides everything else. Static settings (packages, master) only apply when
    no session is running yet in this process."""
    from pyspark.sql import SparkSession

    s = settings or SparkSettings.load()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    pkgs = list(packages)
    if kafka:
        pkgs.append(kafka_package(s))
    values: dict[str, str] = {
        "spark.app.name": s.app_name,
        "spark.speculation": "false",
        "spark.task.maxFailures": str(s.task_max_failures),
        "spark.sql.shuffle.partitions": str(s.shuffle_partitions),
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(s.arrow_batch_rows),
        "spark.sql.session.timeZone": "UTC",
        "spark.pyspark.python": os.environ["PYSPARK_PYTHON"],
        "spark.ui.showConsoleProgress": "true" if show_console_progress else "false",
    }
    if pkgs:
        values["spark.jars.packages"] = ",".join(dict.fromkeys(pkgs))
    values.update(s.conf)
    values.update(conf or {})
    builder = SparkSession.builder.master(local_master(s.master, s.task_max_failures))
    for key, value in values.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    for path in s.py_files:
        spark.sparkContext.addPyFile(path)
    return spark


def check_session(spark: Any) -> None:
    """Raise :class:`ConfigurationError` when the session would make the pipeline unsafe or
    misleading (see the module docstring)."""
    speculation = str(spark.sparkContext.getConf().get("spark.speculation", "false"))
    if speculation.strip().lower() == "true":
        raise ConfigurationError(
            "spark.speculation is on: speculative copies of writer tasks write the same "
            "aggregates concurrently (conflicts, doubled load) and their outcome rows are "
            "misleading. Set spark.speculation=false for the aggbox job."
        )
