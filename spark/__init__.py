"""aggbox's Spark pipeline: message files or streams → validated, routed, grouped by
aggregate → the store writer in the executors → one outcome per message.

    from spark import Pipeline, build_session

    spark = build_session()                       # local[2, 4], speculation off
    pipeline = Pipeline(spark, aggregates="myteam.aggregates",
                        mongodb_uri="mongodb://db1.example:27017/?replicaSet=rs0")
    result = pipeline.run_batch(["in/*.jsonl"])

Modules: :mod:`spark.schema` (envelope and outcome schemas), :mod:`spark.sources`
(readers), :mod:`spark.validate` (reason codes in Spark SQL), :mod:`spark.executor` (the
``mapInArrow`` writer), :mod:`spark.pipeline` (batch and streaming), :mod:`spark.session`,
:mod:`spark.settings`; the commands ``aggbox run`` / ``aggbox stream`` live in the
command-line layer (``aggbox.commands.run``). See
``spark/README.md`` for operations (checkpoints, ``--py-files``, why speculation stays off).

Names are imported lazily so that ``import spark`` does not import pyspark.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "DirectorySource",
    "KafkaSource",
    "Pipeline",
    "RunResult",
    "SparkSettings",
    "StreamResult",
    "build_session",
]

_WHERE = {
    "DirectorySource": "spark.sources",
    "KafkaSource": "spark.sources",
    "Pipeline": "spark.pipeline",
    "RunResult": "spark.pipeline",
    "StreamResult": "spark.pipeline",
    "SparkSettings": "spark.settings",
    "build_session": "spark.session",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'spark' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
