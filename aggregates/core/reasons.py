"""Every reason code aggbox gives a message it did not simply apply: one ``StrEnum``.

A member's value is stored in dead letters, parked entries, outcomes and metric labels, so
values never change; a member is named like its value. :data:`REASON_DOCS` says for each one
what it means and what to do; ``docs/reasons.md`` is generated from it (``aggbox reasons
--write``) and a test keeps it in step.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final, NamedTuple

__all__ = ["REASON_DOCS", "Reason", "ReasonDoc"]


class Reason(StrEnum):
    """A reason code (see :data:`REASON_DOCS` and docs/reasons.md)."""

    # The handler and what it returns (aggregates.fold).
    HANDLER_ERROR = "handler_error"
    INVALID_STATE = "invalid_state"
    INVALID_EMIT = "invalid_emit"
    INVALID_TIMER = "invalid_timer"
    INVALID_PAYLOAD = "invalid_payload"
    INVALID_HANDLER_RESULT = "invalid_handler_result"
    UNKNOWN_SCHEMA_VERSION = "unknown_schema_version"
    UPCAST_FAILED = "upcast_failed"
    # Routing.
    UNKNOWN_MESSAGE_TYPE = "unknown_message_type"
    UNKNOWN_AGGREGATE_TYPE = "unknown_aggregate_type"
    # The input record (spark.validate, aggregates.message.envelope).
    INVALID_JSON = "invalid_json"
    INVALID_ENCODING = "invalid_encoding"
    INVALID_ENVELOPE = "invalid_envelope"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    PAYLOAD_TOO_DEEP = "payload_too_deep"
    INVALID_CLOUDEVENT = "invalid_cloudevent"
    # Dedup strategies (aggregates.dedup).
    DUPLICATE_WITH_DIFFERENT_PAYLOAD = "duplicate_with_different_payload"
    BEYOND_DEDUP_HORIZON = "beyond_dedup_horizon"
    MISSING_SOURCE = "missing_source"
    HIGH_WATER_MAP_FULL = "high_water_map_full"
    SEQUENCE_GAP = "sequence_gap"
    AGGBOX_EVENT = "aggbox_event"
    EARLIER_ATTEMPT = "earlier_attempt"
    # Outbox and document size (aggregates.fold).
    OUTBOX_FULL = "outbox_full"
    DOCUMENT_SIZE_BUDGET = "document_size_budget"
    EMITS_EXCEED_OUTBOX_LIMIT = "emits_exceed_outbox_limit"
    STATE_TOO_LARGE = "state_too_large"
    EMITS_EXCEED_DOCUMENT_BUDGET = "emits_exceed_document_budget"
    # The writer.
    AGGREGATE_BLOCKED = "aggregate_blocked"
    VERSION_CONFLICT_RETRIES_EXHAUSTED = "version_conflict_retries_exhausted"
    UNKNOWN_DOCUMENT_LAYOUT = "unknown_document_layout"
    # The dispatcher and its publishers.
    MESSAGE_TOO_LARGE = "message_too_large"
    INVALID_TOPIC = "invalid_topic"
    REJECTED_BY_BROKER = "rejected_by_broker"
    INVALID_OUTBOX_ENTRY = "invalid_outbox_entry"
    BROKER_UNAVAILABLE = "broker_unavailable"
    IO_ERROR = "io_error"
    # The effect runner (dispatcher.effects).
    EFFECT_REJECTED = "effect_rejected"
    EFFECT_RETRYABLE = "effect_retryable"
    EFFECT_TIMEOUT = "effect_timeout"
    EFFECT_ERROR = "effect_error"
    EFFECT_NOT_CONFIGURED = "effect_not_configured"
    EFFECT_ATTEMPTS_EXHAUSTED = "effect_attempts_exhausted"


class ReasonDoc(NamedTuple):
    """What a reason code means: the outcome it goes with, when it is given, what to do."""

    outcome: str
    when: str
    action: str


_DEAD = "dead-lettered"
_PARKED = "parked"
_DISPATCH_DEAD = "dead-lettered by the dispatcher"
_DISPATCH_RETRY = "retried by the dispatcher"
_EFFECT_DEAD = "effect failed: failure message to the aggregate, entry dead-lettered"
_EFFECT_RETRY = "effect retried by the runner"

#: One entry per :class:`Reason` member, in member order (a test checks it is complete).
REASON_DOCS: Final[Mapping[Reason, ReasonDoc]] = {
    Reason.HANDLER_ERROR: ReasonDoc(
        _DEAD, "a handler raised (not `RetryableError`, not `ImportError`: a handler or "
        "upcaster that cannot import a module fails the run instead and dead-letters nothing, "
        "docs/design.md \"Deployment errors\")",
        "Read the traceback (`aggbox deadletters show`). Fix the handler — or the data "
        "upstream — deploy, `aggbox deadletters replay`. With `on_handler_error=\"park\"` the "
        "aggregate is blocked: replay, then `aggbox parked release`. Raise `RetryableError` "
        "for transient failures instead: the batch is retried."),
    Reason.INVALID_STATE: ReasonDoc(
        _DEAD, "the handler's new state cannot be stored: a field name starting with `$` or "
        "containing `.`, or a value BSON cannot hold — an int outside 64 bits, a naive or "
        "sub-millisecond datetime, text that is not UTF-8, a type of its own (numpy values are "
        "stored by value; NaN and infinity are stored: docs/concepts.md \"What each value "
        "becomes\"); the detail names the field. Or the stored state cannot be loaded: it does "
        "not fit the state type, was written by a newer `state_version` (`_sv`), or a state "
        "migration is missing or raised (docs/evolving-schemas.md)",
        "Fix the handler (field names must not become MongoDB operators or paths; store such "
        "a value as a string); for a stored state, deploy the newer definitions or fix the "
        "migration (the detail names it); replay."),
    Reason.INVALID_EMIT: ReasonDoc(
        _DEAD, "an emitted message is invalid: a bad `Emit`, or a payload value that is not "
        "JSON by the rule of docs/design.md \"JSON values\" — NaN or infinity (of any float "
        "type, numpy's too), an int outside 64 bits, bytes, text that is not UTF-8, a type "
        "of its own, keys with `$` or `.` — refused where the handler returns it, before "
        "anything is stored; the detail names the field (`emit[0].payload.amount: NaN is not "
        "JSON …`). The state may hold NaN: it is stored as BSON, never published",
        "Fix the handler (send null, a string or a finite number); replay."),
    Reason.INVALID_TIMER: ReasonDoc(
        _DEAD, "a `Schedule` or `Cancel` is invalid (a bad key, neither or both of `at=` and "
        "`after=`, a naive or out-of-range time, an invalid `Emit` — its payload follows the "
        "emits' rule, the detail names the field), or the aggregate would hold more than 100 "
        "pending timers",
        "Fix the handler (cancel timers that are no longer needed, or reuse keys); replay."),
    Reason.INVALID_PAYLOAD: ReasonDoc(
        _DEAD, "a typed handler's payload does not validate into its payload class; the detail "
        "names the field paths",
        "Fix the producer (or the payload class); replay."),
    Reason.INVALID_HANDLER_RESULT: ReasonDoc(
        _DEAD, "the handler returned `None`, a tuple that is not `(state, [Emit, …])`, or "
        "emits that are not a list",
        "Fix the handler; replay."),
    Reason.UNKNOWN_SCHEMA_VERSION: ReasonDoc(
        _DEAD, "the envelope's `schema_version` is newer than the latest its aggregate type "
        "knows (`message_version`)",
        "Deploy the definitions with the new version's upcaster (readers first: "
        "docs/evolving-schemas.md); replay."),
    Reason.UPCAST_FAILED: ReasonDoc(
        _DEAD, "an upcaster raised, or returned something that is not a payload dict; the "
        "detail names it and the version step",
        "Fix the upcaster (or the producer); deploy; replay."),
    Reason.UNKNOWN_MESSAGE_TYPE: ReasonDoc(
        _DEAD, "the aggregate type has no handler for `type`",
        "Add the handler and replay, or fix the producer."),
    Reason.UNKNOWN_AGGREGATE_TYPE: ReasonDoc(
        _DEAD, "`aggregate_type` is not in the module",
        "Deploy the module with that type and replay, or fix the producer's routing."),
    Reason.INVALID_JSON: ReasonDoc(
        _DEAD, "the input record is not JSON, or empty (pipeline); `NaN`, `Infinity` and "
        "`-Infinity` are not JSON either, anywhere in the record, nor is a payload number "
        "beyond a double's range (`1e400`): the detail names the field",
        "Fix the producer and send it again (only the raw text is stored)."),
    Reason.INVALID_ENCODING: ReasonDoc(
        _DEAD, "the input record is not valid UTF-8; the detail gives the byte offset "
        "(pipeline; never retried, never parked)",
        "Fix the producer's encoding and send it again."),
    Reason.INVALID_ENVELOPE: ReasonDoc(
        _DEAD, "a missing, unknown or mistyped envelope field, bad `occurred_at`/`source`, "
        "payload keys with `$` or `.`; the detail names the field",
        "Fix the producer and send it again."),
    Reason.PAYLOAD_TOO_LARGE: ReasonDoc(
        _DEAD, "the payload's BSON size exceeds `max_payload_bytes` (default 512 KiB), or the "
        "record is larger than 16 MiB",
        "Shrink the payload (store large blobs elsewhere, send a reference), or raise "
        "`max_payload_bytes`; send it again."),
    Reason.PAYLOAD_TOO_DEEP: ReasonDoc(
        _DEAD, "the record nests arrays/objects deeper than `MAX_RECORD_DEPTH` (never "
        "retried, never parked)",
        "Flatten the payload at the producer; send it again."),
    Reason.INVALID_CLOUDEVENT: ReasonDoc(
        _DEAD, "a CloudEvents record (a Kafka `ce_specversion` header, or a JSON object with "
        "`specversion`) cannot be read as an envelope: `specversion` not `1.0`; `id`, `source`, "
        "`type`, `subject` or `aggregatetype` missing; a malformed `source` "
        "(`/aggbox/<type>/<id>`, percent-encoded), `time`, `sourceseq`, `schemaversion`, "
        "`aggboxkind` or `aggboxheaders`; data that is not JSON or not `application/json`; a "
        "header that is not UTF-8, repeated or too long; the detail names the attribute or "
        "header (pipeline; docs/design.md \"CloudEvents\")",
        "Fix the producer and send it again. Rules of the envelope itself (id lengths, "
        "payload keys, size) keep their own codes, naming the attribute too."),
    Reason.DUPLICATE_WITH_DIFFERENT_PAYLOAD: ReasonDoc(
        _DEAD, "inbox dedup: the id was applied before with another payload",
        "A producer bug: it reuses ids. Fix the producer; if the change is real, send it as a "
        "new message with a new id. Do not replay."),
    Reason.BEYOND_DEDUP_HORIZON: ReasonDoc(
        _DEAD, "inbox dedup: in neither the inbox nor the inbox archive, not newer than "
        "`inbox_archive_floor`, and `occurred_at` is older than the dedup horizon",
        "It may have been applied before and its record expired: check the audit log "
        "(`trace`). If it is genuinely new, send it again as a new message (new id, current "
        "`occurred_at`) — a replay gets the same verdict. If it happens often, raise the "
        "aggregate type's `Inbox(horizon=…)` above your longest redelivery delay. After "
        "checking they were applied before, dismiss them in bulk: `aggbox deadletters dismiss "
        "--reason beyond_dedup_horizon --aggregate-type Account` (`--dry-run` first)."),
    Reason.MISSING_SOURCE: ReasonDoc(
        _DEAD, "high-water dedup, message without `source`",
        "The producer must set `source {type, id, seq}`, or use `Inbox` dedup for that "
        "aggregate type."),
    Reason.HIGH_WATER_MAP_FULL: ReasonDoc(
        _DEAD, "high-water dedup, one source more than `max_sources`",
        "Raise `HighWater(max_sources=…)` or use `Inbox` dedup; deploy; replay."),
    Reason.SEQUENCE_GAP: ReasonDoc(
        _PARKED, "contiguous high-water: an earlier `seq` of the source is missing",
        "Wait for it. If it was dead-lettered, fix and replay it: the parked ones follow in "
        "the same write."),
    Reason.AGGBOX_EVENT: ReasonDoc(
        "duplicate", "the message is an event an aggregate published (an untargeted emit, "
        "header `aggbox-kind: event`, fed back as input): its effect is already in the "
        "aggregate that published it — whatever handlers the receiving aggregate type has, "
        "and also when the pipeline has no such aggregate type",
        "Nothing; to stop the round trip, do not feed the outbox topic back into the "
        "pipeline."),
    Reason.EARLIER_ATTEMPT: ReasonDoc(
        "applied", "a retried attempt of a run (a Spark task retried after an executor "
        "loss) found the message applied by an earlier attempt of the same run, whose "
        "outcome was lost with it: counted `applied` once, here; the detail names the "
        "attempt that wrote it (docs/design.md \"Counts that survive retries\")",
        "Nothing: the message was applied once. A real duplicate stays `duplicate`."),
    Reason.OUTBOX_FULL: ReasonDoc(
        _PARKED, "the outbox holds `max_outbox` entries",
        "The dispatcher is not draining: check it (`/healthz`, backlog metrics). Then "
        "`aggbox parked release` or wait for the aggregate's next message."),
    Reason.DOCUMENT_SIZE_BUDGET: ReasonDoc(
        _PARKED, "the write would take the document past `max_document_bytes`",
        "Usually a full outbox: as above. If the inbox and state fill it, raise "
        "`max_document_bytes` or shrink the inbox window, then release it."),
    Reason.EMITS_EXCEED_OUTBOX_LIMIT: ReasonDoc(
        _DEAD, "one handler step emitted more messages than the outbox holds (`max_outbox`): "
        "it can never fit",
        "Emit fewer messages per step (or raise `max_outbox`); replay."),
    Reason.STATE_TOO_LARGE: ReasonDoc(
        _DEAD, "the handler's new state alone is over the document's size budget "
        "(`max_document_bytes`): it can never be stored",
        "Redesign the aggregate (keep large data elsewhere); replay."),
    Reason.EMITS_EXCEED_DOCUMENT_BUDGET: ReasonDoc(
        _DEAD, "the new state plus this message's own outbox and inbox entries exceed the "
        "document's size budget: it can never fit",
        "Emit less per step or raise `max_document_bytes`; replay."),
    Reason.AGGREGATE_BLOCKED: ReasonDoc(
        _PARKED, "an earlier message failed under `on_handler_error=\"park\"`",
        "Fix, replay the failed message, `aggbox parked release`."),
    Reason.VERSION_CONFLICT_RETRIES_EXHAUSTED: ReasonDoc(
        _PARKED, "other writers kept changing the aggregate (`max_conflict_retries`)",
        "Find the rival writer (two pipelines on one input, speculative tasks); then "
        "`aggbox parked release` or wait for the next message."),
    Reason.UNKNOWN_DOCUMENT_LAYOUT: ReasonDoc(
        _DEAD, "the aggregate document carries a layout version `_lv` this aggbox does not "
        "know — higher than its own (a newer aggbox wrote it) or not a positive integer "
        "(docs/design.md \"Compatibility\"); the document is neither applied to nor written",
        "Run the newer aggbox everywhere that writes the collection (writers must be at least "
        "as new as the newest that wrote it), then replay the dead letters. Never lower `_lv` "
        "by hand."),
    Reason.MESSAGE_TOO_LARGE: ReasonDoc(
        _DISPATCH_DEAD, "the broker refused the entry's size",
        "See \"Dispatcher dead letters\" in docs/debugging.md; raise the broker's/topic's size "
        "limit or shrink what the handler emits."),
    Reason.INVALID_TOPIC: ReasonDoc(
        _DISPATCH_DEAD, "the entry's topic is not a valid Kafka topic name, or the broker "
        "rejects it",
        "Fix the topic: the `Emit`'s `topic`, the aggregate type's `topic`, or the "
        "dispatcher's `topic_template`."),
    Reason.REJECTED_BY_BROKER: ReasonDoc(
        _DISPATCH_DEAD, "the broker refused the record for good (invalid record, policy "
        "violation)",
        "Read the error; fix the cause; re-send."),
    Reason.INVALID_OUTBOX_ENTRY: ReasonDoc(
        _DISPATCH_DEAD, "a stored outbox entry or timer cannot form an envelope (a hand-edited "
        "or corrupted document), or its payload holds a value the one rule of outbox "
        "payloads refuses — a float NaN or infinity, bytes, an integer beyond int64 "
        "(docs/design.md \"JSON values\"; the detail names the field; the fold refuses such "
        "an emit as `invalid_emit` or `invalid_timer`, so only an entry stored by hand or by "
        "an older aggbox) — or a publisher could not encode its record. BSON values the "
        "rule converts (`Decimal128`, dates, `Int64`) are published in their JSON form",
        "Inspect the raw entry: `aggbox deadletters show <entry id>`; re-send by hand if "
        "needed."),
    Reason.BROKER_UNAVAILABLE: ReasonDoc(
        _DISPATCH_RETRY, "the broker did not take the record this time (timeout, connection)",
        "Nothing unless it persists: check the broker and the dispatcher's metrics."),
    Reason.IO_ERROR: ReasonDoc(
        _DISPATCH_RETRY, "the JSON-lines publisher could not write its file",
        "Check the directory's space and permissions."),
    Reason.EFFECT_REJECTED: ReasonDoc(
        _EFFECT_DEAD, "an effect function raised `PermanentEffectError` (a built-in: HTTP 4xx "
        "other than 408/425/429, SMTP 5xx); the aggregate received the `on_failure` message",
        "Read the error in the dead letter; fix the request data or the resource's "
        "configuration. The aggregate already knows (its failure handler ran); emit the "
        "effect again from a handler if it should be retried."),
    Reason.EFFECT_RETRYABLE: ReasonDoc(
        _EFFECT_RETRY, "an effect function raised `RetryableEffectError` (a built-in: HTTP 5xx, "
        "408, 425, 429, connection failure; SMTP 4xx)",
        "Nothing while attempts remain; after `max_attempts` it becomes "
        "`effect_attempts_exhausted`. Check the resource if `aggbox_effect_retries_total` "
        "keeps rising."),
    Reason.EFFECT_TIMEOUT: ReasonDoc(
        _EFFECT_RETRY, "an effect call did not finish within the effect's `timeout_s`; whether "
        "it took effect is unknown (the next attempt asks the query function first, if any)",
        "Raise `timeout_s` if the resource is slow by nature; otherwise check it."),
    Reason.EFFECT_ERROR: ReasonDoc(
        _EFFECT_RETRY, "an effect or query function raised something other than an "
        "`EffectError` (a bug or an unexpected answer); treated as retryable, the traceback "
        "is in the log file. Also, final, when it returned a result that cannot be the "
        "`on_success` payload (not a dict, or a value that is not JSON by docs/design.md "
        "\"JSON values\": the detail names the field, `result.amount`): the call took "
        "effect, the aggregate receives the `on_failure` message",
        "Fix the function (raise `RetryableEffectError`/`PermanentEffectError` for the "
        "resource's answers; return JSON values) and deploy."),
    Reason.EFFECT_NOT_CONFIGURED: ReasonDoc(
        _EFFECT_RETRY, "an entry's type is an effect that other live dispatcher instances "
        "execute and this one does not have: it is not published (that would end the effect "
        "unexecuted) but waits, with the later entries of its aggregate",
        "Run every instance with the same effects (`--aggregates` module and "
        "`[dispatcher.effects.*]` tables); the entries go on by themselves then."),
    Reason.EFFECT_ATTEMPTS_EXHAUSTED: ReasonDoc(
        _EFFECT_DEAD, "an effect failed retryably `max_attempts` times (the detail has the last "
        "error); the aggregate received the `on_failure` message",
        "Check the resource; the aggregate already knows (its failure handler ran); emit "
        "the effect again from a handler if it should be retried."),
}
