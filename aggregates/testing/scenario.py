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

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from aggregates.domain.aggregate import AggregateType, Registry
from aggregates.domain.effect_rules import effect_call
from aggregates.domain.effects import Effect, EffectCall, Effects, reply_message
from aggregates.message.envelope import Message
from aggregates.message.outcomes import Outcome
from aggregates.testing._scenario_backends import Backend, MemoryBackend, StoreBackend
from aggregates.testing._scenario_effects import Answer, EffectCallRecord, EffectDesk
from aggregates.testing._scenario_faults import Fault, FaultSource, ScriptedFaults
from aggregates.testing._scenario_queue import (
    Delivery,
    FlowDoesNotSettle,
    ScenarioError,
    batch_order,
    check_known,
    not_settled,
)
from aggregates.testing._scenario_queue import key as _key
from aggregates.testing._scenario_timeline import Exchange, Timeline
from aggregates.wire.outbound import InvalidEntry, entry_envelope

if TYPE_CHECKING:
    from pymongo.database import Database

__all__ = ["FlowDoesNotSettle", "Listener", "Scenario", "ScenarioError"]

S = TypeVar("S")
#: Reacts to an event: the messages it returns are delivered (a process manager), or None.
Listener = Callable[[Message], "Iterable[Message] | None"]

_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def _aware(value: datetime) -> datetime:  # mongomock reads dates naive
    return value if value.tzinfo else value.replace(tzinfo=UTC)


