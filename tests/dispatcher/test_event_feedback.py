"""An untargeted emit is published as an *event* of its emitter (``aggbox-kind: event``);
fed back into aggbox, it is reported ``duplicate`` (reason ``aggbox_event``), never handed
to a handler and never dead-lettered — while an addressed emit is input for its target."""

from __future__ import annotations

from aggregates import AggboxSettings, Message, StoreWriter
from aggregates.core.reasons import Reason
from aggregates.testing import AggregateHarness, memory_database, message
from dispatcher.publishers.builder import build_record
from tests.aggregates.domain import counters, registry


def _published(entry: dict[str, object]) -> Message:
    rec = build_record(entry, collection="counters", document_id="a1", source_type="Counter",
                       topic_template="{aggregate_type}")
    return Message.from_dict(rec.envelope)


def test_published_events_fed_back_are_duplicates_not_dead_letters() -> None:
    h = AggregateHarness(counters, aggregate_id="a1")
    # n=9: one untargeted "Added" event and one "Ninefold" addressed to Counter/sink.
    step = h.when(message("Add", {"n": 9}, to=counters, id="a1"))
    assert step.emitted_types == ["Added", "Ninefold"]
    event, addressed = (_published(e) for e in h.dispatch())
    assert event.headers.get("aggbox-kind") == "event" and event.aggregate_id == "a1"
    assert addressed.aggregate_id == "sink"

    again = h.when(event)
    assert (again.outcome, again.reason) == ("duplicate", Reason.AGGBOX_EVENT)
    db = memory_database("events")
    w = StoreWriter(db, registry, settings=AggboxSettings())
    out = w.process([event, addressed])
    assert [(o.outcome, o.reason) for o in out] == [
        ("duplicate", Reason.AGGBOX_EVENT), ("dead_lettered", Reason.UNKNOWN_MESSAGE_TYPE)]
    # The addressed one is real input (its target has no "Ninefold" handler here: a dead
    # letter that names the type); the event is nobody's input and leaves no dead letter.
    assert [d["message_id"] for d in db.aggbox_dead_letters.find()] == [addressed.message_id]


def test_an_event_of_an_aggregate_type_the_pipeline_lacks_is_a_duplicate_too() -> None:
    """An event is nobody's input, whatever the receiving registry has: a writer without the
    emitter's type reports it ``duplicate`` (``aggbox_event``), writes no dead letter — while
    addressed input for a type it lacks stays an ``unknown_aggregate_type`` dead letter."""
    from tests.spark.eventdomain import registry as other

    h = AggregateHarness(counters, aggregate_id="a1")
    h.when(message("Add", {"n": 9}, to=counters, id="a1"))
    event, addressed = (_published(e) for e in h.dispatch())
    assert "Counter" not in {t.name for t in other}
    db = memory_database("events-unknown")
    out = StoreWriter(db, other, settings=AggboxSettings()).process([event, addressed])
    assert sorted((o.message_id, o.outcome, o.reason) for o in out) == sorted([
        (event.message_id, "duplicate", Reason.AGGBOX_EVENT),
        (addressed.message_id, "dead_lettered", Reason.UNKNOWN_AGGREGATE_TYPE)])
    assert [d["message_id"] for d in db.aggbox_dead_letters.find()] == [addressed.message_id]
