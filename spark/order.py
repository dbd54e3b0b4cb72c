"""Order within an aggregate, in Spark: :func:`order_within_aggregates` computes
:func:`aggregates.fold.ordering.delivery_order` over validated rows (tests/spark/test_spark_order.py
holds it to that specification)."""

from __future__ import annotations

from typing import Any

__all__ = ["order_within_aggregates"]


def order_within_aggregates(checked: Any, partitions: int) -> Any:
    """Validated rows (:data:`spark.validate.VALIDATED_COLUMNS`) plus the aggregate key
    ``_pa``, ``_pb``, hash-partitioned by it into ``partitions`` and sorted within each
    partition: an aggregate's rows are consecutive and in the order of
    :func:`aggregates.fold.ordering.delivery_order` (the specification; tested against it).

    A row is *sourced* when it passed validation and has ``source`` type, id and seq; its
    effective time is the newest ``occurred_at`` of its source up to it, by (seq, input
    position) — a running max over a window partitioned by aggregate and source. The window
    runs after the repartition: its partitioning contains the shuffle key, so Spark adds no
    second exchange. Other rows (unsourced, or flagged invalid: they only need to reach the
    executor) use their own ``occurred_at``. Times compare at millisecond precision, as
    :meth:`aggregates.message.envelope.Message.from_dict` keeps them."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keyed = checked.withColumn("_pa", F.coalesce(F.col("_atype"), F.lit(""))).withColumn(
        "_pb",
        F.when(F.col("_aid").isNotNull(), F.col("_aid")).otherwise(
            F.concat(F.lit("raw:"), F.xxhash64(F.col("_raw")).cast("string"))
        ),
    )
    parts = keyed.repartition(partitions, "_pa", "_pb")
    position = [F.col("_src"), F.col("_o1"), F.col("_o2")]
    own = F.date_trunc("millisecond", F.col("_ts"))
    sourced = (F.col("_reason").isNull() & F.col("_stype").isNotNull()
               & F.col("_sid").isNotNull() & F.col("_seq").isNotNull())
    by_source = (Window.partitionBy("_pa", "_pb", "_stype", "_sid")
                 .orderBy(F.col("_seq"), *position)
                 .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    newest = F.max(F.when(sourced, own)).over(by_source)
    keys = parts.select(
        "*",
        own.alias("_k_own"),
        (~sourced).alias("_k_unsourced"),
        F.when(sourced, newest).otherwise(own).alias("_k_eff"),
    )
    ordered = keys.sortWithinPartitions(
        F.col("_pa"), F.col("_pb"), F.col("_k_eff").asc_nulls_first(),
        F.col("_k_unsourced"), F.col("_stype"), F.col("_sid"), F.col("_seq"),
        F.col("_k_own").asc_nulls_first(), *position,
    )
    return ordered.drop("_k_own", "_k_unsourced", "_k_eff")
