"""The single-aggregate harness: run one aggregate type's handlers in memory with the
same fold as the store writer (:func:`aggregates.fold.fold`); exported by
:mod:`aggregates.testing`."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar, cast

from aggregates.core.errors import AggboxError, ConfigurationError, HandlerError
from aggregates.core.reasons import Reason
from aggregates.core.samevalue import same_value
from aggregates.domain.aggregate import AggregateType
from aggregates.domain.effect_rules import result_payload
from aggregates.domain.effects import Effect, reply_message
from aggregates.fold import DeadLetter, Parked, fold
from aggregates.fold.document import Snapshot
from aggregates.message.envelope import Message
from aggregates.message.outcomes import Outcome
from aggregates.testing._blame import first_difference as _first_difference
from aggregates.testing._blame import run_difference
from aggregates.testing._numbering import next_number
from aggregates.wire.outbound import entry_message

S = TypeVar("S")

_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def message(
    type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    to: AggregateType[Any] | str,
    id: str,
    message_id: str | None = None,
    occurred_at: datetime | None = None,
    source: tuple[str, str, int] | None = None,
    correlation_id: str | None = None,
    schema_version: int | None = None,
    headers: Mapping[str, str] | None = None,
) -> Message:
    """Build a valid test message; ids and times are generated when not given (``test-<n>``,
    2026-01-01 + ``n`` s; from 1 again in each run of :func:`check_fault_tolerance`).
    ``schema_version``: the payload's version (default: none in the envelope, i.e. 1);
    ``headers``: envelope headers (e.g. ``traceparent``)."""
    prefix, n = next_number()
    return Message.from_dict(
        {
            "message_id": message_id or f"{prefix}-{n}",
            "type": type,
            "aggregate_type": to if isinstance(to, str) else to.name,
            "aggregate_id": id,
            "payload": dict(payload or {}),
            "occurred_at": occurred_at or _EPOCH + timedelta(seconds=n),
            "source": None if source is None else
            {"type": source[0], "id": source[1], "seq": source[2]},
            "correlation_id": correlation_id,
            "schema_version": schema_version,
            "headers": dict(headers or {}),
        }
    )


@dataclass(frozen=True, slots=True)
class Step:
    """The result of one :meth:`AggregateHarness.when`."""

    outcome: str
    reason: str | None
    detail: str | None
    emitted: list[dict[str, Any]]
    state: Any

    @property
    def emitted_types(self) -> list[str]:
        return [e["type"] for e in self.emitted]


def memory_database(name: str = "aggbox_test") -> Any:
    """A fresh in-memory MongoDB ``Database`` for the store writer in unit tests: mongomock,
    with the unordered ``bulk_write`` and per-operation errors the writer needs
    (:mod:`aggregates.testing.memory_db`), held to the same contract suite as a real server.

    Needs mongomock, the ``testing`` extra (``pip install 'aggbox[testing]'``), imported
    only here. Not thread-safe: give
    the writer ``pipeline_depth=1``. Times come back timezone-aware, as from the writer's
    own client."""
    try:
        from aggregates.testing.memory_db import MemoryClient
    except ImportError as exc:  # mongomock is not installed
        raise ConfigurationError("aggregates.testing.memory_database() needs mongomock: "
                                 "pip install 'aggbox[testing]'") from exc
    return MemoryClient(tz_aware=True)[name]


class AggregateHarness(Generic[S]):
    """One aggregate in memory. ``check_determinism`` runs every handling twice and fails
    if the two runs differ or if the handler mutated the state it was given.

    Every state a handler returns is also put through the store's round trip: loading its
    stored form must give an equal state, and storing that again the same document —
    otherwise :class:`HandlerError` names the aggregate type and the first differing field,
    so a state the codec cannot carry fails in unit tests rather than in production."""

    def __init__(self, atype: AggregateType[S], *, aggregate_id: str = "test-1",
                 check_determinism: bool = True, now: datetime | None = None) -> None:
        self.atype = atype
        self.snapshot = Snapshot(aggregate_id=aggregate_id)
        self.check_determinism = check_determinism
        self.now = now or _EPOCH
        self.outbox: list[dict[str, Any]] = []
        self.parked: list[Parked] = []
        self.dead_letters: list[DeadLetter] = []
        self.history: list[Outcome] = []
        #: Messages handled so far (the step number of error messages).
        self.steps = 0
        # The type as the fold sees it, with a codec that records each (state, document)
        # it dumps, for the round-trip check.
        self._dumped: list[tuple[Any, dict[str, Any]]] = []
        self._fold_type = copy.copy(atype)
        self._fold_type.codec = cast(Any, _RecordingCodec(atype, self._dumped))

    @property
    def state(self) -> S:
        return self.atype.load_state(self.snapshot.state, self.snapshot.state_version)

    @property
    def version(self) -> int:
        return self.snapshot.version

    def given(self, *messages: Message) -> AggregateHarness[S]:
        """Apply messages that must all be applied (set-up); raises otherwise."""
        for m in messages:
            step = self.when(m)
            if step.outcome != "applied":
                raise AggboxError(f"given(): {m.type} {m.message_id} was {step.outcome} "
                                  f"({step.reason}: {step.detail})")
        return self

    def when(self, msg: Message, *, step: int | None = None) -> Step:
        """Handle ``msg``. ``step``: how error messages number this handling (default:
        this harness's count of handlings; a scenario passes its timeline step)."""
        self.steps += 1
        step = self.steps if step is None else step
        if msg.aggregate_id != self.snapshot.aggregate_id:
            raise AggboxError(f"message {msg.message_id} is for aggregate "
                              f"{msg.aggregate_id!r}, the harness holds "
                              f"{self.snapshot.aggregate_id!r}")
        # The harness remembers every id that left the inbox (its in-memory inbox archive
        # never expires), so the archive is always fully known here.
        self.snapshot.dedup.looked_up({})
        self._dumped.clear()
        res = fold(self._fold_type, self.snapshot, [msg], now=self.now, parked=self.parked)
        dumped = list(self._dumped)
        if self.check_determinism:
            self._check_no_mutation(msg, step)
            again = fold(self.atype, self.snapshot, [msg], now=self.now, parked=self.parked)
            where = run_difference(res.changes, again.changes)
            if where is not None:
                raise HandlerError(
                    f"{self._at(msg, step)}: the handler for {msg.type!r} is not "
                    f"deterministic: two runs on the same input differ at {where}; derive "
                    "values from the message (msg.occurred_at, its payload), not from the "
                    "clock, random numbers, global state or the iteration order of a set")
        for state, doc in dumped:
            self._check_round_trip(state, doc)
        if not res.changes.empty:
            res.snapshot.version += 1
        self.snapshot = res.snapshot
        self.outbox.extend(res.changes.outbox)
        released = set(res.released)
        self.parked = [p for p in self.parked if p.message.message_id not in released]
        self.parked.extend(res.parked)
        self.dead_letters.extend(res.dead_letters)
        self.history.extend(res.outcomes)
        mine = [o for o in res.outcomes if not o.from_parked]
        o = mine[-1]
        return Step(o.outcome, o.reason, o.detail, list(res.changes.outbox), self.state)

    def _check_round_trip(self, state: Any, doc: dict[str, Any]) -> None:
        """``load(dump(state)) == state`` and ``dump(load(dump(state))) == dump(state)``."""
        codec = self.atype.codec
        name = self.atype.name
        try:
            back = codec.load(doc)
        except Exception as exc:
            raise HandlerError(f"{name}: the stored state cannot be loaded back "
                               f"({type(exc).__name__}: {exc})") from exc
        if not _equal(back, state) and not same_value(state, back, strict=False):  # NaN
            where = _first_difference(state, back, "state", strict=False)
            raise HandlerError(
                f"{name}: the state does not survive the store's round trip: {where}. Use "
                "field types the codec stores (docs/concepts.md \"State types\") and an "
                "__eq__ that compares the stored fields")
        again = codec.dump(back)
        if not _equal(again, doc) and not same_value(again, doc, strict=False):
            where = _first_difference(doc, again, "state")
            raise HandlerError(f"{name}: the stored state changes when loaded and stored "
                               f"again: {where}")

    def _at(self, msg: Message, step: int) -> str:
        """Where a handling happened, for error messages."""
        return (f"{self.atype.name}/{self.snapshot.aggregate_id}, message {msg.message_id} "
                f"(step {step})")

    def _check_no_mutation(self, msg: Message, step: int) -> None:
        if msg.type not in self.atype.message_types:
            return
        codec = self.atype.codec
        try:
            probe = self.atype.load_state(self.snapshot.state, self.snapshot.state_version)
        except AggboxError:  # the fold dead-letters the message invalid_state
            return
        before = _freeze(codec.dump(probe))
        # The fold reports handler errors (and upcast errors); only mutation matters here.
        with contextlib.suppress(Exception):  # aggbox-allow: the fold reports it (above)
            self.atype.handler_for(msg.type)(probe, self.atype.upcast(msg))
        if _freeze(codec.dump(probe)) != before:
            raise HandlerError(f"{self._at(msg, step)}: the handler for {msg.type!r} "
                               "mutated the state it was given; return a new state instead "
                               "(frozen dataclasses help)")

    def effect_result(self, effect: Effect, *, result: Mapping[str, Any] | None = None,
                      failure: tuple[str, str] | None = None, attempts: int = 1) -> Step:
        """Deliver the result of the oldest pending ``effect.type`` entry as the effect
        runner would (docs/side-effects.md): the entry leaves the outbox and the aggregate
        handles ``effect.on_success`` with ``result`` — or, with ``failure=(reason,
        error)``, ``effect.on_failure`` with ``{reason, error, attempts}`` — under the
        reply's real id, so delivering it twice gives ``duplicate``. A ``result`` goes in
        its JSON form, or — when the runner could not send it (a NaN, bytes: docs/design.md
        "JSON values") — as the ``effect_error`` failure the runner sends instead, naming
        the field. The effect function itself is not called: test it on its own."""
        found = [i for i, e in enumerate(self.outbox) if e.get("type") == effect.type]
        if not found:
            pending = [e.get("type") for e in self.outbox]
            raise AggboxError(f"effect_result(): no pending {effect.type!r} entry in the "
                              f"outbox (pending: {pending}); emit it first")
        i = found[0]
        entry = self.outbox[i]
        if failure is None:  # the runner's rule: the result in its JSON form, or a failure
            result, problem = result_payload(result or {}, effect,
                                             aggregate_type=self.atype.name,
                                             aggregate_id=self.snapshot.aggregate_id)
            failure = None if problem is None else (Reason.EFFECT_ERROR, problem)
        msg = reply_message(effect, entry, aggregate_type=self.atype.name,
                            aggregate_id=self.snapshot.aggregate_id, result=result,
                            failure=failure, attempts=attempts, at=self.now)
        del self.outbox[i]
        with contextlib.suppress(ValueError):
            self.snapshot.outbox_ids.remove(str(entry.get("id")))
        return self.when(msg)

    @property
    def timers(self) -> list[dict[str, Any]]:
        """The pending timers as stored (``timer`` key, ``due``, ``type``, ``payload``, …)."""
        return list(self.snapshot.timers)

    def advance(self, by: timedelta) -> list[Step]:
        """Move the harness clock ``by`` forward and fire what is due then, in due order, as
        the dispatcher would (docs/concepts.md "Timers"): a timer addressed to this
        aggregate is handled (its :class:`Step` is returned), one addressed elsewhere goes
        to :attr:`outbox` (published). Timers a handled one schedules fire too when they are
        due by the new time."""
        self.now = self.now + by
        steps: list[Step] = []
        while True:
            due = sorted((t for t in self.snapshot.timers if t["due"] <= self.now),
                         key=lambda t: (t["due"], str(t["id"])))
            if not due:
                return steps
            timer = due[0]
            # Removed once "published" (the dispatcher's $pull), then delivered.
            self.snapshot.timers = [t for t in self.snapshot.timers if t is not timer]
            self.snapshot.version += 1
            fired = entry_message(timer, document_id=self.snapshot.aggregate_id,
                                  source_type=self.atype.name)
            if (fired.aggregate_type, fired.aggregate_id) == (
                    self.atype.name, self.snapshot.aggregate_id):
                steps.append(self.when(fired))
            else:
                self.outbox.append(timer)

    def dispatch(self) -> list[dict[str, Any]]:
        """Take (and clear) the pending outbox, as the dispatcher would."""
        out, self.outbox = self.outbox, []
        self.snapshot.outbox_ids = []
        return out


class _RecordingCodec:
    """The aggregate type's codec, recording what the fold dumps."""

    def __init__(self, atype: AggregateType[Any], seen: list[tuple[Any, dict[str, Any]]]):
        self._atype = atype
        self._seen = seen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._atype.codec, name)

    def dump(self, state: Any) -> dict[str, Any]:
        return self.dump_checked(state, check=False)

    def dump_checked(self, state: Any, *, check: bool = True) -> dict[str, Any]:
        doc = self._atype.codec.dump_checked(state, check=check)
        self._seen.append((state, doc))
        return doc


def _equal(a: Any, b: Any) -> bool:
    """``a == b`` by the state's own ``__eq__`` (``False`` where it cannot say: a numpy
    array in a dict state)."""
    try:
        return bool(a == b)
    except Exception:
        return False


def _freeze(value: Any) -> Any:
    """A snapshot of a state document, compared by value: a float by its representation
    (a NaN is the same NaN, ``-0.0`` is not ``0.0``)."""
    if isinstance(value, Mapping):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, float):
        return (float, float.__repr__(value))
    return value


# A whole flow of several aggregates (docs/testing.md): imported last, they build on the
# harness above.
