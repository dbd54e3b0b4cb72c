"""The loop of a :class:`~aggregates.testing.scenario.Scenario`: deliveries, faults at their
points, publishing outboxes as the dispatcher does, effects as its runner does, and the step
budget. :class:`FlowEngine` is the scenario's base class; the public methods are the
scenario's (``aggregates/testing/scenario.py``)."""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from aggregates.domain.aggregate import AggregateType, Registry
from aggregates.domain.effect_rules import effect_call
from aggregates.domain.effects import Effect, EffectCall, reply_message
from aggregates.message.envelope import Message
from aggregates.message.outcomes import Outcome
from aggregates.testing._scenario_backends import Backend
from aggregates.testing._scenario_effects import EffectDesk
from aggregates.testing._scenario_faults import (
    FaultKind,
    FaultPoint,
    FaultSource,
    ScriptedFaults,
    kinds_at,
)
from aggregates.testing._scenario_queue import Delivery, not_settled
from aggregates.testing._scenario_queue import key as _key
from aggregates.testing._scenario_timeline import Exchange, Timeline
from aggregates.wire.outbound import InvalidEntry, entry_envelope

__all__ = ["STEPS_BASE", "STEPS_PER_INPUT", "FlowEngine"]

#: The default step budget of one call: this many steps, plus :data:`STEPS_PER_INPUT` per
#: message delivered by the call (an input, a timer fired, a copy delivered late).
STEPS_BASE = 1000
STEPS_PER_INPUT = 20


