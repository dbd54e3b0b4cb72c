"""Cutting the writer's input into chunks of aggregates (docs/design.md "The writer",
step 1)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from aggregates.core.errors import UnknownAggregateType
from aggregates.core.reasons import Reason
from aggregates.core.settings import AggboxSettings
from aggregates.domain.aggregate import AggregateType, Registry
from aggregates.fold.result import DeadLetter, Parked
from aggregates.message.envelope import KIND_EVENT, KIND_HEADER, Message
from aggregates.message.outcomes import Outcome

__all__ = ["Chunk", "Work", "chunks"]


@dataclass(slots=True)
class Work:
    """One aggregate's messages in this chunk, written slice by slice."""

    atype: AggregateType[Any]
    aggregate_id: str
    messages: list[Message] = field(default_factory=list)
    pos: int = 0
    #: Version conflicts in a row / transient write errors in a row.
    conflicts: int = 0
    transient: int = 0
    parked: list[Parked] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.pos >= len(self.messages)


#: A chunk: its aggregates' work, the dead letters of messages of unknown types, and the
#: outcomes of the aggbox events among those (``duplicate``, reason ``aggbox_event``).
Chunk = tuple[list[Work], list[DeadLetter], list[Outcome]]


def chunks(messages: Iterable[Message], registry: Registry, settings: AggboxSettings
           ) -> Iterator[Chunk]:
    """Cut the input into chunks of at most ``chunk_aggregates`` aggregates and about
    ``chunk_messages`` messages; a hot aggregate cuts a chunk at four times that."""
    s = settings
    chunk: dict[tuple[str, str], Work] = {}
    pending_dead: list[DeadLetter] = []
    events: list[Outcome] = []
    n = 0
    # Per chunk, not per message: the limits, and the types already looked up.
    max_aggs, max_msgs = s.chunk_aggregates, s.chunk_messages
    hot = max_msgs * 4
    known: dict[str, AggregateType[Any]] = {}
    # The input is usually grouped by aggregate (the pipeline sorts it): a message of the
    # aggregate just seen joins its work without building its key.
    last_type: str | None = None
    last_id: str | None = None
    work: Work | None = None
    for msg in messages:
        if work is not None and msg.aggregate_id == last_id and msg.aggregate_type == last_type:
            work.messages.append(msg)
            n += 1
            if n >= hot:
                yield list(chunk.values()), pending_dead, events
                chunk, pending_dead, events, n, work = {}, [], [], 0, None
            continue
        atype = known.get(msg.aggregate_type)
        if atype is None:
            try:
                atype = known[msg.aggregate_type] = registry.get(msg.aggregate_type)
            except UnknownAggregateType as exc:
                _unknown(msg, exc, events, pending_dead)
                work = None
                continue
        key = (atype.name, msg.aggregate_id)
        work = chunk.get(key)
        if work is None:
            if len(chunk) >= max_aggs or n >= max_msgs:
                yield list(chunk.values()), pending_dead, events
                chunk, pending_dead, events, n = {}, [], [], 0
            work = chunk[key] = Work(atype, msg.aggregate_id)
        last_type, last_id = msg.aggregate_type, msg.aggregate_id
        work.messages.append(msg)
        n += 1
        if n >= hot:
            # A hot aggregate: do not buffer without bound waiting for its end.
            yield list(chunk.values()), pending_dead, events
            chunk, pending_dead, events, n, work = {}, [], [], 0, None
    if chunk or pending_dead or events:
        yield list(chunk.values()), pending_dead, events


def _unknown(msg: Message, exc: UnknownAggregateType, events: list[Outcome],
             pending_dead: list[DeadLetter]) -> None:
    """A message of a type this registry lacks: an aggbox event is a duplicate, anything
    else a dead letter."""
    if msg.headers.get(KIND_HEADER) == KIND_EVENT:
        # An aggbox event (an untargeted emit fed back) is nobody's input, whatever
        # its type: the fold's first check, here for a type this registry lacks.
        events.append(Outcome(
            msg.message_id, msg.aggregate_type, msg.aggregate_id, "duplicate",
            Reason.AGGBOX_EVENT, f"an event {msg.aggregate_type}/{msg.aggregate_id} "
            f"published (header {KIND_HEADER}: {KIND_EVENT}); events are not input "
            "to aggregates (and this pipeline has no aggregate type "
            f"{msg.aggregate_type!r})"))
    else:
        pending_dead.append(DeadLetter(msg, None, Reason.UNKNOWN_AGGREGATE_TYPE,
                                       str(exc), None, msg.aggregate_type,
                                       msg.aggregate_id))
