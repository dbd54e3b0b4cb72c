"""The reason codes: one enum, every member documented, the committed reference generated."""

from __future__ import annotations

from aggbox.reasonref import DOC_PATH, render_markdown
from aggregates.core.reasons import REASON_DOCS, Reason


def test_every_reason_is_named_like_its_value_and_documented() -> None:
    assert [m.name.lower() for m in Reason] == [m.value for m in Reason]
    assert list(REASON_DOCS) == list(Reason), "REASON_DOCS: one entry per member, in order"
    for reason, doc in REASON_DOCS.items():
        assert doc.outcome and doc.when and doc.action, reason


def test_committed_reference_is_generated_from_the_enum() -> None:
    assert DOC_PATH.read_text() == render_markdown(), "run `aggbox reasons --write`"


#: The stored values (dead letters, parked entries, outcome logs hold them): append only.
STORED_VALUES = frozenset({
    "handler_error", "invalid_state", "invalid_emit", "invalid_payload",
    "invalid_handler_result", "unknown_schema_version", "upcast_failed",
    "unknown_message_type", "unknown_aggregate_type", "invalid_json", "invalid_encoding",
    "invalid_envelope", "payload_too_large", "payload_too_deep",
    "duplicate_with_different_payload", "beyond_dedup_horizon", "missing_source",
    "high_water_map_full", "sequence_gap", "aggbox_event", "outbox_full",
    "document_size_budget", "emits_exceed_outbox_limit", "state_too_large",
    "emits_exceed_document_budget", "aggregate_blocked", "version_conflict_retries_exhausted",
    "message_too_large", "invalid_topic", "rejected_by_broker", "invalid_outbox_entry",
    "broker_unavailable", "io_error",
})


def test_no_stored_value_changes_or_disappears() -> None:
    assert {m.value for m in Reason} >= STORED_VALUES
