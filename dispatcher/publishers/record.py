"""Outbox entry → published record (pure).

The record's value is the input envelope (:class:`aggregates.message.envelope.Message` as JSON), so
whatever consumes the broker topic or the JSON Lines directory — another aggbox pipeline in
particular — reads it with ``Message.from_dict``:

- ``message_id`` = entry id, ``type``, ``payload``;
- ``aggregate_type``/``aggregate_id`` = the entry's ``target`` when it is addressed to
  another aggregate, else the emitting aggregate;
- ``occurred_at`` = ``created_at``; ``source``, ``causation_id``, ``correlation_id``,
  ``headers`` and ``schema_version`` (``Emit(..., schema_version=N)``) as stored.

Two kinds of record, told apart by the header ``aggbox-kind`` (:data:`H_KIND`):

- ``input`` — the entry was addressed (``Emit(..., to=(type, id))``): the envelope is input
  for the aggregate it names; feed it to a pipeline that has that aggregate type.
- ``event`` — the entry was not addressed: the envelope names the *emitting* aggregate
  (so it stays a valid envelope, keyed and ordered like the rest) but it is a fact that
  aggregate published, not input for it. The envelope's own ``headers`` carry
  ``aggbox-kind: event`` as well, so a JSON Lines reader sees it too. Consumers that feed
  records back into aggbox must skip (or route elsewhere) records with ``aggbox-kind:
  event``; aggbox's own writer (pipeline, harness) reports such a record as ``duplicate``
  with reason ``aggbox_event`` and never hands it to a handler.

Broker headers carry the ids without parsing the value: :data:`HEADER_NAMES`.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from aggregates.message.envelope import KIND_EVENT, KIND_HEADER, KIND_INPUT, Message
from aggregates.wire.fence import FENCE_HEADER

# The envelope of an entry is built by aggregates.wire.outbound (shared with the in-memory
# scenarios of aggregates.testing); its helpers are re-exported for the tests that use them.
from aggregates.wire.outbound import (  # noqa: F401
    InvalidEntry,
    _fast_envelope,
    _slow_envelope,
    entry_envelope,
)

__all__ = [
    "HEADER_NAMES",
    "H_KIND",
    "KIND_EVENT",
    "KIND_INPUT",
    "InvalidEntry",
    "OutboundRecord",
    "check_template",
    "envelope_json",
    "reference_record",
    "render_topic",
]

H_MESSAGE_ID: Final = "message_id"
H_TYPE: Final = "type"
H_CAUSATION_ID: Final = "causation_id"
H_CORRELATION_ID: Final = "correlation_id"
H_SOURCE_TYPE: Final = "source_type"
H_SOURCE_ID: Final = "source_id"
H_SOURCE_SEQ: Final = "source_seq"
H_AGGREGATE_TYPE: Final = "aggregate_type"
H_AGGREGATE_ID: Final = "aggregate_id"
#: ``input`` (addressed to the aggregate the envelope names) or ``event`` (not addressed:
#: the emitting aggregate's event, not input for it); also in an event's envelope headers.
H_KIND: Final = KIND_HEADER
#: ``<database>.<collection>/<partition>:<epoch>`` of the lease under which the record was
#: published (set by the dispatcher, not by :func:`build_record`; read it with
#: :func:`aggregates.wire.fence.parse_fence`). Epochs count per (database, collection,
#: partition); what a consumer may conclude from them: docs/design.md "Fencing".
H_FENCE: Final = FENCE_HEADER

#: Headers set on every record (the entry's own headers are added unless they clash).
HEADER_NAMES: Final = (
    H_MESSAGE_ID, H_TYPE, H_CAUSATION_ID, H_CORRELATION_ID, H_SOURCE_TYPE, H_SOURCE_ID,
    H_SOURCE_SEQ, H_AGGREGATE_TYPE, H_AGGREGATE_ID, H_KIND,
)

_PLACEHOLDER = re.compile(r"{([^{}]*)}")
_TEMPLATE_FIELDS: Final = frozenset({"aggregate_type", "target_type", "type", "collection"})


@dataclass(frozen=True, slots=True)
class OutboundRecord:
    """One outbox entry ready for a publisher.

    ``collection``/``document_id`` locate the entry in MongoDB (the emitting aggregate);
    ``envelope`` is the input envelope (``Message.to_dict()`` form) and ``value`` its JSON;
    ``headers`` are :data:`HEADER_NAMES` plus the entry's own."""

    message_id: str
    collection: str
    document_id: Any
    source_type: str
    topic: str
    key: str
    value: bytes
    headers: dict[str, str]
    envelope: dict[str, Any]
    created_at: datetime | None = None
    entry: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def message(self) -> Message:
        """The envelope as a validated :class:`Message` (built on demand)."""
        return Message.from_dict(self.envelope, max_payload_bytes=0)


