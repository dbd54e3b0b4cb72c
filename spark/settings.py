"""Settings of the Spark pipeline: section ``[spark]`` of the config file, environment
``AGGBOX_SPARK_<NAME>`` (dict and list values as JSON), command-line options on top.

Store settings (MongoDB URI, database, chunk sizes, …) live in ``[aggbox]``
(:class:`aggregates.core.settings.AggboxSettings`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from aggregates.core.settings import SectionSettings

__all__ = ["InputFormat", "SparkSettings"]

InputFormat = Literal["auto", "json", "parquet"]


class SparkSettings(SectionSettings):
    """Pipeline settings (section ``[spark]``, environment ``AGGBOX_SPARK_<NAME>``)."""

    model_config = SettingsConfigDict(env_prefix="AGGBOX_SPARK_", extra="forbid")
    section: ClassVar[str] = "spark"

    master: str = Field(
        "local[2]",
        description="Spark master. `local[N]` becomes `local[N, task_max_failures]` so failed "
        "tasks are retried locally too. Ignored when a SparkSession already exists "
        "(spark-submit).",
    )
    remote: str | None = Field(
        None,
        description="Spark Connect server to run on (`sc://host:port`, as for "
        "`SparkSession.builder.remote`) instead of a Spark driver in this process; `master` "
        "is then ignored. Unset: `$SPARK_REMOTE` if set. Session-scoped `spark.sql.*` "
        "settings are set from here, the others are the server's.",
    )
    app_name: str = Field("aggbox", description="Spark application name.")
    aggregates: str | None = Field(
        None,
        description="Python module defining the aggregate types (a `registry` attribute or "
        "top-level AggregateType objects). It must be importable in the executors: install "
        "it in the cluster's Python or ship it with `py_files` / `--py-files`.",
    )
    py_files: list[str] = Field(
        default_factory=list,
        description="Files (.py, .zip, .whl/.egg) shipped to every executor with "
        "SparkContext.addPyFile (Spark Connect: addArtifacts), e.g. the zipped aggregates "
        "module.",
    )
    input_format: InputFormat = Field(
        "auto",
        description="Batch input format: json (JSON Lines), parquet, or auto (by file "
        "extension: .parquet → parquet, anything else → JSON Lines).",
    )
    shuffle_partitions: int = Field(
        4, ge=1,
        description="Partitions of the repartition by aggregate key (the writer tasks). "
        "Small for local runs; on a cluster about 2-3× the executor cores.",
    )
    arrow_batch_rows: int = Field(
        10_000, ge=1,
        description="Rows per Arrow batch handed to the executor-side writer "
        "(spark.sql.execution.arrow.maxRecordsPerBatch).",
    )
    carry_over_max: int = Field(
        5_000, ge=0,
        description="An aggregate's messages at the end of an Arrow batch are carried into "
        "the next batch (one write instead of two) up to this many; a longer run is written "
        "at once, so memory stays bounded for hot aggregates.",
    )
    task_max_failures: int = Field(
        4, ge=1,
        description="spark.task.maxFailures: attempts per task. Re-running a task is harmless "
        "(everything it already wrote is recognised as duplicate).",
    )
    outcomes_path: str | None = Field(
        None,
        description="Directory for the outcome audit log (Parquet). Batch runs write "
        "<path>/run_id=<id>, micro-batches <path>/batch_id=<n>. Unset: outcomes are kept "
        "in Spark (local checkpoint) for the run only.",
    )
    checkpoint_location: str | None = Field(
        None,
        description="Structured Streaming checkpoint directory (required for `aggbox stream`); "
        "it records the consumed offsets/files. Keep one per stream; deleting it replays the "
        "source (harmless: duplicates), sharing it between streams is an error.",
    )
    trigger: str = Field(
        "availableNow",
        description="Streaming trigger: `availableNow` (consume what is there, in several "
        "micro-batches, then stop) or a processing-time interval such as `10 seconds`.",
    )
    max_offsets_per_trigger: int | None = Field(
        None, ge=1, description="Kafka: most records per micro-batch (maxOffsetsPerTrigger).")
    max_files_per_trigger: int | None = Field(
        None, ge=1, description="Directory stream: most new files per micro-batch.")
    starting_offsets: str = Field(
        "earliest",
        description="Kafka: where a new checkpoint starts (earliest, latest or a JSON map); "
        "an existing checkpoint always resumes where it stopped.",
    )
    kafka_package: str | None = Field(
        None,
        description="Maven coordinate of Spark's Kafka source. Unset: "
        "org.apache.spark:spark-sql-kafka-0-10_2.13:<installed pyspark version>.",
    )
    kafka_token_provider_version: str | None = Field(
        None,
        description="Pin spark-token-provider-kafka-0-10 (a dependency of the Kafka source) to "
        "this version, for Maven mirrors that lack the exact one. Unset: the Kafka source's own "
        "version if Maven resolves it, else <major>.<minor>.0 (Maven Central has no 4.0.1); "
        "the `aggbox` command resolves the jars with Maven once, into its cache.",
    )
    conf: dict[str, str] = Field(
        default_factory=dict,
        description="Extra Spark configuration (key → value) applied when aggbox creates the "
        "session, e.g. {\"spark.executor.memory\" = \"4g\"}.",
    )

    @field_validator("py_files")
    @classmethod
    def _py_files_exist(cls, paths: list[str]) -> list[str]:
        """Local files must exist (URLs such as hdfs://, s3a:// or local: are not checked):
        a missing one fails later, deep in SparkContext.addPyFile."""
        for path in paths:
            if re.match(r"^[A-Za-z][\w+.-]+:", path):
                continue
            if not Path(path).expanduser().is_file():
                raise ValueError(f"{path!r} is not a file (in {Path.cwd()})")
        return paths
