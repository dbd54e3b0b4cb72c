"""A whole flow in one test: several aggregates, their messages, effects and faults
(docs/testing.md). Exported by :mod:`aggregates.testing`.

    sc = Scenario(registry)
    sc.given(message("CustomerRegistered", {"name": "Ada", "credit_limit": 100},
                     to=customers, id="c-1"))
    sc.when(message("PlaceOrder", {"customer_id": "c-1", "amount": 30}, to=orders,
                    id="o-1", source=("Checkout", "o-1", 1)))
    assert sc.state(orders, "o-1").status == "approved"
    print(sc.timeline)

Messages go where the dispatcher would send them: an addressed entry (``Emit(..., to=...)``)
to its target aggregate, an event (no ``to=``) to the listeners of :meth:`Scenario.on_event`
(and :attr:`Scenario.events`), an effect entry to the effect function of ``effects=`` or a
fake (:meth:`Scenario.fake_effect`), whose result comes back as the runner's reply; timers
fire when :meth:`Scenario.advance` moves the clock past their due time. The shared parts:
the fold (:class:`~aggregates.testing.AggregateHarness`, or the real :class:`StoreWriter`
with ``with_store=``), :func:`aggregates.wire.outbound.entry_envelope`,
:mod:`aggregates.domain.effect_rules`, :func:`aggregates.domain.effects.reply_message`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from aggregates.domain.aggregate import AggregateType, Registry
from aggregates.domain.effects import Effects
from aggregates.message.envelope import Message
from aggregates.message.outcomes import Outcome
from aggregates.testing._scenario_backends import Backend, MemoryBackend, StoreBackend
from aggregates.testing._scenario_effects import Answer, EffectCallRecord, EffectDesk
from aggregates.testing._scenario_engine import FlowEngine
from aggregates.testing._scenario_faults import Fault, FaultSource, ScriptedFaults
from aggregates.testing._scenario_queue import (
    Delivery,
    FlowDoesNotSettle,
    ScenarioError,
    batch_order,
    check_known,
)
from aggregates.testing._scenario_timeline import Timeline
from aggregates.wire.outbound import entry_envelope

if TYPE_CHECKING:
    from pymongo.database import Database

__all__ = ["FlowDoesNotSettle", "Listener", "Scenario", "ScenarioError"]

S = TypeVar("S")
#: Reacts to an event: the messages it returns are delivered (a process manager), or None.
Listener = Callable[[Message], "Iterable[Message] | None"]

_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def _aware(value: datetime) -> datetime:  # mongomock reads dates naive
    return value if value.tzinfo else value.replace(tzinfo=UTC)


class Scenario(FlowEngine):
    """Aggregates of ``registry`` exchanging messages until nothing is left (see the module
    documentation). Options: ``effects`` — the team's :class:`Effects`; ``with_store`` — a
    pymongo ``Database`` for the real ``StoreWriter`` instead of memory; ``now`` — the clock
    (fixed; :meth:`advance` moves it); ``max_steps`` — the step limit of one call (default:
    1000 plus 20 per message the call delivers); ``faults`` — :class:`Fault` s or a
    :class:`FaultSource`; ``check_determinism`` — in memory, run every handling twice."""

    def __init__(self, registry: Registry, *, effects: Effects | None = None,
                 with_store: Database[Any] | None = None, now: datetime | None = None,
                 max_steps: int | None = None,
                 faults: Sequence[Fault] | FaultSource = (),
                 check_determinism: bool = True) -> None:
        if not isinstance(registry, Registry):
            raise ScenarioError(f"Scenario() needs a Registry of aggregate types, got "
                                f"{type(registry).__name__}: Registry([orders, customers])")
        if max_steps is not None and max_steps < 1:
            raise ScenarioError(f"Scenario(max_steps={max_steps}): use ≥ 1, or leave it out "
                                "(1000 plus 20 per message delivered)")
        start = now or _EPOCH
        backend: Backend = (
            MemoryBackend(registry, now=start, check_determinism=check_determinism)
            if with_store is None else StoreBackend(with_store, registry, now=start))
        super().__init__(registry, backend,
                         EffectDesk(effects if effects is not None else Effects()),
                         ScriptedFaults(faults) if isinstance(faults, Sequence) else faults,
                         max_steps)

    def advance(self, delta: timedelta) -> None:
        """Move the clock (``created_at`` of later entries, the writer's ``now``) and fire
        the timers due by then, earliest first, as the dispatcher would: each is delivered
        (or published) and the flow it starts runs before the next one fires."""
        self._backend.now = self._backend.now + delta
        self._begin(0)
        while (due := self._next_due()) is not None:
            atype, aggregate_id, timer = due
            self._backend.pull_timers(atype, aggregate_id, [str(timer.get("id"))])
            env = entry_envelope(timer, document_id=aggregate_id,
                                 source_type=atype.name).envelope
            msg, note = Message.from_dict(env, max_payload_bytes=0), "timer fired"
            sender = f"{atype.name}/{aggregate_id} ({timer.get('timer')!r})"
            self._more_inputs(1)
            if msg.aggregate_type in self.registry:
                self._queue.append(Delivery(msg, "message", sender, note, timer=True))
            else:
                self._event(msg, sender, note, outside=True)
            self._run()

    def _next_due(self) -> tuple[AggregateType[Any], str, dict[str, Any]] | None:
        found = [(_aware(t["due"]), name, aggregate_id, str(t.get("id")), t)
                 for name, aggregate_id in self._backend.aggregates()
                 for t in self._backend.timers(self.registry.get(name), aggregate_id)
                 if _aware(t["due"]) <= self.now]
        if not found:
            return None
        _due, name, aggregate_id, _id, timer = min(found, key=lambda f: f[:4])
        return self.registry.get(name), aggregate_id, dict(timer)

    def on_event(self, type: str, listener: Listener) -> None:
        """Hand events of message ``type`` — and messages of that type addressed to an
        aggregate type outside the registry (a stand-in for another service) — to
        ``listener``; the messages it returns are delivered like any other."""
        self._listeners.setdefault(type, []).append(listener)

    def fake_effect(self, type: str, *answers: Answer, on_success: str | None = None,
                    on_failure: str | None = None, max_attempts: int | None = None) -> None:
        """Answer calls of the effect ``type`` with ``answers``, one per call (the last
        repeats), instead of calling its function. ``on_success``/``on_failure`` default to
        the registered effect's."""
        self._desk.fake(type, answers, on_success=on_success, on_failure=on_failure,
                        max_attempts=max_attempts)

    def inject(self, *faults: Fault) -> Scenario:
        """Inject these faults at their next matching points (added to ``faults=``)."""
        if not isinstance(self._faults, ScriptedFaults):
            raise ScenarioError("inject() works with scripted faults only; this scenario "
                                "draws its faults from a FaultSource")
        self._faults.add(*faults)
        return self

    # -- input ----------------------------------------------------------------------------
    def given(self, *messages: Message) -> Scenario:
        """Deliver set-up messages and run the flow; each must be applied."""
        start = len(self.timeline)
        self.when(*messages)
        wanted = {m.message_id for m in messages}
        first: dict[str, Outcome] = {}
        for o in self.outcomes:  # the first outcome of each, as outcome() finds it
            if o.message_id in wanted:
                first.setdefault(o.message_id, o)
        for m in messages:
            o = first.get(m.message_id) or self.outcome(m.message_id)
            if o.outcome != "applied":
                raise ScenarioError(
                    f"given(): {m.type} {m.message_id} was {o.outcome} ({o.reason}: "
                    f"{o.detail}); set-up messages must apply — fix the message or use "
                    f"when()\n{self.timeline[start:][-40:]}")
        return self

    def when(self, *messages: Message) -> Timeline:
        """Deliver ``messages`` as one batch and run the flow until nothing is left; returns
        the exchanges this call added. The messages of one aggregate are handled in the
        pipeline's order (:func:`aggregates.fold.ordering.delivery_order`: a source's by
        ``seq``, the rest by time), the others in the order given. Raises
        :class:`FlowDoesNotSettle` after ``max_steps`` steps."""
        start = len(self.timeline)
        for m in messages:
            if not isinstance(m, Message):
                raise ScenarioError(f"when() takes messages (aggregates.testing.message(...)), "
                                    f"got {type(m).__name__}")
        for m in batch_order(messages):
            self._queue.append(Delivery(m, "input", None))
        self._begin(len(messages))
        self._run()
        return self.timeline[start:]

    def redeliver(self, message_id: str) -> Timeline:
        """Deliver again a message delivered earlier (by id: an input's, or an emitted
        entry's), as a broker redelivery would, and run the flow."""
        found = next((d for d in reversed(self._delivered) if d.msg.message_id == message_id),
                     None)
        if found is None:
            raise ScenarioError(f"redeliver({message_id!r}): no such message was delivered; "
                                "see sc.timeline for the ids")
        start = len(self.timeline)
        self._queue.append(replace(found, note="redelivered"))
        self._begin(1)
        self._run()
        return self.timeline[start:]

    def deliver_late(self) -> Timeline:
        """Deliver the copies that ``late`` faults held back — the broker redelivering them
        after the rest of the flow — and run the flow; returns the exchanges it added.
        :func:`check_fault_tolerance` calls it after the flow."""
        start = len(self.timeline)
        late, self._late = self._late, []
        self._queue.extend(late)
        self._begin(len(late))
        self._run()
        return self.timeline[start:]

    # -- what a test asserts on -----------------------------------------------------------
    def state(self, atype: AggregateType[S], aggregate_id: str) -> S:
        """The typed state of one aggregate (the initial state if it received messages but
        applied none); raises :class:`ScenarioError` for one that never received any."""
        check_known(self.registry, [d.msg for d in self._delivered], atype.name, aggregate_id)
        state: S = self._backend.state(atype, aggregate_id)
        return state

    def states(self) -> dict[tuple[str, str], Any]:
        """Every aggregate's state, by ``(type, id)`` (those that applied a message)."""
        return {(t, i): self._backend.state(self.registry.get(t), i)
                for t, i in self._backend.aggregates()}

    def outcome(self, message_id: str) -> Outcome:
        """The first outcome of the message ``message_id``."""
        for o in self.outcomes:
            if o.message_id == message_id:
                return o
        raise ScenarioError(f"no outcome for message {message_id!r}; delivered: "
                            f"{[o.message_id for o in self.outcomes][-10:]}")

    @property
    def effect_calls(self) -> list[EffectCallRecord]:
        """Every call of an effect function or fake (and query), in order."""
        return list(self._desk.calls)

    def pending(self, atype: AggregateType[Any], aggregate_id: str) -> list[dict[str, Any]]:
        """The entries still in an aggregate's outbox (an effect waiting for a retry)."""
        return [dict(e) for e in self._backend.outbox(atype, aggregate_id)]