class Scenario:
    """Aggregates of ``registry`` exchanging messages until nothing is left (see the module
    documentation). Options: ``effects`` — the team's :class:`Effects`; ``with_store`` — a
    pymongo ``Database`` for the real ``StoreWriter`` instead of memory; ``now`` — the clock
    (fixed; :meth:`advance` moves it); ``max_steps`` — the step limit of one :meth:`when`;
    ``faults`` — :class:`Fault` s or a :class:`FaultSource`; ``check_determinism`` — in
    memory, run every handling twice."""

    def __init__(self, registry: Registry, *, effects: Effects | None = None,
                 with_store: Database[Any] | None = None, now: datetime | None = None,
                 max_steps: int = 1000,
                 faults: Sequence[Fault] | FaultSource = (),
                 check_determinism: bool = True) -> None:
        if not isinstance(registry, Registry):
            raise ScenarioError(f"Scenario() needs a Registry of aggregate types, got "
                                f"{type(registry).__name__}: Registry([orders, customers])")
        self.registry = registry
        start = now or _EPOCH
        self._backend: Backend = (
            MemoryBackend(registry, now=start, check_determinism=check_determinism)
            if with_store is None else StoreBackend(with_store, registry, now=start))
        self.max_steps = max_steps
        self._faults: FaultSource = (ScriptedFaults(faults) if isinstance(faults, Sequence)
                                     else faults)
        self._desk = EffectDesk(effects if effects is not None else Effects())
        self._listeners: dict[str, list[Listener]] = {}
        self._queue: deque[Delivery] = deque()
        self._dirty: dict[tuple[str, str], None] = {}
        self._entries: dict[str, tuple[str, str, dict[str, Any]]] = {}
        self._steps = 0
        self._delivered: list[Delivery] = []
        #: Every exchange, in order (``print(sc.timeline)``).
        self.timeline = Timeline()
        #: One outcome per delivery (and per message released from parking), in order.
        self.outcomes: list[Outcome] = []
        #: The events published (entries without ``to=``), in order.
        self.events: list[Message] = []
        #: Messages addressed to aggregate types outside the registry (another service's).
        self.outside: list[Message] = []

    @property
    def now(self) -> datetime:
        return self._backend.now

    def advance(self, delta: timedelta) -> None:
        """Move the clock (``created_at`` of later entries, the writer's ``now``) and fire
        the timers due by then, earliest first, as the dispatcher would: each is delivered
        (or published) and the flow it starts runs before the next one fires."""
        self._backend.now = self._backend.now + delta
        while (due := self._next_due()) is not None:
            atype, aggregate_id, timer = due
            self._backend.pull_timers(atype, aggregate_id, [str(timer.get("id"))])
            env = entry_envelope(timer, document_id=aggregate_id,
                                 source_type=atype.name).envelope
            msg, note = Message.from_dict(env, max_payload_bytes=0), "timer fired"
            sender = f"{atype.name}/{aggregate_id} ({timer.get('timer')!r})"
            if msg.aggregate_type in self.registry:
                self._queue.append(Delivery(msg, "message", sender, note))
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
        for m in messages:
            o = self.outcome(m.message_id)
            if o.outcome != "applied":
                raise ScenarioError(
                    f"given(): {m.type} {m.message_id} was {o.outcome} ({o.reason}: "
                    f"{o.detail}); set-up messages must apply — fix the message or use "
                    f"when()\n{self.timeline[start:]}")
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
        self._steps = 0
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
        self._steps = 0
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

    # -- the loop -------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            for key in list(self._dirty):
                self._dispatch(key)
            if not self._queue:
                if not self._dirty:
                    return
                continue
            self._deliver(self._queue.popleft())

    def _record(self, exchange: Exchange) -> None:
        self.timeline.append(exchange)
        if exchange.kind == "fault":
            return
        self._steps += 1
        if self._steps > self.max_steps:
            raise not_settled(self.timeline, self.max_steps)

    def _deliver(self, d: Delivery) -> None:
        fault = self._faults.pick("deliver", d.msg.type)
        if fault == "reorder":
            if d.reordered or not self._queue or _key(self._queue[0].msg) == _key(d.msg):
                fault = None  # nothing it may overtake: the order per aggregate is kept
            else:
                self._fault(d, "reorder", f"after {self._queue[0].msg.type}")
                self._queue.insert(1, replace(d, reordered=True))
                return
        if fault == "lost_write":
            self._fault(d, "lost_write", "handled, write lost; delivered again")
            self._backend.deliver(d.msg, lose_write=True)
        self._apply(d)
        if fault == "duplicate":
            self._fault(d, "duplicate", "delivered twice")
            self._apply(replace(d, note="duplicate"))
        elif fault == "redeliver":
            self._fault(d, "redeliver", "a copy comes again later")
            self._queue.append(replace(d, note="redelivered"))
        elif fault == "replay":
            key = _key(d.msg)
            if key in self._dirty:
                self._dispatch(key)
            self._fault(d, "replay", "step replayed: delivered and published again")
            self._apply(replace(d, note="replayed"))
            self._republish(d.msg)

    def _fault(self, d: Delivery, kind: str, note: str) -> None:
        self._record(Exchange(len(self.timeline) + 1, "fault", d.msg.type, d.msg.message_id,
                              d.sender, "/".join(_key(d.msg)), kind, note=note))

    def _apply(self, d: Delivery) -> None:
        self._delivered.append(d)
        outcomes, emitted = self._backend.deliver(d.msg, step=len(self.timeline) + 1)
        for e in emitted:
            self._entries[str(e.get("id"))] = (d.msg.aggregate_type, d.msg.aggregate_id,
                                               dict(e))
        types = tuple(str(e.get("type")) for e in emitted)
        receiver = "/".join(_key(d.msg))
        mine = [o for o in outcomes if not o.from_parked and o.message_id == d.msg.message_id]
        for o in outcomes:
            released = o not in mine
            self.outcomes.append(o)
            self._record(Exchange(
                len(self.timeline) + 1, d.kind, d.msg.type if not released else "(parked)",
                o.message_id, d.sender, receiver, o.outcome, o.reason, o.detail,
                types if mine and o is mine[-1] else (),
                "released from parking" if released else d.note))
        if emitted:
            self._dirty[(d.msg.aggregate_type, d.msg.aggregate_id)] = None

    # -- publishing -------------------------------------------------------------------------
    def _dispatch(self, key: tuple[str, str]) -> None:
        """Publish one aggregate's outbox in order, as the dispatcher does; an effect that
        must be retried keeps it (and the later entries) for the next round."""
        self._dirty.pop(key, None)
        atype = self.registry.get(key[0])
        for entry in self._backend.outbox(atype, key[1]):
            if not self._publish(atype, key[1], entry):
                self._dirty[key] = None  # retried next round (no backoff in a scenario)
                return

    def _publish(self, atype: AggregateType[Any], aggregate_id: str,
                 entry: dict[str, Any] | Any, *, again: bool = False) -> bool:
        """One entry: ``False`` if it stays (a retryable effect), else pulled."""
        sender = f"{atype.name}/{aggregate_id}"
        try:
            found = entry_envelope(entry, document_id=aggregate_id, source_type=atype.name)
        except InvalidEntry as exc:
            self._record(Exchange(len(self.timeline) + 1, "message", str(entry.get("type")),
                                  exc.entry_id, sender, None, "dead_lettered",
                                  "invalid_entry", exc.reason))
            self._backend.pull(atype, aggregate_id, [exc.entry_id])
            return True
        env = found.envelope
        effect = self._desk.effect_for(str(env["type"]))
        note = "published again" if again else ""
        if effect is not None:
            if not self._run_effect(effect, atype, aggregate_id, entry, env, note):
                return False
        else:
            msg = Message.from_dict(env, max_payload_bytes=0)
            if found.addressed and msg.aggregate_type in self.registry:
                self._queue.append(Delivery(msg, "message", sender, note))
            else:  # an event, or a message for another service's aggregate type
                self._event(msg, sender, note, outside=found.addressed)
        self._backend.pull(atype, aggregate_id, [found.entry_id])
        return True

    def _event(self, msg: Message, sender: str, note: str, *, outside: bool = False) -> None:
        (self.outside if outside else self.events).append(msg)
        listeners = self._listeners.get(msg.type, [])
        to = (f"{len(listeners)} listener(s)" if listeners
              else "/".join(_key(msg)) if outside else "recorded")
        self._record(Exchange(len(self.timeline) + 1, "message" if outside else "event",
                              msg.type, msg.message_id, sender, to, "published",
                              note=" ".join(filter(None, [note, "outside the registry"
                                                          if outside else ""]))))
        for listener in listeners:
            for m in listener(msg) or ():
                self._queue.append(Delivery(m, "message", f"listener of {msg.type}"))

    def _run_effect(self, effect: Effect, atype: AggregateType[Any], aggregate_id: str,
                    entry: Any, env: dict[str, Any], note: str) -> bool:
        created = entry.get("created_at")
        if isinstance(created, datetime) and created.tzinfo is None:
            created = created.replace(tzinfo=UTC)
        call = effect_call(env, entry, source_type=atype.name, document_id=aggregate_id,
                           created_at=created if isinstance(created, datetime) else None)
        fault = self._faults.pick("effect", effect.type) if self._may_fail(effect, call) else None
        inject = {"effect_fails": "fail", "effect_lost": "lost"}.get(fault or "")
        if inject is not None:
            self._record(Exchange(len(self.timeline) + 1, "fault", effect.type,
                                  call.idempotency_key, call.aggregate_type + "/" +
                                  call.aggregate_id, "effect", fault))
        settled = self._desk.execute(effect, call, fault=inject)
        emitter = f"{call.aggregate_type}/{call.aggregate_id}"
        self._record(Exchange(len(self.timeline) + 1, "effect", effect.type,
                              call.idempotency_key, emitter, "effect", settled.answer,
                              settled.reason, settled.detail,
                              note=" ".join(filter(None, [f"attempt {settled.attempts}",
                                                          note]))))
        if settled.status == "retry":
            return False
        reply = reply_message(effect, entry, aggregate_type=call.aggregate_type,
                              aggregate_id=call.aggregate_id, result=settled.result,
                              failure=settled.failure, attempts=settled.attempts, at=self.now)
        # The runner applies the reply itself (through the writer), before the pull.
        self._apply(Delivery(reply, "reply", "effect", note))
        return True

    def _may_fail(self, effect: Effect, call: EffectCall) -> bool:
        """Whether a fault may hit this call: always when the test names it; when drawn at
        random, only if an attempt is left after it ("fail, then succeed")."""
        if isinstance(self._faults, ScriptedFaults):
            return True
        att = self._desk.attempts.get(call.idempotency_key)
        return att is None or (not att.final and att.attempts + 1 < effect.max_attempts)

    def _republish(self, msg: Message) -> None:
        """Publish again the entries ``msg`` emitted (a crash before their pull)."""
        for o in [o for o in self.outcomes if o.message_id == msg.message_id][:1]:
            for entry_id in o.emitted_ids:
                if entry_id in self._entries:
                    type_name, agg_id, entry = self._entries[entry_id]
                    self._publish(self.registry.get(type_name), agg_id, entry, again=True)

