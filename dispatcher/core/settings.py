"""Dispatcher settings: section ``[dispatcher]`` of the config file, environment
``AGGBOX_DISPATCHER_<NAME>`` (lists and tables as JSON, e.g.
``AGGBOX_DISPATCHER_COLLECTIONS='["orders","customers"]'``).

Store settings (URI, database, dead-letter collection) come from ``[aggbox]``
(:class:`aggregates.core.settings.AggboxSettings`)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from aggregates.core.errors import ConfigurationError
from aggregates.core.settings import SectionSettings

__all__ = ["DispatcherSettings", "Mode", "PublisherKind", "RecordFormat"]

PublisherKind = Literal["kafka", "jsonl", "stdout"]
RecordFormat = Literal["aggbox", "cloudevents"]
Mode = Literal["auto", "stream", "poll"]


class DispatcherSettings(SectionSettings):
    """Settings of ``aggbox dispatch`` (section ``[dispatcher]``)."""

    model_config = SettingsConfigDict(env_prefix="AGGBOX_DISPATCHER_", extra="forbid")
    section: ClassVar[str] = "dispatcher"

    collections: list[str] = Field(
        default_factory=list,
        description="Aggregate collections to dispatch. Empty: the collections of the "
        "aggregate types in `aggregates`.",
    )
    aggregates: str | None = Field(
        None,
        description="Python module defining the aggregate types (e.g. aggbox.examples.orders); "
        "used for the collection list when `collections` is empty.",
    )
    publisher: PublisherKind = Field(
        "jsonl",
        description="Where entries go: kafka, jsonl (files in `jsonl_dir`, the format the "
        "Spark pipeline reads) or stdout (debugging).",
    )
    record_format: RecordFormat = Field(
        "aggbox",
        description="What a published record looks like: aggbox (the envelope as JSON, ids "
        "also as Kafka headers) or cloudevents (CloudEvents 1.0: binary content mode on "
        "Kafka — ce_* headers, the payload as the value — and structured mode, one event "
        "object per line, in JSON Lines files). The pipeline reads both; docs/design.md "
        "\"CloudEvents\".",
    )
    topic_template: str = Field(
        "{aggregate_type}.events",
        description="Topic of an entry that names none. Placeholders: {aggregate_type} "
        "(emitting aggregate type; for a fired timer the aggregate that scheduled it, never "
        "`aggbox.timer`), {target_type} (addressed aggregate type, else the "
        "emitting one), {type} (message type), {collection}.",
    )
    kafka_bootstrap_servers: str = Field(
        "127.0.0.1:9092", description="Kafka bootstrap servers (publisher kafka)."
    )
    kafka_config: dict[str, str] = Field(
        default_factory=dict,
        description="Extra librdkafka producer settings (e.g. security). Idempotence and "
        "acks=all are always on.",
    )
    kafka_delivery_timeout_s: float = Field(
        60.0, gt=0,
        description="How long the producer retries one record (librdkafka "
        "message.timeout.ms) before the batch counts as failed and is retried after backoff.",
    )
    jsonl_dir: str = Field(
        "aggbox-dispatch",
        description="Directory of JSON Lines files (publisher jsonl); one file per batch, "
        "written atomically (as a hidden .tmp-*.jsonl, then renamed). Temp files a killed "
        "writer left behind (older than a minute) are removed at start-up.",
    )
    mode: Mode = Field(
        "auto",
        description="stream (change streams), poll (periodic queries, for servers without "
        "change streams) or auto (stream when the server supports it).",
    )
    batch_size: int = Field(
        500, ge=1, description="Change events per getMore and documents per sweep page."
    )
    max_batch_records: int = Field(
        5000, ge=1, description="Outbox entries handed to the publisher in one call at most."
    )
    pacing_ms: float = Field(
        25.0, gt=0,
        description="Pause after an empty change-stream read (the stream is read with "
        "try_next; servers that answer at once must not make it spin).",
    )
    poll_interval_ms: float = Field(
        200.0, gt=0, description="Pause between queries in polling mode when idle."
    )
    sweep_interval_s: float = Field(
        60.0, gt=0,
        description="Safety sweep for pending entries every so often, in both modes.",
    )
    lease_ttl_s: float = Field(
        10.0, gt=0,
        description="Partition lease lifetime. The partitions of an instance that dies (kill "
        "-9) are taken over at most lease_ttl_s + a renewal period + takeover_grace_s later; "
        "an instance that cannot renew within it stops publishing them.",
    )
    lease_renew_s: float | None = Field(
        None, gt=0,
        description="Period of the lease rounds: heartbeat, renewal, balancing (default: a "
        "third of lease_ttl_s)."
    )
    instance_id: str | None = Field(
        None, description="Name of this dispatcher in its heartbeat and leases (default: "
        "host-pid-random); must be unique among running instances."
    )
    checkpoint_collection: str = Field(
        "aggbox_dispatcher_checkpoints",
        description="Collection of resume tokens (one document per watched collection).",
    )
    partition_collection: str = Field(
        "aggbox_dispatcher_partitions",
        description="Collection of partition leases (one document per watched collection "
        "and partition; docs/design.md \"Scale-out\").",
    )
    member_collection: str = Field(
        "aggbox_dispatcher_members",
        description="Collection of instance heartbeats (one document per running instance "
        "and watched collection).",
    )
    takeover_grace_s: float = Field(
        2.0, ge=0,
        description="A partition taken over after its previous holder's lease expired (a "
        "crash, a pause) is published only this long after the claim: time for records the "
        "previous holder had already handed to its producer to settle.",
    )
    effects: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Built-in effects by emitted message type (tables "
        "[dispatcher.effects.<Type>] with kind = \"http\" or \"smtp\"): entries of that type "
        "are executed, not published (docs/side-effects.md). Effects written in Python are "
        "found in the `aggregates` module (an `Effects` instance).",
    )
    effect_collection: str = Field(
        "aggbox_effects",
        description="Collection of effect attempt records (one document per effect entry).",
    )
    effect_concurrency: int = Field(
        16, ge=1, le=1024,
        description="Aggregates whose effect entries are executed at the same time, at most "
        "(per instance; each aggregate's entries run one after the other).",
    )
    backoff_initial_ms: float = Field(
        200.0, gt=0, description="First pause after a broker or store failure."
    )
    backoff_max_ms: float = Field(
        30_000.0, gt=0, description="Backoff ceiling (exponential, with full jitter)."
    )
    shutdown_timeout_s: float = Field(
        30.0, ge=0,
        description="On SIGTERM/SIGINT, how long in-flight publishes may take to finish.",
    )
    metrics_port: int = Field(
        9464, ge=0, le=65535,
        description="HTTP port for /metrics (Prometheus) and /healthz; 0 turns it off.",
    )
    metrics_host: str = Field("127.0.0.1", description="Address the metrics server binds.")
    metrics_interval_s: float = Field(
        5.0, gt=0, description="How often backlog and oldest-pending age are measured."
    )
    unhealthy_after_s: float = Field(
        30.0, gt=0,
        description="/healthz answers 503 once a collection worker has had no successful "
        "MongoDB round trip (lease check, stream read, sweep, measurement) for this long. "
        "The dispatcher's own client also gives up selecting a server after "
        "min(lease_ttl_s, unhealthy_after_s / 2) unless the URI sets serverSelectionTimeoutMS.",
    )
    once_timeout_s: float = Field(
        120.0, gt=0,
        description="With --once: give up (exit status 1, one error line) when a collection "
        "has made no progress for this long — no MongoDB answer while waiting for the lease, "
        "no entry published and no sweep completed while active (MongoDB or the broker "
        "unreachable).",
    )
    done_cache_size: int = Field(
        100_000, ge=1000,
        description="Ids of recently published entries remembered to skip stale views.",
    )
    log_json: bool = Field(False, description="Structured JSON logs on stderr.")

    @model_validator(mode="after")
    def _check(self) -> DispatcherSettings:
        if self.backoff_max_ms < self.backoff_initial_ms:
            raise ConfigurationError(
                f"backoff_max_ms ({self.backoff_max_ms}) is below backoff_initial_ms "
                f"({self.backoff_initial_ms}); raise backoff_max_ms"
            )
        if self.lease_renew_s is not None and self.lease_renew_s >= self.lease_ttl_s:
            raise ConfigurationError(
                f"lease_renew_s ({self.lease_renew_s}) must be below lease_ttl_s "
                f"({self.lease_ttl_s}) or the lease expires between renewals"
            )
        return self

    @property
    def renew_interval_s(self) -> float:
        return self.lease_renew_s if self.lease_renew_s is not None else self.lease_ttl_s / 3
