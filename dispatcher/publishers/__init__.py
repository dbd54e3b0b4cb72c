"""Publishers: where outbox entries go, and what goes — the outbound record (entry →
envelope, key, headers, topic: :mod:`~dispatcher.publishers.record`), its formats per
destination (:mod:`~dispatcher.publishers.formats`) and the publishers (Kafka, JSON Lines,
stdout). See :mod:`dispatcher.publishers.base` for the interface (and how to add one).
Imports only ``core``."""

from __future__ import annotations

from dispatcher.core.settings import DispatcherSettings
from dispatcher.publishers.base import Publisher, PublisherError, PublishResult, PublishStatus

__all__ = [
    "PublishResult",
    "PublishStatus",
    "Publisher",
    "PublisherError",
    "create_publisher",
]


def create_publisher(settings: DispatcherSettings) -> Publisher:
    """The publisher named by ``settings.publisher`` (not started yet)."""
    if settings.publisher == "kafka":
        from dispatcher.publishers.kafka import KafkaPublisher

        return KafkaPublisher(settings.kafka_bootstrap_servers, config=settings.kafka_config,
                              delivery_timeout_s=settings.kafka_delivery_timeout_s,
                              record_format=settings.record_format)
    if settings.publisher == "jsonl":
        from dispatcher.publishers.jsonl import JsonLinesPublisher

        return JsonLinesPublisher(settings.jsonl_dir, record_format=settings.record_format)
    if settings.publisher == "stdout":
        from dispatcher.publishers.stdout import StdoutPublisher

        return StdoutPublisher(record_format=settings.record_format)
    raise PublisherError(  # unreachable through settings validation
        f"unknown publisher {settings.publisher!r}; use kafka, jsonl or stdout"
    )
