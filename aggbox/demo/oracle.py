"""The oracle: what the store must look like, computed in memory from the input lines alone.

It classifies every line the way the pipeline must (not JSON, invalid envelope, unknown
aggregate or message type → dead letter), drops repeated message ids, and folds each
aggregate's messages with the domain's own handlers — its own small fold, not the library's
(:mod:`aggregates.fold`), so the two can disagree. What a generation of handlers emits
(ids from :func:`aggregates.ids.emitted_message_id`, ``source.seq`` numbered per emitting
aggregate) is the next generation's input, as it is for the dispatcher and the next pipeline
round, until nothing is emitted.

Per generation the messages of an aggregate are folded in a canonical order (by message
id) — and once more in the opposite order: the demo's input is order-insensitive by
construction (see :mod:`aggbox.demo.generate`), and ``Expected.order_sensitive`` lists
the aggregates where the two folds differ (none, or the comparison with the store would
depend on timing). Dedup is by message id; the generator sends no two different messages
with the same ``source`` and ``seq``, so the Order type's high-water dedup agrees with it.
``source.seq`` of emitted messages follows the canonical order; the store's may follow
another one, so checks compare the *set* of an aggregate's sequence numbers, not each one.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from aggbox.demo.errors import DemoError
from aggregates import outcomes as oc
from aggregates.aggregate import AggregateType, Emit, Registry
from aggregates.envelope import Message, Source
from aggregates.errors import EnvelopeError
from aggregates.ids import emitted_message_id, raw_message_id
from spark.validate import INVALID_JSON

__all__ = [
    "Classified",
    "Expected",
    "Folded",
    "Key",
    "RoundCounts",
    "classify",
    "expect",
    "expected_round_counts",
    "fold_messages",
]

Key = tuple[str, str]

#: Generations of emitted messages before the oracle gives up (a domain whose messages
#: trigger each other forever would never settle).
MAX_GENERATIONS: Final = 50


@dataclass(frozen=True, slots=True)
class Classified:
    """One input line as the pipeline must see it: a valid message, or a dead letter with
    ``reason`` decided before any handler runs. ``key`` is the message id, or for lines
    without a usable one the id the pipeline derives from the raw text."""

    line: str
    message: Message | None
    reason: str | None
    key: str


def classify(line: str, registry: Registry) -> Classified:
    try:
        raw = json.loads(line)
    except ValueError:
        return Classified(line, None, INVALID_JSON, raw_message_id(line))
    mid = raw.get("message_id") if isinstance(raw, dict) else None
    key = mid if isinstance(mid, str) and mid else raw_message_id(line)
    try:
        msg = Message.from_dict(raw)
    except EnvelopeError:
        return Classified(line, None, oc.INVALID_ENVELOPE, key)
    if msg.aggregate_type not in registry:
        return Classified(line, msg, oc.UNKNOWN_AGGREGATE_TYPE, key)
    if msg.type not in registry.get(msg.aggregate_type).message_types:
        return Classified(line, msg, oc.UNKNOWN_MESSAGE_TYPE, key)
    return Classified(line, msg, None, key)


@dataclass(slots=True)
class Folded:
    """One aggregate after folding some messages."""

    state: Any
    seq: int
    applied: list[str] = field(default_factory=list)
    emitted: list[Message] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # message id → error


def fold_messages(atype: AggregateType[Any], aggregate_id: str, messages: Iterable[Message],
                  *, state: Any = None, seq: int = 0) -> Folded:
    """Apply ``messages`` in the given order with ``atype``'s handlers. A handler that
    raises (or returns something unusable) leaves the state unchanged: ``failed``."""
    out = Folded(atype.codec.initial() if state is None else state, seq)
    for msg in messages:
        try:
            result = atype.handler_for(msg.type)(out.state, msg)
            new_state, emits = _normalise(result)
            atype.codec.dump(new_state)  # the store must be able to hold it
        except Exception as exc:
            out.failed[msg.message_id] = f"{type(exc).__name__}: {exc}"
            continue
        out.state = new_state
        out.applied.append(msg.message_id)
        for i, e in enumerate(emits):
            out.seq += 1
            out.emitted.append(_emitted(atype, aggregate_id, msg, i, e, out.seq))
    return out


def _normalise(result: Any) -> tuple[Any, Sequence[Emit]]:
    if isinstance(result, tuple):
        state, emits = result
        return state, [emits] if isinstance(emits, Emit) else list(emits)
    if result is None:
        raise TypeError("handler returned None")
    return result, []


def _emitted(atype: AggregateType[Any], aggregate_id: str, cause: Message, index: int,
             e: Emit, seq: int) -> Message:
    to_type, to_id = e.to if e.to is not None else (atype.name, aggregate_id)
    return Message(
        message_id=emitted_message_id(atype.name, aggregate_id, cause.message_id, index),
        type=e.type,
        aggregate_type=to_type,
        aggregate_id=to_id,
        payload=dict(e.payload),
        source=Source(atype.name, aggregate_id, seq),
        correlation_id=cause.correlation_id or cause.message_id,
        causation_id=cause.message_id,
        headers=dict(e.headers),
    )


@dataclass(slots=True)
class Expected:
    """The oracle's answer for one input."""

    #: stored ``state`` sub-document per aggregate that applied at least one message
    states: dict[Key, dict[str, Any]] = field(default_factory=dict)
    #: messages emitted per aggregate (the document's ``_seq``)
    seq: dict[Key, int] = field(default_factory=dict)
    #: ids of the messages each aggregate applies
    applied: dict[Key, set[str]] = field(default_factory=dict)
    #: every valid message by id: the input's and every emitted one
    messages: dict[str, Message] = field(default_factory=dict)
    #: ids of emitted messages
    emitted: set[str] = field(default_factory=set)
    #: dead letters: key (message id or raw id) → reason
    dead: dict[str, str] = field(default_factory=dict)
    #: distinct messages applied per generation (1 = the input)
    generations: list[int] = field(default_factory=list)
    #: aggregates whose result depends on the order of their messages (should be none)
    order_sensitive: list[Key] = field(default_factory=list)

    def state_of(self, aggregate_type: str, aggregate_id: str) -> dict[str, Any] | None:
        return self.states.get((aggregate_type, aggregate_id))


