"""Readers: every input becomes rows of raw record text ``_raw`` and its position.

Position columns, the last tie-breaker when an aggregate's messages are ordered
(docs/design.md "Order"):

- files: ``_src`` = file path, ``_o1`` = byte offset of the split (JSON Lines) or row index
  (Parquet), ``_o2`` = line order within the split — i.e. files in path order, records in
  file order;
- Kafka: ``_src`` = topic, ``_o1`` = partition, ``_o2`` = offset.

Blank lines in JSON Lines files are not records (Spark's JSON reader skips them too); every
other line is one record, valid or not, whatever its bytes. A byte-order mark (U+FEFF) at the
start of any line (or Kafka record) is dropped: Hadoop's reader drops one at the start of a
file, so the same rule holds for concatenated files. A line holding only a BOM is blank.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aggregates.errors import ConfigurationError
from spark.settings import InputFormat

__all__ = [
    "DirectorySource",
    "KafkaSource",
    "StreamSource",
    "add_line_order",
    "detect_format",
    "read_batch",
    "read_stream",
]


def detect_format(path: str) -> str:
    """``parquet`` for ``*.parquet`` paths/globs and directories holding Parquet files,
    ``json`` (JSON Lines) otherwise."""
    p = path.rstrip("/")
    if p.endswith(".parquet") or p.endswith(".parq"):
        return "parquet"
    local = p[7:] if p.startswith("file://") else p
    if ("://" not in local and os.path.isdir(local)
            and (glob.glob(os.path.join(local, "*.parquet"))
                 or glob.glob(os.path.join(local, "*", "*.parquet")))):
        return "parquet"
    return "json"


def _without_bom(col: str) -> Any:
    """``col`` without a leading byte-order mark (U+FEFF)."""
    from pyspark.sql import functions as F

    c = F.col(col)
    return F.when(c.startswith("\ufeff"), F.expr(f"substr({col}, 2)")).otherwise(c)


def _json_lines(spark: Any, paths: Sequence[str]) -> Any:
    from pyspark.sql import functions as F

    df = spark.read.text(list(paths))
    return (
        df.where(F.trim(_without_bom("value")) != "")
        .select(
            _without_bom("value").alias("_raw"),
            F.col("_metadata.file_path").alias("_src"),
            F.col("_metadata.file_block_start").alias("_o1"),
            F.monotonically_increasing_id().alias("_o2"),
        )
    )


def _parquet(spark: Any, paths: Sequence[str]) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    df = spark.read.parquet(*paths)
    cols = []
    for f in df.schema.fields:
        col = F.col(f"`{f.name}`")
        if f.name == "payload" and isinstance(f.dataType, StringType):
            # Payload stored as JSON text (aggbox's own envelope schema): embed it as JSON.
            col = F.expr("try_parse_json(payload)")
        cols.append(col.alias(f.name))
    return df.select(
        F.to_json(F.struct(*cols)).alias("_raw"),
        F.col("_metadata.file_path").alias("_src"),
        F.col("_metadata.row_index").alias("_o1"),
        F.lit(0).cast("long").alias("_o2"),
    )


def read_batch(spark: Any, inputs: Sequence[str], *, input_format: InputFormat = "auto") -> Any:
    """Read files (paths, directories, globs) into ``_raw, _src, _o1, _o2``."""
    if not inputs:
        raise ConfigurationError("no input given; pass --input PATH (files, directories, globs)")
    groups: dict[str, list[str]] = {}
    for path in inputs:
        fmt = detect_format(path) if input_format == "auto" else input_format
        groups.setdefault(fmt, []).append(path)
    frames = [(_parquet if fmt == "parquet" else _json_lines)(spark, paths)
              for fmt, paths in sorted(groups.items())]
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out


@dataclass(frozen=True, slots=True)
class KafkaSource:
    """A Kafka topic (or comma-separated topics) read with Spark's Kafka source."""

    bootstrap_servers: str
    topic: str
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DirectorySource:
    """A directory that receives JSON Lines files (new files are picked up once each)."""

    path: str
    max_files_per_trigger: int | None = None
    options: Mapping[str, str] = field(default_factory=dict)


StreamSource = KafkaSource | DirectorySource


def read_stream(spark: Any, source: StreamSource) -> Any:
    """A streaming DataFrame of ``_raw, _src, _o1`` (plus ``_o2`` for Kafka); for a
    directory :func:`add_line_order` adds ``_o2`` inside each micro-batch."""
    from pyspark.sql import functions as F

    if isinstance(source, KafkaSource):
        reader = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", source.bootstrap_servers)
            .option("subscribe", source.topic)
            .option("startingOffsets", source.starting_offsets)
        )
        if source.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(source.max_offsets_per_trigger))
        for k, v in source.options.items():
            reader = reader.option(k, v)
        return reader.load().withColumn("value", F.col("value").cast("string")).select(
            _without_bom("value").alias("_raw"),
            F.col("topic").alias("_src"),
            F.col("partition").cast("long").alias("_o1"),
            F.col("offset").alias("_o2"),
        )
    reader = spark.readStream.format("text")
    if source.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", str(source.max_files_per_trigger))
    for k, v in source.options.items():
        reader = reader.option(k, v)
    df = reader.load(source.path)
    return df.where(F.trim(_without_bom("value")) != "").select(
        _without_bom("value").alias("_raw"),
        F.col("_metadata.file_path").alias("_src"),
        F.col("_metadata.file_block_start").alias("_o1"),
    )


def add_line_order(df: Any) -> Any:
    """Add ``_o2`` (record order within a file split) to a micro-batch that lacks it."""
    from pyspark.sql import functions as F

    if "_o2" in df.columns:
        return df
    return df.withColumn("_o2", F.monotonically_increasing_id())
