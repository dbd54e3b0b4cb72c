"""Spark schemas: the message envelope (derived from
:data:`aggregates.message.envelope.ENVELOPE_FIELDS`, declared once there) and the per-message
outcome rows the pipeline returns.

The payload travels as a JSON string column (``payload``): aggregate types have different
payload shapes, and a string keeps one schema for all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import attrgetter
from typing import Final

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from aggregates.message.envelope import ENVELOPE_FIELDS
from aggregates.message.outcomes import Outcome

__all__ = [
    "ENVELOPE_FIELDS",
    "OUTCOME_COLUMNS",
    "OUTCOME_SCHEMA",
    "SOURCE_SCHEMA",
    "envelope_schema",
    "outcome_columns",
    "outcome_row",
    "spark_type",
]

#: ``source`` of an envelope: the emitting aggregate and its position in that stream.
SOURCE_SCHEMA: Final = StructType(
    [
        StructField("type", StringType(), False),
        StructField("id", StringType(), False),
        StructField("seq", LongType(), False),
    ]
)

_TYPES: Final[dict[str, DataType]] = {
    "string": StringType(),
    "object": StringType(),  # JSON text: one column for every payload shape
    "timestamp": TimestampType(),
    "int": IntegerType(),
    "source": SOURCE_SCHEMA,
    "map<string,string>": MapType(StringType(), StringType(), False),
}


def spark_type(type_name: str) -> DataType:
    """The Spark type of an ``ENVELOPE_FIELDS`` type name."""
    try:
        return _TYPES[type_name]
    except KeyError:
        raise ValueError(
            f"envelope type {type_name!r} has no Spark mapping; add it to spark.schema._TYPES"
        ) from None


def envelope_schema() -> StructType:
    """The envelope as a Spark schema (``payload`` as JSON text), in ``ENVELOPE_FIELDS`` order.

    Use it to read typed envelopes (e.g. Parquet written by aggbox, a notebook view of
    valid input); the pipeline itself validates raw JSON so bad rows become dead letters.
    """
    return StructType(
        [
            StructField(name, spark_type(type_name), not required)
            for name, (type_name, required) in ENVELOPE_FIELDS.items()
        ]
    )


#: One row per message (and per parked message released in this run): the audit log.
OUTCOME_SCHEMA: Final = StructType(
    [
        StructField("message_id", StringType(), False),
        StructField("aggregate_type", StringType(), True),
        StructField("aggregate_id", StringType(), True),
        StructField("outcome", StringType(), False),
        StructField("reason", StringType(), True),
        StructField("detail", StringType(), True),
        StructField("emitted_ids", ArrayType(StringType(), False), False),
        StructField("attempt", IntegerType(), False),
        StructField("from_parked", BooleanType(), False),
        StructField("task_attempt", IntegerType(), False),
        # The message's ``type`` (NULL: a dead letter whose record names no string type, or
        # a released parked message). Last, so that the columns before it keep positions.
        StructField("message_type", StringType(), True),
    ]
)

OUTCOME_COLUMNS: Final = tuple(f.name for f in OUTCOME_SCHEMA.fields)


def outcome_row(o: Outcome, *, task_attempt: int,
                message_type: str | None = None) -> tuple[object, ...]:
    """An :class:`Outcome` as a tuple in :data:`OUTCOME_SCHEMA` order."""
    return (o.message_id, o.aggregate_type or None, o.aggregate_id or None, o.outcome,
            o.reason, o.detail, list(o.emitted_ids), o.attempt, o.from_parked, task_attempt,
            message_type or None)


_COLUMN_GETTERS: Final = tuple(attrgetter(name) for name in (
    "message_id", "aggregate_type", "aggregate_id", "outcome", "reason", "detail",
    "emitted_ids", "attempt", "from_parked"))


def outcome_columns(outcomes: list[Outcome], *, task_attempt: int,
                    message_types: Mapping[str, str] | None = None) -> list[list[object]]:
    """Outcomes as columns in :data:`OUTCOME_SCHEMA` order: column ``i`` holds
    ``outcome_row(o)[i]`` of every outcome (``emitted_ids`` as tuples), built column by
    column rather than row by row and transposed. ``message_types`` maps message id →
    message type (:class:`Outcome` has no type; ids not in it get NULL)."""
    mid, atype, aid, kind, reason, detail, emitted, attempt, parked = _COLUMN_GETTERS
    return [
        list(map(mid, outcomes)),
        [v or None for v in map(atype, outcomes)],
        [v or None for v in map(aid, outcomes)],
        list(map(kind, outcomes)),
        list(map(reason, outcomes)),
        list(map(detail, outcomes)),
        list(map(emitted, outcomes)),  # tuples: Arrow reads them as lists
        list(map(attempt, outcomes)),
        list(map(parked, outcomes)),
        [task_attempt] * len(outcomes),
        ([message_types.get(m) or None for m in map(mid, outcomes)] if message_types
         else [None] * len(outcomes)),
    ]