def expect(lines: Iterable[str], registry: Registry) -> Expected:
    """Fold ``lines`` (the first round's input) and everything it causes."""
    ex = Expected()
    current: list[Message] = []
    for line in lines:
        c = classify(line, registry)
        if c.reason is not None:
            ex.dead[c.key] = c.reason
        elif c.message is not None:
            current.append(c.message)
    states: dict[Key, Any] = {}
    seen: set[str] = set()
    while current:
        if len(ex.generations) >= MAX_GENERATIONS:
            raise DemoError(f"the domain still emits messages after {MAX_GENERATIONS} "
                            "generations; the demo needs a cascade that ends")
        batch: dict[Key, list[Message]] = {}
        for m in current:
            ex.messages.setdefault(m.message_id, m)
            if m.message_id not in seen:
                seen.add(m.message_id)
                batch.setdefault(m.aggregate_key, []).append(m)
        nxt: list[Message] = []
        applied = 0
        for key in sorted(batch):
            msgs = sorted(batch[key], key=lambda m: m.message_id)
            atype = registry.get(key[0])
            start, seq0 = states.get(key), ex.seq.get(key, 0)
            fwd = fold_messages(atype, key[1], msgs, state=start, seq=seq0)
            bwd = fold_messages(atype, key[1], reversed(msgs), state=start, seq=seq0)
            if _signature(atype, fwd) != _signature(atype, bwd):
                ex.order_sensitive.append(key)
            for mid in fwd.failed:
                ex.dead[mid] = oc.HANDLER_ERROR
                seen.discard(mid)  # not recorded: a later copy is dead-lettered again
            if fwd.applied:
                states[key] = fwd.state
                ex.states[key] = atype.codec.dump(fwd.state)
                ex.seq[key] = fwd.seq
                ex.applied.setdefault(key, set()).update(fwd.applied)
                applied += len(fwd.applied)
            for e in fwd.emitted:
                ex.emitted.add(e.message_id)
            nxt.extend(fwd.emitted)
        ex.generations.append(applied)
        current = nxt
    return ex


def _signature(atype: AggregateType[Any], f: Folded) -> tuple[Any, ...]:
    emitted = sorted(
        (m.message_id, m.type, m.aggregate_type, m.aggregate_id,
         json.dumps(m.payload, sort_keys=True))
        for m in f.emitted
    )
    return (json.dumps(atype.codec.dump(f.state), sort_keys=True, default=str), f.seq,
            sorted(f.applied), sorted(f.failed), emitted)


@dataclass(frozen=True, slots=True)
class RoundCounts:
    """Outcome counts of one pipeline round."""

    input: int = 0
    applied: int = 0
    duplicate: int = 0
    dead_lettered: int = 0
    parked: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"input": self.input, "applied": self.applied, "duplicate": self.duplicate,
                "dead_lettered": self.dead_lettered, "parked": self.parked}


def expected_round_counts(lines: Sequence[str], registry: Registry, expected: Expected, *,
                          seen: set[str]) -> RoundCounts:
    """What one round over ``lines`` must report, given the ids applied by earlier rounds
    (``seen``, updated in place): the first copy of a new message is applied, later copies
    and earlier rounds' messages are duplicates, bad rows and messages whose handler fails
    are dead letters, nothing is parked."""
    n: Counter[str] = Counter()
    for line in lines:
        c = classify(line, registry)
        if c.reason is not None or expected.dead.get(c.key) == oc.HANDLER_ERROR:
            n["dead_lettered"] += 1
        elif c.key in seen:
            n["duplicate"] += 1
        else:
            seen.add(c.key)
            n["applied"] += 1
    return RoundCounts(input=len(lines), applied=n["applied"], duplicate=n["duplicate"],
                       dead_lettered=n["dead_lettered"])
