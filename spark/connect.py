"""Which kind of Spark session a pipeline was given: classic (a ``SparkContext``, RDDs,
accumulators) or Spark Connect (none of those). The bottom floor of ``spark``, so that
:mod:`spark.pyfiles` and :mod:`spark.session` (which re-exports :func:`is_connect`) both
import it without importing each other."""

from __future__ import annotations

from typing import Any

__all__ = ["is_connect"]


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (no ``sparkContext``, no RDDs)."""
    module = type(spark).__module__
    if not module.startswith("pyspark.sql.connect"):
        return False
    try:
        from pyspark.sql.connect.session import SparkSession as ConnectSession
    except ImportError:  # pragma: no cover - the connect client's dependencies are missing
        return False
    return isinstance(spark, ConnectSession)