class FlowEngine:
    """Runs a scenario's flow (see :class:`~aggregates.testing.Scenario`)."""

    def __init__(self, registry: Registry, backend: Backend, desk: EffectDesk,
                 faults: FaultSource, max_steps: int | None) -> None:
        self.registry = registry
        self._backend = backend
        self._desk = desk
        self._faults = faults
        self.max_steps = max_steps
        self._listeners: dict[str, list[Any]] = {}
        self._queue: deque[Delivery] = deque()
        self._late: list[Delivery] = []
        self._dirty: dict[tuple[str, str], None] = {}
        self._entries: dict[str, tuple[str, str, dict[str, Any]]] = {}
        self._depths: dict[str, int] = {}
        self._delivered: list[Delivery] = []
        self._steps = self._inputs = self._deepest = self._depth = 0
        self._limit = STEPS_BASE
        #: The least step budget of a call (check_fault_tolerance raises it for runs under
        #: faults, which take more steps than the undisturbed run).
        self._steps_floor = 0
        #: The most steps one call took.
        self.peak_steps = 0
        #: Every exchange, in order (``print(sc.timeline)``).
        self.timeline = Timeline()
        #: One outcome per delivery (and per message released from parking), in order.
        self.outcomes: list[Outcome] = []
        #: The events published (entries without ``to=``), in order.
        self.events: list[Message] = []
        #: Messages addressed to aggregate types outside the registry (another service's).
        self.outside: list[Message] = []

    # -- the budget -----------------------------------------------------------------------
    def _begin(self, inputs: int) -> None:
        """A new call (``when``, ``advance``, …) delivering ``inputs`` messages."""
        self._steps = self._inputs = self._deepest = 0
        self._limit = self._steps_floor
        self._more_inputs(inputs)

    def _more_inputs(self, n: int) -> None:
        self._inputs += n
        budget = (self.max_steps if self.max_steps is not None
                  else STEPS_BASE + STEPS_PER_INPUT * self._inputs)
        self._limit = max(budget, self._steps_floor)

    def _record(self, exchange: Exchange) -> None:
        self.timeline.append(exchange)
        if exchange.kind == "fault":
            return
        self._steps += 1
        self.peak_steps = max(self.peak_steps, self._steps)
        if self._steps > self._limit:
            raise not_settled(self.timeline, self._limit, depth=self._depth,
                              deepest=self._deepest, queued=len(self._queue),
                              inputs=self._inputs)

    # -- the loop -------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            for k in list(self._dirty):
                self._dispatch(k)
            if not self._queue:
                if not self._dirty:
                    return
                continue
            self._deliver(self._queue.popleft())

    def _pick(self, point: FaultPoint, d: Delivery) -> FaultKind | None:
        if d.copy:
            return None
        fault = self._faults.pick(point, d.msg.type)
        return fault if fault in kinds_at(point) else None  # a source's own may not fit

    def _deliver(self, d: Delivery, *, reply: bool = False) -> None:
        fault = self._pick("reply" if reply else "timer" if d.timer else "deliver", d)
        if fault == "reorder":
            if not self._queue or _key(self._queue[0].msg) == _key(d.msg):
                fault = None  # nothing it may overtake: the order per aggregate is kept
            else:
                self._fault(d, "reorder", f"after {self._queue[0].msg.type}")
                self._queue.insert(1, replace(d, copy=True))
                return
        if fault == "swap":
            partner = self._swap_partner(d)
            if partner is None:
                fault = None  # the next message to this aggregate (if any) keeps its place
            else:
                other = self._queue[partner]
                del self._queue[partner]
                self._fault(d, "swap", f"after {other.msg.type} from {other.sender or 'test'}")
                self._queue.appendleft(replace(d, copy=True))
                self._queue.appendleft(other)
                return
        if fault == "lost_write":
            self._fault(d, "lost_write", "handled, write lost; delivered again")
            self._backend.deliver(d.msg, lose_write=True)
        self._apply(d)
        if fault == "duplicate":
            self._fault(d, "duplicate", "delivered twice")
            self._apply(replace(d, note="duplicate", copy=True))
        elif fault == "redeliver":
            self._fault(d, "redeliver", "a copy comes again later")
            self._queue.append(replace(d, note="redelivered", copy=True))
        elif fault == "late":
            self._fault(d, "late", "a copy comes again after the rest of the flow")
            self._late.append(replace(d, note="redelivered late", copy=True))
        elif fault == "replay":
            k = _key(d.msg)
            if k in self._dirty:
                self._dispatch(k)
            self._fault(d, "replay", "step replayed: delivered and published again")
            self._apply(replace(d, note="replayed", copy=True))
            self._republish(d.msg)

    def _swap_partner(self, d: Delivery) -> int | None:
        """The queue position of the next delivery to ``d``'s aggregate, if it comes from
        another sender (else ``None``: one sender's messages keep their order)."""
        m = d.msg
        for i, other in enumerate(self._queue):
            o = other.msg
            if o.aggregate_id == m.aggregate_id and o.aggregate_type == m.aggregate_type:
                return i if other.origin != d.origin else None
        return None

    def _fault(self, d: Delivery, kind: str, note: str) -> None:
        self._record(Exchange(len(self.timeline) + 1, "fault", d.msg.type, d.msg.message_id,
                              d.sender, "/".join(_key(d.msg)), kind, note=note))

    def _apply(self, d: Delivery) -> None:
        self._delivered.append(d)
        self._depth = d.depth
        self._deepest = max(self._deepest, d.depth)
        outcomes, emitted = self._backend.deliver(d.msg, step=len(self.timeline) + 1)
        for e in emitted:
            entry_id = str(e.get("id"))
            self._entries[entry_id] = (d.msg.aggregate_type, d.msg.aggregate_id, dict(e))
            self._depths[entry_id] = d.depth + 1
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
    def _dispatch(self, k: tuple[str, str]) -> None:
        """Publish one aggregate's outbox in order, as the dispatcher does; an effect that
        must be retried keeps it (and the later entries) for the next round."""
        self._dirty.pop(k, None)
        atype = self.registry.get(k[0])
        for entry in self._backend.outbox(atype, k[1]):
            if not self._publish(atype, k[1], entry):
                self._dirty[k] = None  # retried next round (no backoff in a scenario)
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
        depth = self._depths.get(found.entry_id, 1)
        effect = self._desk.effect_for(str(env["type"]))
        note = "published again" if again else ""
        if effect is not None:
            if not self._run_effect(effect, atype, aggregate_id, entry, env, note, depth):
                return False
        else:
            msg = Message.from_dict(env, max_payload_bytes=0)
            if found.addressed and msg.aggregate_type in self.registry:
                self._queue.append(Delivery(msg, "message", sender, note, depth=depth))
            else:  # an event, or a message for another service's aggregate type
                self._event(msg, sender, note, outside=found.addressed, depth=depth)
        self._backend.pull(atype, aggregate_id, [found.entry_id])
        return True

    def _event(self, msg: Message, sender: str, note: str, *, outside: bool = False,
               depth: int = 0) -> None:
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
                self._queue.append(Delivery(m, "message", f"listener of {msg.type}",
                                            depth=depth + 1))

    def _run_effect(self, effect: Effect, atype: AggregateType[Any], aggregate_id: str,
                    entry: Any, env: dict[str, Any], note: str, depth: int) -> bool:
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
        self._deliver(Delivery(reply, "reply", "effect", note, depth=depth + 1), reply=True)
        return True

    @property
    def now(self) -> datetime:
        return self._backend.now

    def _may_fail(self, effect: Effect, call: EffectCall) -> bool:
        """Whether this execution is a fault point: every one when the test names its
        faults; else an entry's first execution, if an attempt is left after it ("fail,
        then succeed")."""
        if isinstance(self._faults, ScriptedFaults):
            return True
        return call.idempotency_key not in self._desk.attempts and effect.max_attempts > 1

    def _republish(self, msg: Message) -> None:
        """Publish again the entries ``msg`` emitted (a crash before their pull)."""
        for o in [o for o in self.outcomes if o.message_id == msg.message_id][:1]:
            for entry_id in o.emitted_ids:
                if entry_id in self._entries:
                    type_name, agg_id, entry = self._entries[entry_id]
                    self._publish(self.registry.get(type_name), agg_id, entry, again=True)
