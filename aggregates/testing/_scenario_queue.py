"""The delivery queue of a :class:`~aggregates.testing.scenario.Scenario` and its errors (pure)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from aggregates.core.errors import AggboxError
from aggregates.domain.aggregate import Registry
from aggregates.fold.ordering import delivery_order
from aggregates.message.envelope import Message
from aggregates.testing._scenario_timeline import Exchange, ExchangeKind, Timeline, find_cycle

__all__ = ["Delivery", "FlowDoesNotSettle", "ScenarioError", "batch_order", "check_known",
           "key", "not_settled"]


class ScenarioError(AggboxError):
    """A scenario was used wrongly, or its set-up (``given``) did not apply."""


class FlowDoesNotSettle(ScenarioError):
    """The flow was still exchanging messages after ``max_steps`` steps. ``cycle``: the
    repeating exchanges (a loop between aggregates), if one was found; ``None`` when the
    flow was still working through its input (the step budget ran out, no loop)."""

    def __init__(self, message: str, *, cycle: list[Exchange] | None) -> None:
        super().__init__(message)
        self.cycle = cycle


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message on its way to an aggregate: how it came (``kind``), from whom. ``copy``: a
    copy a fault made (or the message a fault moved) — not a fault point again; ``depth``:
    how many messages it came after an input (0: the test's own, or a timer firing);
    ``timer``: a timer firing."""

    msg: Message
    kind: ExchangeKind
    sender: str | None
    note: str = ""
    copy: bool = False
    depth: int = 0
    timer: bool = False

    @property
    def origin(self) -> object:
        """Who sent it, as far as order goes: its source (an aggregate's entries keep their
        order) or, without one, its sender (the test's inputs are one ordered stream)."""
        src = self.msg.source
        return (src.type, src.id) if src is not None else self.sender


def key(msg: Message) -> tuple[str, str]:
    return (msg.aggregate_type, msg.aggregate_id)


def batch_order(messages: Sequence[Message]) -> list[Message]:
    """``messages`` with each aggregate's own in the pipeline's handling order
    (:func:`aggregates.fold.ordering.delivery_order`), in the slots they took."""
    groups: dict[tuple[str, str], list[Message]] = {}
    for m in messages:
        groups.setdefault(key(m), []).append(m)
    ordered = {k: deque(delivery_order(g)) for k, g in groups.items()}
    return [ordered[key(m)].popleft() for m in messages]


#: How many messages after an input a message must come, at least, to be called a loop.
LOOP_DEPTH = 20


def not_settled(timeline: Timeline, max_steps: int, *, depth: int, deepest: int,
                queued: int, inputs: int) -> FlowDoesNotSettle:
    """The error of a flow still busy after ``max_steps`` steps: a loop between aggregates
    if the last exchanges repeat *and* the message just handled came as many messages after
    an input (``depth``: each answering the one before; at least three turns of the loop
    and :data:`LOOP_DEPTH`); else the budget ran out while the flow was still working
    through ``inputs`` inputs (``queued`` waiting; ``deepest``: the longest chain seen)."""
    cycle = find_cycle(list(timeline))
    if cycle and depth >= max(3 * len(cycle), LOOP_DEPTH):
        path = " → ".join([cycle[0].sender or "test",
                           *(f"[{e.type}] {e.receiver}" for e in cycle)])
        what = (f"a loop between aggregates: {path} → … repeats (the last message came "
                f"{depth} messages after an input); a handler must stop answering at some "
                "point (check the state before emitting)")
    else:
        cycle = None
        what = (f"no loop — it was still working through its {inputs} input message(s) "
                f"({queued} deliveries still queued; each message so far came at most "
                f"{deepest} after an input); raise it: Scenario(max_steps=...), or deliver the "
                "input in smaller when() calls")
    return FlowDoesNotSettle(f"the flow did not settle within max_steps={max_steps}: {what}"
                             f"\nlast exchanges:\n{timeline[-12:]}", cycle=cycle)


def check_known(registry: Registry, delivered: Sequence[Message], type_name: str,
                aggregate_id: str) -> None:
    """Raise :class:`ScenarioError` unless the aggregate ``type_name``/``aggregate_id`` is
    in ``registry`` and received one of the ``delivered`` messages (a typo in a test's id
    would otherwise read the initial state: ``0 == 100``)."""
    if type_name not in registry:
        raise ScenarioError(f"state(): {type_name} is not in this scenario's registry "
                            f"({', '.join(registry.names)})")
    known = sorted({m.aggregate_id for m in delivered if m.aggregate_type == type_name})
    if aggregate_id not in known:
        shown = ", ".join(repr(i) for i in known[:20]) + (", …" if len(known) > 20 else "")
        raise ScenarioError(f"state(): {type_name} {aggregate_id!r} never received a message "
                            f"in this scenario; check the id — the {type_name} ids it knows "
                            f"({len(known)}): {shown or 'none'}")