def check_template(template: str) -> None:
    """Raise :class:`aggregates.core.errors.ConfigurationError` for an unknown placeholder."""
    from aggregates.core.errors import ConfigurationError

    for name in _PLACEHOLDER.findall(template):
        if name not in _TEMPLATE_FIELDS:
            raise ConfigurationError(
                f"topic_template {template!r}: unknown placeholder {{{name}}}; use "
                f"{', '.join('{' + f + '}' for f in sorted(_TEMPLATE_FIELDS))}"
            )


@functools.lru_cache(maxsize=4096)  # few distinct topics; called once per entry
def render_topic(template: str, *, aggregate_type: str, target_type: str, type: str,
                 collection: str) -> str:
    values = {"aggregate_type": aggregate_type, "target_type": target_type, "type": type,
              "collection": collection}
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


def envelope_json(envelope: Mapping[str, Any]) -> bytes:
    """An envelope as compact UTF-8 JSON (one line); ``ValueError`` for a float NaN or
    infinity, ``TypeError`` for a value that is not JSON."""
    return _ENCODER.encode(envelope).encode()


# One encoder for every record (json.dumps with options builds a new one per call). No
# ``default``: an envelope holds JSON values only — its payload in its JSON form
# (aggregates/wire/outbound.py applies aggregates.core.jsonvalue's rule; a value the rule
# refuses makes the entry invalid_outbox_entry naming the field) — so there is nothing to
# convert here, and no second, silent conversion rule. NaN, infinities (ValueError) and
# other types (TypeError) raise: the last guard, for whatever else is encoded here (a
# publisher dead-letters the one record it cannot encode: formats.encode_failure).
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def reference_record(entry: Mapping[str, Any], *, collection: str, document_id: Any,
                     source_type: str, topic_template: str) -> OutboundRecord:
    """The record of one entry the long way (any entry; the definition): the envelope of
    :func:`aggregates.wire.outbound.entry_envelope`, then headers, key, topic and JSON. What
    :class:`~dispatcher.publishers.builder.RecordBuilder` returns when its fast path does not
    apply (and must equal when it does)."""
    entry_id, env, addressed, emitter_type, emitter_id = entry_envelope(
        entry, document_id=document_id, source_type=source_type)
    agg_type, agg_id = str(env["aggregate_type"]), str(env["aggregate_id"])
    etype: str = env["type"]
    topic = entry.get("topic") or render_topic(
        topic_template, aggregate_type=emitter_type, target_type=agg_type, type=etype,
        collection=collection)
    headers: dict[str, str] = dict(env.get("headers") or {})
    headers[H_MESSAGE_ID] = entry_id
    headers[H_TYPE] = etype
    headers[H_AGGREGATE_TYPE] = agg_type
    headers[H_AGGREGATE_ID] = agg_id
    headers[H_KIND] = KIND_INPUT if addressed else KIND_EVENT
    if "causation_id" in env:
        headers[H_CAUSATION_ID] = env["causation_id"]
    if "correlation_id" in env:
        headers[H_CORRELATION_ID] = env["correlation_id"]
    esrc = env.get("source")
    if esrc is not None:
        headers[H_SOURCE_TYPE] = esrc["type"]
        headers[H_SOURCE_ID] = esrc["id"]
        headers[H_SOURCE_SEQ] = str(esrc["seq"])
    key = entry.get("key")
    created = entry.get("created_at")
    return OutboundRecord(
        message_id=entry_id,
        collection=collection,
        document_id=document_id,
        source_type=emitter_type,
        topic=str(topic),
        key=str(key) if key not in (None, "") else emitter_id,
        value=envelope_json(env),
        headers=headers,
        envelope=env,
        created_at=(created if created.tzinfo else created.replace(tzinfo=UTC))
        if isinstance(created, datetime) else None,
        entry=entry,
    )
