"""The oracle: what the store must look like, computed in memory from the input lines alone.

It classifies every line the way the pipeline must (not JSON, invalid envelope, unknown
aggregate or message type → dead letter), drops repeated message ids, and folds each
aggregate's messages with the domain's own handlers — its own small fold, not the library's
(:mod:`aggregates.fold`), so the two can disagree. What a generation of handlers emits
(ids from :func:`aggregates.core.ids.emitted_message_id`, ``source.seq`` numbered per emitting
aggregate) is the next generation's input, as it is for the dispatcher and the next pipeline
round, until nothing is emitted.

Independent of the code it checks: a bug there must not be made twice, here too.

- *Envelope*: its own check of the documented envelope contract
  (:func:`~aggbox.demo.oracle_envelope.parse_envelope`, into its own :class:`Envelope`), not
  :meth:`aggregates.message.envelope.Message.from_dict`. Only the field table
  ``ENVELOPE_FIELDS`` is shared.
- *Handlers and classification*: its own map aggregate type → message type → the domain's
  handler function (:func:`domain_of`), read once from the registrations; unknown aggregate
  and message types are decided by that map. Handlers get an :class:`Envelope` (they read
  attributes: ``payload``, ``aggregate_id``, …). A typed handler is registered as the
  library's ``TypedHandler``, called the same way: it validates ``payload`` into the
  domain's payload class and calls the domain's function; its emitted payload objects are
  turned into dicts by the oracle itself (:func:`~aggbox.demo.oracle_envelope.plain_payload`).
- *Timers*: a handler's ``Schedule`` and ``Cancel`` are not emitted messages; the oracle
  keeps each aggregate's pending timers itself (:mod:`aggbox.demo.oracle_timers`). Each
  ``Schedule`` takes the aggregate's next timer number (the document's ``_tseq``); the
  emits' ``seq`` (``_seq``) counts emits only.
- *State*: the domain's own state dataclass (from the handlers' annotations), created with
  its defaults and turned into the stored form with :func:`dataclasses.asdict` plus what BSON
  changes (:func:`bson_plain`) — not the library's ``StateCodec``.

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

import dataclasses
import inspect
import json
import typing
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from aggbox.demo.errors import DemoError
from aggbox.demo.oracle_envelope import (
    Envelope,
    EnvelopeSource,
    InvalidEnvelope,
    Key,
    parse_envelope,
    plain_payload,
)
from aggbox.demo.oracle_timers import PendingTimer, TimerOp, apply_timer_ops, split_returned
from aggregates.core.ids import emitted_message_id, raw_message_id
from aggregates.core.reasons import Reason
from aggregates.domain.aggregate import Emit, Registry

__all__ = [
    "Classified",
    "DomainType",
    "Envelope",
    "EnvelopeSource",
    "Expected",
    "Folded",
    "Key",
    "PendingTimer",
    "bson_plain",
    "classify",
    "domain_of",
    "expect",
    "fold_messages",
    "plain_state",
]


#: Generations of emitted messages before the oracle gives up (a domain whose messages
#: trigger each other forever would never settle).
MAX_GENERATIONS: Final = 50


# -- the domain -----------------------------------------------------------------------------

Handler = Callable[[Any, Any], Any]


@dataclass(frozen=True, slots=True)
class DomainType:
    """One aggregate type as the oracle uses it: its state dataclass and its handlers."""

    name: str
    state: type[Any]
    handlers: Mapping[str, Handler]


def _state_class(atype_name: str, handlers: Mapping[str, Handler]) -> type[Any]:
    """The state dataclass of an aggregate type: the annotation of its handlers' first
    parameter (the domain's own class, e.g. ``Customer``), the same for every handler."""
    found: set[type[Any]] = set()
    for mtype, fn in handlers.items():
        first = next(iter(inspect.signature(fn).parameters), None)
        try:
            hint = typing.get_type_hints(fn).get(first or "")
        except Exception as exc:  # unresolvable annotations
            raise DemoError(f"{atype_name}/{mtype}: cannot read the handler's annotations "
                            f"({exc})") from exc
        if not (isinstance(hint, type) and dataclasses.is_dataclass(hint)):
            raise DemoError(f"{atype_name}/{mtype}: the demo's oracle needs the handler's state "
                            f"parameter annotated with a dataclass, got {hint!r}")
        found.add(hint)
    if len(found) != 1:
        raise DemoError(f"{atype_name}: handlers annotate {len(found)} different state classes "
                        f"{sorted(c.__name__ for c in found)}; the demo's oracle needs one")
    return found.pop()


def _build_domain(registry: Registry) -> dict[str, DomainType]:
    domain: dict[str, DomainType] = {}
    for atype in registry:
        # ``AggregateType`` exposes its registrations only as ``message_types`` and
        # ``handler_for``; they are read here once, per registered type, to copy the
        # registrations into the oracle's own map. What the pipeline does with them per
        # message — reject unknown aggregate/message types (spark/validate.py, the writer) and
        # pick a message's handler while folding (aggregates/fold/__init__.py) — the oracle does
        # with this map only, never through the registry.
        handlers = {mtype: atype.handler_for(mtype) for mtype in atype.message_types}
        domain[atype.name] = DomainType(atype.name, _state_class(atype.name, handlers),
                                        handlers)
    return domain


_DOMAINS: weakref.WeakKeyDictionary[Registry, dict[str, DomainType]] = (
    weakref.WeakKeyDictionary())


def domain_of(registry: Registry) -> Mapping[str, DomainType]:
    """The oracle's map of ``registry``'s domain: aggregate type → :class:`DomainType`
    (built once per registry)."""
    domain = _DOMAINS.get(registry)
    if domain is None:
        domain = _DOMAINS[registry] = _build_domain(registry)
    return domain


def bson_plain(value: Any) -> Any:
    """``value`` as it comes back from MongoDB: tuples become lists, datetimes UTC (aware) at
    millisecond precision — nothing else changes."""
    if isinstance(value, dict):
        return {k: bson_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [bson_plain(v) for v in value]
    if isinstance(value, datetime):
        dt = (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)
        return dt.replace(microsecond=dt.microsecond // 1000 * 1000)
    return value


def plain_state(state: Any) -> dict[str, Any]:
    """A state dataclass as the store's ``state`` sub-document must hold it."""
    plain: dict[str, Any] = bson_plain(dataclasses.asdict(state))
    return plain


# -- classification -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Classified:
    """One input line as the pipeline must see it: a valid message, or a dead letter with
    ``reason`` decided before any handler runs. ``key`` is the message id, or for lines
    without a usable one the id the pipeline derives from the raw text."""

    line: str
    message: Envelope | None
    reason: str | None
    key: str


def classify(line: str, registry: Registry) -> Classified:
    try:
        raw = json.loads(line)
    except ValueError:
        return Classified(line, None, Reason.INVALID_JSON, raw_message_id(line))
    mid = raw.get("message_id") if isinstance(raw, dict) else None
    key = mid if isinstance(mid, str) and mid else raw_message_id(line)
    try:
        msg = parse_envelope(raw)
    except InvalidEnvelope:
        return Classified(line, None, Reason.INVALID_ENVELOPE, key)
    dtype = domain_of(registry).get(msg.aggregate_type)
    if dtype is None:
        return Classified(line, msg, Reason.UNKNOWN_AGGREGATE_TYPE, key)
    if msg.type not in dtype.handlers:
        return Classified(line, msg, Reason.UNKNOWN_MESSAGE_TYPE, key)
    return Classified(line, msg, None, key)


# -- the fold -------------------------------------------------------------------------------


@dataclass(slots=True)
class Folded:
    """One aggregate after folding some messages."""

    state: Any
    seq: int
    applied: list[str] = field(default_factory=list)
    emitted: list[Envelope] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # message id → error
    timers: dict[str, PendingTimer] = field(default_factory=dict)  # pending, by key
    scheduled: int = 0  # the Schedules of this fold (each took a timer number)
    #: given pending timers this fold removed, addressed to this aggregate (in its dedup
    #: record: :mod:`aggbox.demo.oracle_timers`)
    withdrawn: list[PendingTimer] = field(default_factory=list)


def fold_messages(dtype: DomainType, aggregate_id: str, messages: Iterable[Envelope],
                  *, state: Any = None, seq: int = 0, tseq: int = 0,
                  timers: Mapping[str, PendingTimer] | None = None) -> Folded:
    """Apply ``messages`` in the given order with ``dtype``'s handlers, starting from
    ``state`` (default: the state class with its defaults) and the pending ``timers``. A
    handler that raises (or returns something unusable) leaves the state unchanged:
    ``failed``."""
    out = Folded(dtype.state() if state is None else state, seq, timers=dict(timers or {}))
    owner, stored = (dtype.name, aggregate_id), {t.seq for t in out.timers.values()}
    for msg in messages:
        try:
            result = dtype.handlers[msg.type](out.state, msg)
            new_state, emits, ops = _normalise(result)
            if not isinstance(new_state, dtype.state):  # the store holds only that class
                raise TypeError(f"handler returned {type(new_state).__name__}, expected "
                                f"{dtype.state.__name__}")
            pending = dict(out.timers)
            last, removed = apply_timer_ops(pending, ops, owner=owner, cause=msg.message_id,
                                            seq=tseq + out.scheduled)
        except Exception as exc:
            out.failed[msg.message_id] = f"{type(exc).__name__}: {exc}"
            continue
        out.state, out.timers = new_state, pending
        out.applied.append(msg.message_id)
        for i, e in enumerate(emits):
            out.emitted.append(_emitted(dtype, aggregate_id, msg, i, e, out.seq + i + 1))
        out.seq += len(emits)
        out.scheduled = last - tseq
        out.withdrawn += [t for t in removed if t.seq in stored and t.target == owner]
    return out


def _normalise(result: Any) -> tuple[Any, list[Emit], list[TimerOp]]:
    """A handler's result: the new state, its emits and its timer operations."""
    if isinstance(result, tuple):
        state, returned = result
        return (state, *split_returned([returned] if isinstance(returned, Emit) else returned))
    if result is None:
        raise TypeError("handler returned None")
    return result, [], []


def _emitted(dtype: DomainType, aggregate_id: str, cause: Envelope, index: int,
             e: Emit, seq: int) -> Envelope:
    to_type, to_id = e.to if e.to is not None else (dtype.name, aggregate_id)
    return Envelope(
        message_id=emitted_message_id(dtype.name, aggregate_id, cause.message_id, index),
        type=e.type,
        aggregate_type=to_type,
        aggregate_id=to_id,
        payload=plain_payload(e.payload),
        source=EnvelopeSource(dtype.name, aggregate_id, seq),
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
    #: timers scheduled per aggregate (the document's ``_tseq``)
    scheduled: dict[Key, int] = field(default_factory=dict)
    #: pending timers by key, per aggregate that has any (none fires during the demo)
    timers: dict[Key, dict[str, PendingTimer]] = field(default_factory=dict)
    #: timers removed after they were stored, per aggregate: recorded as handled
    withdrawn: dict[Key, list[PendingTimer]] = field(default_factory=dict)
    #: ids of the messages each aggregate applies
    applied: dict[Key, set[str]] = field(default_factory=dict)
    #: every valid message by id: the input's and every emitted one
    messages: dict[str, Envelope] = field(default_factory=dict)
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


def expect(lines: Iterable[str], registry: Registry, *, generations: int | None = None
           ) -> Expected:
    """Fold ``lines`` (the first round's input) and everything it causes — or only its first
    ``generations`` (what a run stopped after that many rounds must show)."""
    ex = Expected()
    current: list[Envelope] = []
    for line in lines:
        c = classify(line, registry)
        if c.reason is not None:
            ex.dead[c.key] = c.reason
        elif c.message is not None:
            current.append(c.message)
    domain = domain_of(registry)
    states: dict[Key, Any] = {}
    seen: set[str] = set()
    while current and (generations is None or len(ex.generations) < generations):
        if len(ex.generations) >= MAX_GENERATIONS:
            raise DemoError(f"the domain still emits messages after {MAX_GENERATIONS} "
                            "generations; the demo needs a cascade that ends")
        batch: dict[Key, list[Envelope]] = {}
        for m in current:
            ex.messages.setdefault(m.message_id, m)
            if m.message_id not in seen:
                seen.add(m.message_id)
                batch.setdefault(m.aggregate_key, []).append(m)
        nxt: list[Envelope] = []
        applied = 0
        for key in sorted(batch):
            msgs = sorted(batch[key], key=lambda m: m.message_id)
            dtype = domain[key[0]]
            start, seq0, tseq0 = states.get(key), ex.seq.get(key, 0), ex.scheduled.get(key, 0)
            timers = ex.timers.get(key)
            fwd = fold_messages(dtype, key[1], msgs, state=start, seq=seq0, tseq=tseq0,
                                timers=timers)
            bwd = fold_messages(dtype, key[1], reversed(msgs), state=start, seq=seq0,
                                tseq=tseq0, timers=timers)
            if _signature(fwd) != _signature(bwd):
                ex.order_sensitive.append(key)
            for mid in fwd.failed:
                ex.dead[mid] = Reason.HANDLER_ERROR
                seen.discard(mid)  # not recorded: a later copy is dead-lettered again
            if fwd.applied:
                states[key] = fwd.state
                ex.states[key] = plain_state(fwd.state)
                ex.seq[key] = fwd.seq
                ex.scheduled[key] = ex.scheduled.get(key, 0) + fwd.scheduled
                if fwd.withdrawn:
                    ex.withdrawn.setdefault(key, []).extend(fwd.withdrawn)
                if fwd.timers:
                    ex.timers[key] = fwd.timers
                else:
                    ex.timers.pop(key, None)
                ex.applied.setdefault(key, set()).update(fwd.applied)
                applied += len(fwd.applied)
            for e in fwd.emitted:
                ex.emitted.add(e.message_id)
                ex.messages.setdefault(e.message_id, e)  # also if `generations` stops here
            nxt.extend(fwd.emitted)
        ex.generations.append(applied)
        current = nxt
    return ex


def _signature(f: Folded) -> tuple[Any, ...]:
    emitted = sorted(
        (m.message_id, m.type, m.aggregate_type, m.aggregate_id,
         json.dumps(m.payload, sort_keys=True))
        for m in f.emitted
    )
    timers = sorted((t.key, t.type, t.target, json.dumps(t.payload, sort_keys=True),
                     t.causation_id) for t in f.timers.values())
    return (json.dumps(plain_state(f.state), sort_keys=True, default=str), f.seq,
            sorted(f.applied), sorted(f.failed), emitted, timers)
